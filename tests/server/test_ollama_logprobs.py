"""Ollama's logprobs and top_logprobs: what Ollama (llm/llama_server.go, server/logprob.go) makes of
llama-server's token probabilities (n_probs, or a chat's logprobs, max(top_logprobs, 1)): each
streamed chunk's token with its logprob and bytes, its top_logprobs when top_logprobs > 0 was
asked, and a whole answer gathering every chunk's; against llama-server b11434's own numbers."""
from __future__ import annotations

import json

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.server.api.ollama import DEFAULTS
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"
SAMPLING = {"temperature": 0.8, "seed": 3}


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(MODEL, threads=1) as ours, LlamaServer(models.path(MODEL), threads=1) as theirs:
        yield ours.url, theirs.url


def ollama_view(entries: list[dict], with_top: bool) -> list[dict]:
    """convertLogprobs, then toAPILogprobs, of llama-server's entries."""
    def entry(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, **({"bytes": list(token.encode())} if token else {})}
    out = []
    for e in entries:
        d = entry(e["token"], e["logprob"])
        if with_top and e["top_logprobs"]:
            d["top_logprobs"] = [entry(t["token"], t["logprob"]) for t in e["top_logprobs"]]
        out.append(d)
    return out


def sse(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


def ndjson(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("top", [0, 3])
def test_generate_logprobs_are_llama_servers_as_ollama_gives_them(pair, top):
    ours, theirs = pair
    prompt = "Once upon a time, in a small village,"
    chunks = [c for c in sse(theirs, "/completion", {"prompt": prompt, "n_predict": 12, **DEFAULTS, **SAMPLING,
                                                     "n_probs": max(top, 1)}) if c["content"] and not c["stop"]]
    want = [ollama_view(c["completion_probabilities"], top > 0) for c in chunks]
    body = {"model": "m", "prompt": prompt, "raw": True, "logprobs": True, "top_logprobs": top,
            "options": {**SAMPLING, "num_predict": 12}}
    got = [c["logprobs"] for c in ndjson(ours, "/api/generate", body) if not c["done"]]
    assert got == want and all(len(w) == 1 for w in want)
    whole = httpx.post(ours + "/api/generate", json={**body, "stream": False}, timeout=300).json()
    assert whole["logprobs"] == [e for w in want for e in w]


@pytest.mark.oracle
@pytest.mark.server
def test_chat_logprobs_are_llama_servers_as_ollama_gives_them(pair):
    ours, theirs = pair
    messages = [{"role": "user", "content": "Name three colours."}]
    chunks = sse(theirs, "/v1/chat/completions", {"messages": messages, "max_tokens": 10, **DEFAULTS, **SAMPLING,
                                                  "logprobs": True, "top_logprobs": 2})
    want = [e for c in chunks for ch in c["choices"] if ch.get("logprobs")
            for e in ollama_view(ch["logprobs"]["content"], True)]
    body = {"model": "m", "messages": messages, "stream": False, "logprobs": True, "top_logprobs": 2,
            "options": {**SAMPLING, "num_predict": 10}}
    got = httpx.post(ours + "/api/chat", json=body, timeout=300).json()
    assert got["logprobs"] == want and len(want) == 10


@pytest.mark.server
@pytest.mark.parametrize("top", [-1, 21])
def test_top_logprobs_out_of_ollamas_range_is_its_400(pair, top):
    r = httpx.post(pair[0] + "/api/generate", json={"model": "m", "prompt": "x", "logprobs": True, "top_logprobs": top},
                   timeout=60)
    assert r.status_code == 400 and r.json() == {"error": "top_logprobs must be between 0 and 20"}
