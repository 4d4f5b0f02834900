"""n (n_cmpl) completions of one request against llama-server b11434 -np 3: the k-th samples with
seed + k (server_task::add_child), its choice or result carries index k, and each equals what a
lone request with seed + k gives; more than the server's slots is llama-server's 400."""
from __future__ import annotations

import json

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"
N = 16
CHAT = [{"role": "user", "content": "Name three animals."}]


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(MODEL, "--llama-threads", "2", "--parallel", "3", threads=2) as ours, \
            LlamaServer(models.path(MODEL), threads=2, extra=("-np", "3")) as theirs:
        yield ours.url, theirs.url


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=300)


def streamed(url: str, path: str, body: dict) -> dict[int, list[dict]]:
    """The stream's chunks, by choice index (their interleaving is the slots' timing)."""
    out: dict[int, list[dict]] = {}
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                c = json.loads(line[6:])
                for choice in c.get("choices") or [{"index": c.get("index", 0)}]:
                    out.setdefault(choice["index"], []).append(choice)
    return out


@pytest.mark.oracle
@pytest.mark.server
def test_native_completions_equal_llama_servers_and_each_lone_seed(pair):
    ours, theirs = pair
    body = {"prompt": "Once upon a time", "n_predict": N, "seed": 5, "temperature": 0.9, "n": 3,
            "return_tokens": True}
    got, want = post(ours, "/completion", body).json(), post(theirs, "/completion", body).json()
    assert [r["index"] for r in got] == [0, 1, 2]
    key = lambda r: (r["index"], r["tokens"], r["content"], r["generation_settings"]["seed"], r["stop_type"])  # noqa: E731
    assert [key(r) for r in got] == [key(r) for r in sorted(want, key=lambda r: r["index"])]
    for k in range(3):
        lone = post(ours, "/completion", {**body, "n": 1, "seed": 5 + k}).json()
        assert lone["tokens"] == got[k]["tokens"] and lone["index"] == 0
    assert len({tuple(r["tokens"]) for r in got}) > 1, "three seeds, one text: the children did not get seed + k"


@pytest.mark.oracle
@pytest.mark.server
def test_chat_choices_equal_llama_servers(pair):
    ours, theirs = pair
    body = {"messages": CHAT, "max_tokens": N, "seed": 3, "n": 2, "logprobs": True, "top_logprobs": 2}
    got, want = post(ours, "/v1/chat/completions", body).json(), post(theirs, "/v1/chat/completions", body).json()
    assert [(c["index"], c["message"], c["finish_reason"], c["logprobs"]) for c in got["choices"]] == \
        [(c["index"], c["message"], c["finish_reason"], c["logprobs"]) for c in want["choices"]]
    assert got["usage"] == want["usage"]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": N, "seed": 9, "n": 3, "logprobs": 2}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": N, "seed": 11, "n": 2})], ids=["completions", "chat"])
def test_streamed_choices_equal_llama_servers(pair, path, body):
    ours, theirs = pair
    got, want = streamed(ours, path, body), streamed(theirs, path, body)
    assert sorted(got) == sorted(want) == list(range(body["n"]))

    def text(choices):
        return "".join((c.get("text") or (c.get("delta") or {}).get("content") or "") for c in choices)
    for k in got:
        assert text(got[k]) == text(want[k]) and got[k][-1]["finish_reason"] == want[k][-1]["finish_reason"]
        assert [c.get("logprobs") for c in got[k] if c.get("logprobs")] == \
            [c.get("logprobs") for c in want[k] if c.get("logprobs")]


@pytest.mark.oracle
@pytest.mark.server
def test_more_completions_than_slots_is_llama_servers_400(pair):
    ours, theirs = pair
    for body in ({"prompt": "Hi", "n": 4, "max_tokens": 2}, {"prompt": "Hi", "n_cmpl": 0, "max_tokens": 2}):
        got, want = post(ours, "/v1/completions", body), post(theirs, "/v1/completions", body)
        assert (got.status_code, got.json()) == (want.status_code, want.json()) and got.status_code == 400
