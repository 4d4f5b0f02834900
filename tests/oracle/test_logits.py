"""Every logits row identical to llama.cpp's (sha256 of f32 bytes), reference backend."""
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
LENGTHS = [1, 7, 63, 64, 65]
SMOLLM2_LENGTHS = {"all": [1, 7, 65], "last": [7, 65]}    # 135M params: the numpy backend is slow


def cases():
    for name in MODELS:
        for outputs in ("all", "last"):
            lengths = SMOLLM2_LENGTHS[outputs] if name.startswith("smollm2") else LENGTHS
            for n in lengths:
                yield pytest.param(name, n, outputs, id=f"{name}-{n}-{outputs}")


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def assert_rows_identical(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.shape == ref.shape
    bad = [i for i, (a, b) in enumerate(zip(oracle.sha256_rows(ours), oracle.sha256_rows(ref))) if a != b]
    assert not bad, f"{len(bad)}/{len(ref)} rows differ, first {bad[:5]}"


@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(name: str) -> bankml.Model:
        if name not in cache:
            cache[name] = bankml.load(models.path(name), backend="reference", threads=2)
        return cache[name]
    return get


@pytest.mark.parametrize("name,n,outputs", cases())
def test_prefill_rows_identical(loaded, name, n, outputs):
    m, t = loaded(name), tokens(n, n)
    assert_rows_identical(m.session().prefill(t, outputs=outputs), oracle.logits(m.path, t, outputs=outputs))


@pytest.mark.parametrize("name", ["qwen3-small-q1_0", "qwen3-small-untied-f16", "llama-gqa-f16"])
def test_600_token_prompt_crosses_a_micro_batch(loaded, name):
    """512 rows through the tiled kernel, then 88 through the reference kernel."""
    m, t = loaded(name), tokens(600, 600)
    assert_rows_identical(m.session().prefill(t, outputs="all"), oracle.logits(m.path, t, outputs="all"))


@pytest.mark.slow
def test_600_token_prompt_smollm2():
    m, t = bankml.load(models.path("smollm2-q4_1"), threads=2), tokens(600, 600)
    assert_rows_identical(m.session().prefill(t, outputs="last"), oracle.logits(m.path, t, outputs="last"))


def greedy(m: bankml.Model, prompt: list[int], total: int) -> tuple[list[int], np.ndarray]:
    s = m.session()
    row = s.prefill(prompt, outputs="last")[-1]
    toks, rows = list(prompt), []
    while len(toks) < total:
        toks.append(int(np.argmax(row)))
        row = s.decode(toks[-1])
        rows.append(row)
    return toks, np.stack(rows)


@pytest.mark.parametrize("name,llama_threads,total", [("qwen3-small-q1_0", 2, 300), ("qwen3-small-q1_0", 3, 300),
                                                       ("llama-gqa-f16", 3, 300), ("smollm2-q4_1", 3, 270)])
def test_greedy_decodes_cross_into_split_kernel(name, llama_threads, total):
    """Decodes from 250 cells on: padded n_kv reaches 512 at 257 cells (split-KV)."""
    m = bankml.load(models.path(name), threads=2, llama_threads=llama_threads)
    toks, rows = greedy(m, tokens(250, 7), total)
    ref = oracle.logits(m.path, toks, threads=llama_threads, outputs="last", decode_from=250)
    assert_rows_identical(rows, ref[1:])


@pytest.mark.slow
@pytest.mark.parametrize("llama_threads", [2, 3])
def test_greedy_decodes_to_1100_cells(llama_threads):
    m = bankml.load(models.path("qwen3-small-q1_0"), threads=2, llama_threads=llama_threads)
    toks, rows = greedy(m, tokens(600, 11), 1100)
    ref = oracle.logits(m.path, toks, threads=llama_threads, outputs="last", decode_from=600)
    assert_rows_identical(rows, ref[1:])
