"""`bankml serve` against llama-server b11434 on a Qwen3.5 model (qwen35-small-q4_k_m).

Both servers as test_oracle_server.py runs them (-np 1 --jinja), two threads each. The model's
memory is hybrid (recurrent states beside the attention layer's cells), which cannot drop the
end of a sequence: llama-server makes context checkpoints of the states (server/checkpoints.py)
before a batch that starts the last user message and 4 (and 4 + n_ubatch) tokens before a
prompt's end, and a later prompt keeps its prefix through the newest checkpoint at or before
it, or all the held tokens when it extends them. bankml serve does the same, bit for bit.
"""
from __future__ import annotations

import pytest
from test_gemma3_server import PROMPTS
from test_oracle_server import cmpl, compare, greedy_and_seeded, three_turn_chats

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

NAME = "qwen35-small-q4_k_m"
N = 48


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(NAME, "--llama-threads", "2", threads=2) as ours, \
            LlamaServer(models.path(NAME), threads=2) as theirs:
        yield ours, theirs


@pytest.mark.oracle
@pytest.mark.server
def test_qwen35_chat_equals_llama_server(pair, record):
    """Three-turn greedy and seeded conversations (the later turns through a checkpoint of the
    states), a prompt that extends every held token (a completion continued), and one loaded
    back from the prompt cache with its states: the same text, tokens, finish reasons, usage
    and cache counts."""
    ours, theirs = pair
    three_turn_chats(NAME, ours, theirs, N)
    text = "Once upon a time"
    text += compare(NAME, ours, theirs, *cmpl(text, max_tokens=8, temperature=0))["text"]
    text += compare(NAME, ours, theirs, *cmpl(text, max_tokens=8, temperature=0))["text"]
    # another prompt sends the slot's state to the prompt cache; continuing the first text loads it
    # back, its states with it, and keeps every held token
    compare(NAME, ours, theirs, *cmpl("The capital of France is", max_tokens=8, temperature=0))
    compare(NAME, ours, theirs, *cmpl(text, max_tokens=8, seed=5, temperature=0.8))
    record(kind="server", model=NAME, compared=11, identical=11)


@pytest.mark.oracle
@pytest.mark.server
def test_qwen35_generations_equal_llama_server(pair, record):
    """20 greedy and 20 seeded completions (llama-server's default sampler chain at temperature
    0.8): the same tokens, text, finish reasons, usage and cache counts."""
    ours, theirs = pair
    n = greedy_and_seeded(NAME, ours, theirs, PROMPTS, N)
    record(kind="server", model=NAME, compared=n, identical=n)
