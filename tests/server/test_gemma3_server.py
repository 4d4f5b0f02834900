"""`bankml serve` against llama-server b11434 on the real Gemma-3-270M Q4_K_M file.

Both servers as test_oracle_server.py runs them (-np 1 --jinja, one thread each). llama-server
runs its default swa_full=false: a sliding-window cache of GGML_PAD(n_swa + n_ubatch, 256) =
1,024 cells used as a ring (src/llama-kv-cache-iswa.cpp). Every request here keeps the cache
below 1,024 cells, where that ring has not wrapped: its cells hold positions 0..n-1 in order and
n_kv is the base cache's, exactly bankml's full-size sliding-window cache (docs/ARCHITECTURES.md).

The file has no tokenizer.chat_template: both servers render ChatML.
"""
from __future__ import annotations

import pytest
from test_oracle_server import call, chat, cmpl, user

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

NAME = "gemma3-270m-q4_k_m"
N = 64
PROMPTS = [
    "Once upon a time", "The capital of France is", "def fib(n):", "1, 2, 3, 4,", "The quick brown fox",
    "In 1492, Columbus", "Water boils at", "import numpy as np\n", "Dear Sir or Madam,", "The meaning of life is",
    "SELECT * FROM", "Il était une fois", "Photosynthesis is the process", "To be or not to be,",
    "The best way to learn a language", "<html>\n<head>", "Roses are red,", "Die Hauptstadt von Deutschland ist",
    "The first law of thermodynamics", "日本の首都は",
]


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(NAME, "--llama-threads", "1", threads=1) as ours, \
            LlamaServer(models.path(NAME), threads=1) as theirs:
        yield ours, theirs


def compare(ours, theirs, path, body):
    got, want = call(ours.url, path, body), call(theirs.url, path, body)
    assert got == want, f"{path} {body}"
    return got


@pytest.mark.oracle
@pytest.mark.server
def test_gemma3_270m_chat_equals_llama_server(pair, record):
    """A 3-turn greedy conversation and a seeded one through ChatML (the later turns from the
    prompt cache): the same text, tokens, finish reasons, usage and cache counts."""
    ours, theirs = pair
    n = 0
    for kw in ({"temperature": 0}, {"seed": 610, "temperature": 0.8}):
        messages = [user("Hi! What is your name?")]
        for follow in ["Tell me one fact about cats.", "Now one about dogs."]:
            got = compare(ours, theirs, *chat(messages, max_tokens=N, **kw))
            messages += [{"role": "assistant", "content": got["text"]}, user(follow)]
            n += 1
        third = compare(ours, theirs, *chat(messages, max_tokens=N, stream=True, **kw))
        assert third["usage"]["prompt_tokens"] < 1024
        n += 1
    record(kind="server", model=NAME, compared=n, identical=n)


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.slow
def test_gemma3_270m_generations_equal_llama_server(pair, record):
    """20 greedy and 20 seeded 64-token completions (llama-server's default sampler chain at
    temperature 0.8): the same tokens, text, finish reasons, usage and cache counts."""
    ours, theirs = pair
    n = 0
    for i, p in enumerate(PROMPTS):
        compare(ours, theirs, *cmpl(p, max_tokens=N, temperature=0))
        compare(ours, theirs, *cmpl(p, max_tokens=N, seed=1000 + i, temperature=0.8, stream=i % 2 == 1))
        n += 2
    record(kind="server", model=NAME, compared=n, identical=n)
