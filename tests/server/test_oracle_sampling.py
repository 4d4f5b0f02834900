"""`bankml serve` against llama-server b11434 for each sampler setting under its llama-server name:
20 seeded /v1/completions requests per setting (8 tokens from short prompts) give the same
tokens; n_probs / logprobs give the same probabilities, as llama-server prints them (the JSON
numbers parsed, compared exactly), before and after the sampling chain, streamed and not.

One server of each, started once for the module.
"""
from __future__ import annotations

import json

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"
N = 8
SEEDS = range(20)
PROMPTS = ["Once upon a time", "The cat sat on the mat. The cat sat on the", "1, 2, 3, 4,", "def fib(n):"]

SETTINGS = [
    pytest.param({}, id="defaults"),
    pytest.param({"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}, id="temp1.5-whole-vocab"),
    pytest.param({"typical_p": 0.7}, id="typical_p"),
    pytest.param({"top_n_sigma": 1.0, "top_k": 0}, id="top_n_sigma"),
    pytest.param({"xtc_probability": 0.5, "xtc_threshold": 0.05}, id="xtc"),
    pytest.param({"dynatemp_range": 0.5, "dynatemp_exponent": 1.5}, id="dynatemp"),
    pytest.param({"min_keep": 5, "top_p": 0.2, "min_p": 0.3}, id="min_keep"),
    pytest.param({"repeat_penalty": 1.5, "repeat_last_n": 16}, id="repeat_penalty"),
    pytest.param({"frequency_penalty": 0.8, "presence_penalty": 0.6}, id="freq_presence"),
    pytest.param({"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_penalty_last_n": 32}, id="dry"),
    pytest.param({"mirostat": 1, "mirostat_tau": 3.0}, id="mirostat1"),
    pytest.param({"mirostat": 2, "mirostat_eta": 0.2}, id="mirostat2"),
    pytest.param({"logit_bias": [[" the", -3], ["cat", False]]}, id="logit_bias"),
    pytest.param({"ignore_eos": True, "temperature": 0}, id="ignore_eos"),
    pytest.param({"samplers": ["min_p", "temperature", "top_k"]}, id="samplers"),
]


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(MODEL, "--llama-threads", "2", threads=2) as ours, \
            LlamaServer(models.path(MODEL), threads=2) as theirs:
        yield ours, theirs


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(url: str, path: str, body: dict) -> list[dict]:
    out = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def tokens(url: str, body: dict) -> list[int]:
    d = post(url, "/v1/completions", {**body, "verbose": True, "return_tokens": True})
    return d["__verbose"]["tokens"]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("setting", SETTINGS)
def test_seeded_tokens_equal_llama_server(pair, setting, record):
    ours, theirs = pair
    for seed in SEEDS:
        body = {"prompt": PROMPTS[seed % len(PROMPTS)], "max_tokens": N, "seed": seed, **setting}
        assert tokens(ours.url, body) == tokens(theirs.url, body), body
    record(kind="server-sampling", model=MODEL, compared=len(SEEDS), identical=len(SEEDS))


def logprobs_of(d: dict):
    return [c.get("logprobs") for c in d["choices"]]


PROBS = [
    pytest.param({"logprobs": 5}, id="pre-sampling"),
    pytest.param({"n_probs": 4, "post_sampling_probs": True}, id="post-sampling"),
    pytest.param({"logprobs": 3, "temperature": 0}, id="greedy"),
    pytest.param({"n_probs": 6, "post_sampling_probs": True, "top_k": 3}, id="post-sampling-top_k"),
    pytest.param({"n_probs": 3, "post_sampling_probs": True, "temperature": 0}, id="post-sampling-greedy"),
    pytest.param({"logprobs": 4, "typical_p": 0.8, "post_sampling_probs": True}, id="post-sampling-typical"),
]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("setting", PROBS)
def test_completion_logprobs_equal_llama_server(pair, setting):
    ours, theirs = pair
    for seed in range(3):
        body = {"prompt": PROMPTS[seed], "max_tokens": N, "seed": seed, **setting}
        got, want = post(ours.url, "/v1/completions", body), post(theirs.url, "/v1/completions", body)
        assert logprobs_of(got) == logprobs_of(want), body
        assert got["choices"][0]["logprobs"] is not None
        got, want = streamed(ours.url, "/v1/completions", body), streamed(theirs.url, "/v1/completions", body)
        assert [logprobs_of(c) for c in got] == [logprobs_of(c) for c in want], body


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_logprobs_equal_llama_server(pair, stream):
    ours, theirs = pair
    body = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": N, "seed": 11,
            "logprobs": True, "top_logprobs": 3}
    if stream:
        got, want = streamed(ours.url, "/v1/chat/completions", body), streamed(theirs.url, "/v1/chat/completions", body)
        assert [logprobs_of(c) for c in got] == [logprobs_of(c) for c in want]
    else:
        got = post(ours.url, "/v1/chat/completions", body)
        want = post(theirs.url, "/v1/chat/completions", body)
        assert logprobs_of(got) == logprobs_of(want) and got["choices"][0]["logprobs"]["content"]


@pytest.mark.oracle
@pytest.mark.server
def test_refusals_equal_llama_server(pair):
    ours, theirs = pair
    bad = [{"repeat_last_n": -1}, {"min_keep": -2}, {"dry_sequence_breakers": []}, {"dry_sequence_breakers": "x"},
           {"temperature": "x"}, {"samplers": ["top_k", 1]}, {"dry_allowed_length": -1}, {"adaptive_decay": 1},
           {"repeat_penalty": 0}, {"repeat_penalty": -1.5}, {"n_predict": -2}, {"ignore_eos": 1}]
    for body in bad:
        body = {"prompt": "Hi", "max_tokens": 1, **body}
        got = httpx.post(ours.url + "/v1/completions", json=body, timeout=60)
        want = httpx.post(theirs.url + "/v1/completions", json=body, timeout=60)
        assert (got.status_code, got.json()["error"]["message"]) == \
            (want.status_code, want.json()["error"]["message"]), body
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "top_logprobs": 2}
    got = httpx.post(ours.url + "/v1/chat/completions", json=body, timeout=60)
    want = httpx.post(theirs.url + "/v1/chat/completions", json=body, timeout=60)
    assert (got.status_code, got.json()["error"]["message"]) == (want.status_code, want.json()["error"]["message"])


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("setting", [{"n_probs": 3}, {"n_probs": 2, "post_sampling_probs": True}],
                         ids=["pre-sampling", "post-sampling"])
