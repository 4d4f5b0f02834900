"""`bankml serve` against llama-server b11434 on the real Gemma-3-270M Q4_K_M file.

Both servers as test_oracle_server.py runs them (-np 1 --jinja), two threads each (the
machine's two cores; bankml told llama.cpp's thread count, --llama-threads 2). By default
(swa_full=false) llama-server makes context checkpoints for this sliding-window model: it
decodes a prompt in batches that end before user messages and 4 (and 4 + n_ubatch) tokens
before the end, and keeps a later prompt's prefix only through a checkpoint; bankml serve does
the same (server/checkpoints.py). Its sliding-window cache of 1,024 cells is a ring that
bankml does not reproduce, so those requests stay below 1,024 cells; past them both servers
run --swa-full (the full-size cache, no checkpoints). docs/ARCHITECTURES.md, "The SWA cache".

The file has no tokenizer.chat_template: both servers render ChatML.
"""
from __future__ import annotations

import pytest
from test_oracle_server import chat, compare, greedy_and_seeded, three_turn_chats, user

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
    with BankmlServer(NAME, "--llama-threads", "2", threads=2) as ours, \
            LlamaServer(models.path(NAME), threads=2) as theirs:
        yield ours, theirs


@pytest.fixture(scope="module")
def pair_full():
    with BankmlServer(NAME, "--llama-threads", "2", "--swa-full", threads=2) as ours, \
            LlamaServer(models.path(NAME), threads=2, extra=("--swa-full",)) as theirs:
        yield ours, theirs


@pytest.mark.oracle
@pytest.mark.server
def test_gemma3_270m_chat_equals_llama_server(pair, record):
    """A 3-turn greedy conversation and a seeded one through ChatML (the later turns from a
    checkpoint): the same text, tokens, finish reasons, usage and cache counts."""
    ours, theirs = pair
    thirds = three_turn_chats(NAME, ours, theirs, N)
    assert all(third["usage"]["prompt_tokens"] < 1024 for third in thirds)
    record(kind="server", model=NAME, compared=6, identical=6)


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.slow
def test_gemma3_270m_generations_equal_llama_server(pair, record):
    """20 greedy and 20 seeded 64-token completions (llama-server's default sampler chain at
    temperature 0.8): the same tokens, text, finish reasons, usage and cache counts."""
    ours, theirs = pair
    n = greedy_and_seeded(NAME, ours, theirs, PROMPTS, N)
    record(kind="server", model=NAME, compared=n, identical=n)


LONG = " ".join(f"Item {i}: the {w} is {c}." for i, (w, c) in enumerate(
    [(w, c) for w in ("sky", "sea", "grass", "sun", "snow", "rose", "coal", "sand") for c in
     ("blue", "green", "white", "red")]))


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.slow
def test_gemma3_270m_conversation_past_the_window_equals_llama_server_swa_full(pair_full, record):
    """--swa-full on both: a greedy 3-turn conversation of long user messages that passes 1,024
    cells (twice the window, and the default ring's size): later turns from the prompt cache,
    the sliding-window layers masking cells 512 positions back."""
    ours, theirs = pair_full
    messages = [user("Read this list. " + LONG)]
    for follow in ["Repeat the list backwards. " + LONG, "Which items are blue? " + LONG]:
        got = compare(NAME, ours, theirs, *chat(messages, max_tokens=N, temperature=0))
        messages += [{"role": "assistant", "content": got["text"]}, user(follow)]
    third = compare(NAME, ours, theirs, *chat(messages, max_tokens=N, temperature=0))
    assert third["usage"]["prompt_tokens"] > 1024 and third["cache"][0] > 512, third
    record(kind="server", model=NAME, compared=3, identical=3)


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.slow
def test_gemma3_270m_conversation_past_512_below_1024_cells_equals_llama_server(pair, record):
    """The default server past the 512 window but below its 1,024-cell ring: the third turn's
    prefix is past pos_min_thold, so llama-server keeps it without a checkpoint."""
    ours, theirs = pair
    half = LONG[:len(LONG) // 2]
    messages = [user("Read this list. " + LONG)]
    for follow in ["Now this one. " + half, "Which items are blue?"]:
        got = compare(NAME, ours, theirs, *chat(messages, max_tokens=N, temperature=0))
        messages += [{"role": "assistant", "content": got["text"]}, user(follow)]
    third = compare(NAME, ours, theirs, *chat(messages, max_tokens=N, temperature=0))
    assert 512 < third["usage"]["prompt_tokens"] and third["usage"]["total_tokens"] < 1024, third
    assert third["cache"][0] > 512, third
    record(kind="server", model=NAME, compared=3, identical=3)
