"""Every logits row identical to llama.cpp's (sha256 of f32 bytes), on both backends.

The llvm backend runs the whole matrix of the compiler-core issue (every model and weight type,
prompts of 1, 7, 63, 64, 65 and 600 tokens, all rows and the last row only, then greedy decodes
to 1,100 cells with llama_threads 2 and 3) and with 1, 2 and 3 of its own threads. The numpy
reference backend, the readable spec, is slow (~1 token/s on SmolLM2): it runs the same checks
on a smaller sample.
"""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml import oracle
from bankml.testing import models

pytestmark = pytest.mark.oracle

MODELS = ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0",
          "qwen3-small-f16", "qwen3-small-q1_0", "qwen3-small-q2_0",
          "qwen3-small-untied-f16", "qwen3-small-untied-q1_0", "qwen3-small-untied-q2_0", "llama-gqa-f16"]
LENGTHS = [1, 7, 63, 64, 65, 600]
REFERENCE_LENGTHS = {"all": [1, 7, 63, 64, 65], "last": [1, 7, 63, 64, 65]}
REFERENCE_SMOLLM2_LENGTHS = {"all": [7], "last": [7]}    # 135M params in numpy: the llvm run covers the rest


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def assert_rows_identical(record, ours: np.ndarray, ref: np.ndarray, **what) -> None:
    """Compare row by row (sha256 of the f32 bytes), record the comparison, then assert."""
    bad = list(range(len(ref)))
    if ours.shape == ref.shape:
        bad = [i for i, (a, b) in enumerate(zip(oracle.sha256_rows(ours), oracle.sha256_rows(ref))) if a != b]
    record(compared=len(ref), identical=len(ref) - len(bad), **what)
    assert ours.shape == ref.shape
    assert not bad, f"{len(bad)}/{len(ref)} rows differ, first {bad[:5]}"


def prefill_case(m: bankml.Model, name: str, n: int, outputs: str) -> dict:
    return dict(kind="prefill", model=name, backend=m.backend, tokens=n, outputs=outputs, threads=m.threads,
                llama_threads=m.llama_threads)


def decode_case(m: bankml.Model, name: str, prompt: int, total: int) -> dict:
    """Greedy decodes after a prompt of `prompt` tokens until the cache holds `total` cells."""
    return dict(kind="decode", model=name, backend=m.backend, tokens=prompt, cells=total, threads=m.threads,
                llama_threads=m.llama_threads)


_loaded: dict = {}



def load(name: str, backend: str, threads: int = 2, llama_threads: int | None = None) -> bankml.Model:
    key = (name, backend, threads, llama_threads)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=threads, llama_threads=llama_threads)
    return _loaded[key]


@pytest.fixture(scope="module")
def reference_rows():
    """llama.cpp's rows, cached by (model, n, outputs, threads) across the backends' tests."""
    cache = {}

    def get(name, n, outputs, threads=2):
        key = (name, n, outputs, threads)
        if key not in cache:
            cache[key] = oracle.logits(models.path(name), tokens(n, n), threads=threads, outputs=outputs)
        return cache[key]
    return get


def llvm_cases():
    for name in MODELS:
        for outputs in ("all", "last"):
            for n in LENGTHS:
                yield pytest.param(name, n, outputs, id=f"{name}-{n}-{outputs}")


def reference_cases():
    for name in MODELS:
        table = REFERENCE_SMOLLM2_LENGTHS if name.startswith("smollm2") else REFERENCE_LENGTHS
        for outputs in ("all", "last"):
            for n in table[outputs]:
                yield pytest.param(name, n, outputs, id=f"{name}-{n}-{outputs}")


