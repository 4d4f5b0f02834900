"""Q4_0, Q5_0 and Q5_1 models identical to llama.cpp: every logits row and named tensor (sha256).

SmolLM2-135M quantized `--pure` from smollm2-f16 (bankml/testing/models.py), so every matrix,
the tied embeddings/output included, has the type. Every SmolLM2 matrix has 8k rows, so in
llama.cpp every Q4_0 mul_mat (logits included) runs the CPU_REPACK q4_0_8x8 gemm/gemv,
Q5_0 vec_dot (1 column) or tinyBLAS_Q0_AVX (more), Q5_1 vec_dot; get_rows dequantizes the
embeddings of each type. Prompts cross the 64-row (one_chunk / tiled attention) and the
512-row micro-batch edges, with all rows and the last row only (the numpy reference, slower,
on 7 and 65 tokens); greedy decodes cross into the split-KV attention at llama_threads 2 and 3.
"""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml import oracle
from bankml.diff import diff
from bankml.testing import models
from test_logits import assert_rows_identical, greedy_identical

pytestmark = pytest.mark.oracle

MODELS = ["smollm2-q4_0", "smollm2-q5_0", "smollm2-q5_1"]
LLVM_LENGTHS = {"all": [1, 63, 64], "last": [7, 65, 513]}
REFERENCE_LENGTHS = {"all": [7], "last": [65]}


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


_loaded: dict = {}



def load(name: str, backend: str, llama_threads: int | None = None) -> bankml.Model:
    key = (name, backend, llama_threads)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=2, llama_threads=llama_threads)
    return _loaded[key]


@pytest.fixture(scope="module")
def reference_rows():
    """llama.cpp's rows, cached by (model, n, outputs) across the backends' tests."""
    cache = {}

    def get(name, n, outputs):
        if (name, n, outputs) not in cache:
            cache[name, n, outputs] = oracle.logits(models.path(name), tokens(n, n), threads=2, outputs=outputs)
        return cache[name, n, outputs]
    return get


def _cases(lengths, extra=()):
    return [pytest.param(name, n, outputs, id=f"{name}-{n}-{outputs}")
            for name in MODELS for outputs in ("all", "last") for n in lengths[outputs]] + \
        [pytest.param(name, n, outputs, id=f"{name}-{n}-{outputs}") for name, n, outputs in extra]


def _prefill(record, reference_rows, backend, name, n, outputs):
    m = load(name, backend)
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), reference_rows(name, n, outputs),
                          kind="prefill", model=name, backend=backend, tokens=n, outputs=outputs, threads=m.threads,
                          llama_threads=m.llama_threads)


@pytest.mark.parametrize("name,n,outputs", _cases(LLVM_LENGTHS, [("smollm2-q4_0", 600, "all")]))
def test_llvm_prefill_rows_identical(record, reference_rows, name, n, outputs):
    _prefill(record, reference_rows, "llvm", name, n, outputs)


@pytest.mark.parametrize("name,n,outputs", _cases(REFERENCE_LENGTHS))
def test_reference_prefill_rows_identical(record, reference_rows, name, n, outputs):
    _prefill(record, reference_rows, "reference", name, n, outputs)


DECODES = [("llvm", "smollm2-q4_0", 2), ("llvm", "smollm2-q4_0", 3), ("llvm", "smollm2-q5_0", 3),
           ("llvm", "smollm2-q5_1", 2), ("reference", "smollm2-q4_0", 3)]


@pytest.mark.parametrize("backend,name,llama_threads", DECODES, ids=[f"{b}-{n}-lt{t}" for b, n, t in DECODES])
def test_greedy_decodes_cross_into_split_kernel(record, backend, name, llama_threads):
    """A 250-token prompt, then decodes to 264 cells: padded n_kv reaches 512 at 257 cells, whose
    split-KV chunks follow llama_threads."""
    greedy_identical(record, load(name, backend, llama_threads=llama_threads), tokens(250, 7), 264)


NAMED = [(b, name, n) for name in MODELS for b in ("llvm", "reference") for n in (7,)] + [("llvm", "smollm2-q4_0", 65)]


@pytest.mark.parametrize("backend,name,n", NAMED, ids=[f"{b}-{name}-{n}" for b, name, n in NAMED])
def test_named_tensors_identical(record, backend, name, n):
    r = diff(models.path(name), tokens(n, n + 100), backend=backend)
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), model=name, backend=backend, tokens=n, outputs="all")
    assert r.first_difference is None, r.summary()
    got = {c.name for c in r.compared}
    for want in ("embd", "Qcur-0", "Kcur-0", "Vcur-0", "attn_out-0", "ffn_up-0", "ffn_gate-0", "ffn_out-0",
                 "l_out-29", "result_output"):
        assert want in got, want
    assert not r.missing, r.missing
