"""The request fuzzer's short pass (bankml/testing/fuzz.py; the full run's figures are in
docs/SERVER.md): hostile bodies over every route and field from several clients at once, and
cut, abandoned and slow connections. Every answer is a right one or a documented error, no
traceback reaches the log, the server serves after, and its memory stays within a bound."""
from __future__ import annotations

import pytest

from bankml.testing import fuzz


@pytest.mark.server
def test_hostile_requests():
    out = fuzz.fuzz_server(2500, clients=6, seed=20261203)
    rep = out.report
    assert rep.problems == [], "\n".join(map(str, rep.problems[:10]))
    assert rep.statuses[200] > 500 and rep.statuses[400] > 1000 and sum(rep.conns.values()) > 50, rep.line()
    assert out.healthy
    assert "Traceback" not in out.log and "Exception in ASGI application" not in out.log
    assert out.rss1_mib - out.rss0_mib < fuzz.CACHE_MIB + 128, out.lines()