@pytest.mark.parametrize("name,n,outputs", llvm_cases())
def test_llvm_prefill_rows_identical(record, reference_rows, name, n, outputs):
    m = load(name, "llvm")
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), reference_rows(name, n, outputs),
                          **prefill_case(m, name, n, outputs))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name,n", [("smollm2-q4_1", 65), ("smollm2-f16", 7), ("qwen3-small-q1_0", 600),
                                    ("qwen3-small-q2_0", 64), ("llama-gqa-f16", 63), ("smollm2-q8_0", 1)])
def test_llvm_threads_never_change_the_bits(record, reference_rows, name, n, threads):
    m = load(name, "llvm", threads=threads, llama_threads=2)
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs="all"), reference_rows(name, n, "all"),
                          **prefill_case(m, name, n, "all"))


@pytest.mark.parametrize("name,n,outputs", reference_cases())
def test_reference_prefill_rows_identical(record, reference_rows, name, n, outputs):
    m = load(name, "reference")
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), reference_rows(name, n, outputs),
                          **prefill_case(m, name, n, outputs))


@pytest.mark.parametrize("name", ["qwen3-small-q1_0", "llama-gqa-f16"])
def test_reference_600_token_prompt_crosses_a_micro_batch(record, reference_rows, name):
    """512 rows through the tiled kernel, then 88 through the one_chunk kernel."""
    m = load(name, "reference")
    assert_rows_identical(record, m.session().prefill(tokens(600, 600), outputs="all"),
                          reference_rows(name, 600, "all"), **prefill_case(m, name, 600, "all"))


def greedy(m: bankml.Model, prompt: list[int], total: int) -> tuple[list[int], np.ndarray]:
    """Greedy decodes until the cache holds `total` cells: the tokens, and the logits rows of the decodes."""
    s = m.session()
    row = s.prefill(prompt, outputs="last")[-1]
    toks, rows = list(prompt), []
    while len(toks) < total:
        toks.append(int(np.argmax(row)))
        row = s.decode(toks[-1])
        rows.append(row)
    return toks, np.stack(rows)


def greedy_identical(record, m: bankml.Model, prompt: list[int], total: int, **what) -> None:
    """Greedy decodes after `prompt` until the cache holds `total` cells, each decode's logits row
    against llama.cpp's for the same tokens: the prompt in one llama_decode, then one per token,
    at the model's llama_threads and cache types. Recorded as decode_case (the model by its file's
    name) and `what`."""
    toks, rows = greedy(m, prompt, total)
    ref = oracle.logits(m.path, toks, threads=m.llama_threads, outputs="last", decode_from=len(prompt),
                        cache_type_k=m.cache_type_k, cache_type_v=m.cache_type_v)
    assert_rows_identical(record, rows, ref[1:], **decode_case(m, m.path.stem, len(prompt), total), **what)


DECODE_CASES = [(name, lt, 2) for name in ("qwen3-small-q1_0", "smollm2-q4_1", "smollm2-f16", "llama-gqa-f16")
                for lt in (2, 3)] + [("qwen3-small-q1_0", lt, t) for lt in (2, 3) for t in (1, 3)]


@pytest.mark.parametrize("name,llama_threads,threads", DECODE_CASES)
def test_llvm_greedy_decodes_to_1100_cells(record, name, llama_threads, threads):
    """600-token prompt, then one llama_decode per token to 1,100 cells: split-KV from the first
    decode (padded n_kv 768 and up), whose chunks follow llama_threads, never our threads."""
    greedy_identical(record, load(name, "llvm", threads=threads, llama_threads=llama_threads), tokens(600, 11), 1100)


@pytest.mark.parametrize("name,llama_threads,total", [("qwen3-small-q1_0", 2, 300), ("qwen3-small-q1_0", 3, 300),
                                                       ("llama-gqa-f16", 3, 300)])
def test_reference_greedy_decodes_cross_into_split_kernel(record, name, llama_threads, total):
    """Decodes from 250 cells on: padded n_kv reaches 512 at 257 cells (split-KV)."""
    greedy_identical(record, load(name, "reference", llama_threads=llama_threads), tokens(250, 7), total)
