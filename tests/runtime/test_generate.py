"""Generation with greedy and the default sampler chain, token for token llama-server's.

The issue's target on the (default) llvm backend: 20 prompts x 64 greedy tokens on SmolLM2 Q4_1
and F16 and the small Qwen3 Q1_0, and 20 (prompt, seed) pairs at temperature 0.8.
BANKML_GENERATE_QUICK=1 runs a few of each.
"""
from __future__ import annotations

import os

import pytest

import bankml
from bankml.runtime.generate import StopScan, generate
from bankml.runtime.sampler import GREEDY, SamplerParams
from bankml.testing import models

QUICK = os.environ.get("BANKML_GENERATE_QUICK") == "1"
N_TOKENS = 16 if QUICK else 64
N_GREEDY = 2 if QUICK else 20
N_SEEDED = 5 if QUICK else 20
MODEL = "smollm2-q4_1"
GREEDY_MODELS = ["smollm2-q4_1", "smollm2-f16", "qwen3-small-q1_0"]

PROMPTS = [
    "Once upon a time", "The capital of France is", "def fib(n):", "1, 2, 3, 4,", "Water boils at",
    "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n", "The best way to learn is",
    "import numpy as np\n", "In 1969,", "My favourite food", "Dear Sir,", "The sky is", "Q: What is 7*8?\nA:",
    "Roses are red,", "Hello", "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n", "To be or not",
    "The mitochondria", "Paris, London,", "A haiku about rain:",
]
SEEDS = [1, 42, 7, 1234, 99999, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 2024, 4294967294]


_models: dict = {}


def load(name: str) -> bankml.Model:
    if name not in _models:
        _models[name] = bankml.load(models.path(name), threads=2)
    return _models[name]


@pytest.fixture(scope="module")
def model():
    return load(MODEL)


@pytest.mark.oracle
@pytest.mark.parametrize("i", range(N_GREEDY))
@pytest.mark.parametrize("name", GREEDY_MODELS)
def test_greedy_tokens_equal_llama_server(record, servers, name, i):
    m = load(name)
    ids = m.tokenize(PROMPTS[i])
    want = servers(name).completion(ids, N_TOKENS, temperature=0.0, seed=0)
    got = list(generate(m, ids, N_TOKENS, GREEDY, seed=0))
    record_tokens(record, got, want, model=name, backend=m.backend, prompt=i, tokens=len(ids), temp=0.0, seed=0)
    assert got == want


@pytest.mark.oracle
@pytest.mark.parametrize("i", range(N_SEEDED))
def test_default_chain_tokens_equal_llama_server(record, servers, model, i):
    ids = model.tokenize(PROMPTS[-1 - i])
    want = servers(MODEL).completion(ids, N_TOKENS, temperature=0.8, seed=SEEDS[i])
    got = list(generate(model, ids, N_TOKENS, SamplerParams(temp=0.8), seed=SEEDS[i]))
    record_tokens(record, got, want, model=MODEL, backend=model.backend, prompt=len(PROMPTS) - 1 - i,
                  tokens=len(ids), temp=0.8, seed=SEEDS[i])
    assert got == want


def record_tokens(record, got: list[int], want: list[int], **what) -> None:
    """One generation compared with llama-server's: tokens compared, identical before the first difference."""
    from bankml.runtime.chat import common_prefix
    record(kind="generate", compared=max(len(got), len(want)), identical=common_prefix(got, want), **what)


def test_stops_at_stop_string(model):
    """Without stops greedy runs on past the first comma; with stop "," it ends on the token that makes it."""
    ids = model.tokenize("1, 2, 3, 4,")
    free = list(generate(model, ids, 8, GREEDY))
    text = model_text(model, free)
    assert "," in text and text[text.index(",") + 1:].strip()
    out = list(generate(model, ids, 8, GREEDY, stop=[","]))
    assert out == free[:len(out)] and len(out) < len(free)
    assert "," in model_text(model, out) and "," not in model_text(model, out[:-1])


def model_text(model, ids):
    from bankml.tokenizer import tokenizer_for
    return tokenizer_for(model).decode(ids)


def _stops_whole(pieces: list[bytes], stop: list[str]) -> list[bool]:
    """The check generate() made before StopScan: every token, all the text decoded again."""
    return [any(s in b"".join(pieces[:i + 1]).decode("utf-8", "ignore") for s in stop) for i in range(len(pieces))]


def _stops_scanned(pieces: list[bytes], stop: list[str]) -> list[bool]:
    scan = StopScan(stop)
    out, done = [], False
    for p in pieces:
        done = done or scan.push(p)         # generate() stops at the first True
        out.append(done)
    return out


@pytest.mark.parametrize("pieces, stop, first", [
    ([b"Hel", b"lo wor", b"ld", b"!"], ["o w"], 1),                     # within one piece
    ([b"Hel", b"lo wor", b"ld", b"!"], ["world"], 2),                   # across two pieces
    ([b"a", b"b", b"c", b"d"], ["abcd"], 3),                            # across four
    ([b"ab\xc3", b"\xa9", b"!"], ["\xe9!"], 2),                         # an e-acute split across tokens
    ([b"x\xf0\x9f", b"\x98", b"\x80y"], ["x\U0001f600y"], 2),           # a four-byte emoji in three
    ([b"\xf0\x9f", b"A", b"B"], ["AB"], 2),                             # an unfinished sequence dropped
    ([b"q", b"\x80", b"r"], ["qr"], 2),                                  # a stray continuation byte ignored
    ([b"no", b" stop", b" here"], ["xyz", "stop!"], None),
    ([b"a", b"b"], [""], 0),                                            # "" is in every text
])
def test_stop_scan_stops_where_the_whole_text_does(pieces, stop, first):
    want = _stops_whole(pieces, stop)
    assert _stops_scanned(pieces, stop) == [i >= first if first is not None else False for i in range(len(pieces))]
    assert _stops_scanned(pieces, stop) == [any(want[:i + 1]) for i in range(len(want))]


def test_stop_scan_equals_whole_text_on_random_pieces():
    """Random token pieces cut anywhere, through multi-byte characters and invalid bytes, and stop
    strings taken from the text itself: the first stop is where the whole-text check finds it."""
    import random
    rng = random.Random(25)
    alphabet = ["a", "b", " ", ",", "\n", "\xe9", "\u20ac", "\u4e2d", "\U0001f600"]
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))).encode()
        if rng.random() < 0.3:                                          # a stray or truncated byte
            k = rng.randrange(len(text) + 1)
            text = text[:k] + rng.choice([b"\x80", b"\xc3", b"\xf0\x9f", b"\xff"]) + text[k:]
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        decoded = text.decode("utf-8", "ignore")
        i = rng.randrange(len(decoded) + 1)
        stop = [decoded[i:i + rng.randint(1, 5)] or "zz", "\u20ac\u20ac,"]
        want = _stops_whole(pieces, stop)
        assert _stops_scanned(pieces, stop) == [any(want[:k + 1]) for k in range(len(want))], (pieces, stop)
