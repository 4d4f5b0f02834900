"""llama-server's own request fields, against llama-server b11434: response_fields (the kept paths
of /completion's answer), t_max_predict_ms (stop at a newline once generating took longer), id_slot
(the slot that runs it) and timings_per_token (timings on every streamed token)."""
from __future__ import annotations

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(MODEL, threads=1) as ours, LlamaServer(models.path(MODEL), threads=1) as theirs:
        yield ours.url, theirs.url


def both(pair, body: dict) -> list[dict]:
    out = []
    for url in pair:
        r = httpx.post(url + "/completion", json=body, timeout=120)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


@pytest.mark.oracle
@pytest.mark.server
def test_response_fields_keep_the_paths_asked(pair):
    body = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0,
            "response_fields": ["content", "generation_settings/n_predict", "tokens_predicted", "stop_type", "nope/x"]}
    got, want = both(pair, body)
    assert got == want and set(got) == {"content", "generation_settings/n_predict", "tokens_predicted", "stop_type"}


@pytest.mark.oracle
@pytest.mark.server
def test_t_max_predict_ms_stops_at_the_first_newline_past_the_limit(pair):
    body = {"prompt": "Count with me:\n1\n2\n3\n4\n", "n_predict": 40, "temperature": 0, "t_max_predict_ms": 1}
    (got, want), (free, _) = both(pair, body), both(pair, {**body, "t_max_predict_ms": -1})
    key = lambda r: (r["content"], r["tokens_predicted"], r["stop_type"])       # noqa: E731
    assert key(got) == key(want) and got["stop_type"] == "limit" and got["content"].endswith("\n")
    assert got["tokens_predicted"] < free["tokens_predicted"] and free["content"].startswith(got["content"])


@pytest.mark.oracle
@pytest.mark.server
def test_id_slot_runs_the_request_on_that_slot():
    """id_slot (taken modulo the slots) picks the slot, whose id the answer and /slots show, the
    other slot's cells untouched; as llama-server -np 2."""
    with BankmlServer(MODEL, "--parallel", "2", threads=1) as ours, \
            LlamaServer(models.path(MODEL), threads=1, extra=("-np", "2", "-c", "8192")) as theirs:
        pair = (ours.url, theirs.url)
        for body in ({"prompt": "Once upon a time", "n_predict": 4, "temperature": 0, "id_slot": 1},
                     {"prompt": "Once upon a time", "n_predict": 4, "temperature": 0, "id_slot": 2},
                     {"prompt": "The cat sat", "n_predict": 3, "temperature": 0, "id_slot": 3, "stream": False}):
            got, want = both(pair, body)
            key = lambda r: (r["id_slot"], r["content"], r["tokens_evaluated"], r["timings"]["cache_n"])  # noqa: E731
            assert key(got) == key(want), body
        held = [[s.get("n_prompt_tokens") for s in httpx.get(url + "/slots").json()] for url in pair]
        assert held[0] == held[1]


def _streamed(url: str, path: str, body: dict) -> list[dict]:
    import json
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": "Once upon a time", "n_predict": 5, "temperature": 0}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0})])
def test_timings_per_token_on_every_streamed_token(pair, path, body):
    """The same chunks carry timings as llama-server's, with its keys and its counts (prompt_n,
    cache_n, the tokens so far); the milliseconds are each server's own."""
    def counts(url):
        chunks = _streamed(url, path, {**body, "timings_per_token": True, "cache_prompt": False})
        return [(sorted(c["timings"]), c["timings"]["prompt_n"], c["timings"]["cache_n"], c["timings"]["predicted_n"])
                if "timings" in c else None for c in chunks]
    got, want = (counts(url) for url in pair)
    assert got == want and sum(t is not None for t in got) >= 5