def test_completion_probabilities_equal_llama_server(pair, setting):
    """llama-server's own /completion: content, tokens and completion_probabilities, whole and streamed."""
    ours, theirs = pair
    body = {"prompt": PROMPTS[1], "n_predict": N, "seed": 5, "return_tokens": True, **setting}
    got, want = post(ours.url, "/completion", body), post(theirs.url, "/completion", body)
    keys = ("content", "tokens", "completion_probabilities", "stop_type", "tokens_predicted")
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
    got, want = streamed(ours.url, "/completion", body), streamed(theirs.url, "/completion", body)
    part = ("content", "tokens", "completion_probabilities")
    assert [{k: c.get(k) for k in part} for c in got] == [{k: c.get(k) for k in part} for c in want]


OLLAMA = [
    pytest.param({}, id="ollama-defaults"),
    pytest.param({"typical_p": 0.6, "top_k": 0, "temperature": 1.2}, id="typical"),
    pytest.param({"repeat_penalty": 1.3, "repeat_last_n": -1, "presence_penalty": 0.4}, id="penalties"),
    pytest.param({"mirostat": 2, "mirostat_tau": 4.0}, id="mirostat"),
]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("options", OLLAMA)
def test_ollama_options_equal_llama_server_with_ollamas_defaults(pair, options):
    """/api/generate (raw) with Ollama's options gives the text llama-server gives for the same
    fields under its names, Ollama's defaults spelled out; repeat_last_n -1 is the context."""
    from bankml.server.api import ollama
    ours, theirs = pair
    for seed in range(5):
        opts = {"seed": seed, "num_predict": N, **options}
        fields = {**ollama.DEFAULTS, "seed": seed, "max_tokens": N}
        for k, v in options.items():
            fields[ollama.OPTIONS[k][0]] = 4096 if k == "repeat_last_n" and v == -1 else v
        prompt = PROMPTS[seed % len(PROMPTS)]
        got = post(ours.url, "/api/generate", {"prompt": prompt, "raw": True, "stream": False, "options": opts})
        want = post(theirs.url, "/v1/completions", {"prompt": prompt, **fields})
        assert got["response"] == want["choices"][0]["text"], opts
