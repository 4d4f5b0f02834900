"""GET /metrics (--metrics) against llama-server b11434 --metrics: after the same requests, the same
metric names and types, and the same counts (prompt tokens computed and cached, generated tokens,
llama_decode calls, the longest sequence, slots); seconds and rates are this machine's own."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"
COUNTS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:tokens_predicted_total",
          "llamacpp:n_decode_total", "llamacpp:requests_processing", "llamacpp:requests_deferred",
          "llamacpp:n_busy_slots_per_decode", "llamacpp:spec_decode_num_drafts_total")
REQUESTS = [("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0}),
            ("/v1/completions", {"prompt": "Once upon a time there", "max_tokens": 5, "temperature": 0}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 7,
                                      "seed": 3}),
            ("/completion", {"prompt": "1, 2, 3,", "n_predict": 1})]


def scrape(url: str) -> dict[str, tuple[str, float]]:
    """Each sample's name -> (its TYPE line's type, value), from the text as written."""
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.text
    types, out = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            name, value = line.split(" ")
            out[name] = (types.get(name) or types.get(name.removesuffix("_total")), float(value))
    assert list(text_string_to_metric_families(r.text))         # a Prometheus parser reads it
    return out


@pytest.mark.oracle
@pytest.mark.server
def test_metrics_count_what_llama_server_counts():
    with BankmlServer(MODEL, "--metrics", threads=1) as ours, \
            LlamaServer(models.path(MODEL), threads=1, extra=("--metrics",)) as theirs:
        for path, body in REQUESTS:
            for srv in (ours, theirs):
                assert httpx.post(srv.url + path, json=body, timeout=60).status_code == 200
        a, b = scrape(ours.url), scrape(theirs.url)
    assert set(a) == set(b)
    types = lambda d: {k: v[0] for k, v in d.items() if k != "llamacpp:n_tokens_max"}    # noqa: E731
    assert types(a) == types(b)        # n_tokens_max: a gauge here (a maximum), a counter there
    for name in COUNTS:
        assert a[name][1] == b[name][1], (name, a[name], b[name])
    assert a["llamacpp:n_tokens_max"][1] == b["llamacpp:n_tokens_max"][1]
    assert a["llamacpp:prompt_tokens_cached_total"][1] > 0 and a["llamacpp:tokens_predicted_seconds_total"][1] > 0


@pytest.mark.server
def test_metrics_need_the_flag(bankml_server_factory):
    srv = bankml_server_factory("qwen3-small-q1_0", "--ctx", "512", "--threads", "1")
    r = httpx.get(srv.url + "/metrics")
    assert r.status_code == 501 and "--metrics" in r.json()["error"]["message"]
