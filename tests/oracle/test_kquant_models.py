"""A synthetic Llama with K-quant matrices, identical to llama.cpp row for row, both backends.

llama-kq-q4_k_m is llama-quantize's default Q4_K_M mix of a random F16 Llama (512 embd, 2
layers, 8/2 heads of 64, 1536 ff, untied): Q4_K token_embd (get_rows) and layer matrices,
Q6_K output and half the attn_v/ffn_down. Every dim is a multiple of 8, so in llama.cpp all its
Q4_K matrices are repacked (gemm/gemv) and Q6_K runs vec_dot (1..7 columns) or tiled (8+);
--pure Q4_K and Q6_K copies put every matrix, the logits one included, on one type.
Prompts cross the 64-row (tiled attention) and 512-row (micro-batch) edges.
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

MIX = "llama-kq-q4_k_m"
_loaded: dict = {}


def load(name, backend, llama_threads=None):
    key = (name, backend, llama_threads)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=2, llama_threads=llama_threads)
    return _loaded[key]


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


CASES = [(MIX, "llvm", n, o) for n in (1, 7, 63, 64, 65, 600) for o in ("all", "last")] + \
        [(MIX, "reference", n, o) for n in (7, 65) for o in ("all", "last")] + [(MIX, "reference", 600, "last")] + \
        [(name, b, n, "all") for name in ("llama-kq-q4_k", "llama-kq-q6_k") for b in ("llvm", "reference")
         for n in (5, 65)]


@pytest.mark.parametrize("name,backend,n,outputs", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_kquant_prefill_rows_identical(record, name, backend, n, outputs):
    m = load(name, backend)
    ref = oracle.logits(m.path, tokens(n, n), threads=2, outputs=outputs)
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), ref, kind="prefill", model=name,
          backend=backend, tokens=n, outputs=outputs, threads=2, llama_threads=2)


@pytest.mark.parametrize("backend,prompt,total", [("llvm", 600, 700), ("reference", 250, 262)])
@pytest.mark.parametrize("llama_threads", [2, 3])
def test_kquant_greedy_decodes_identical(record, backend, prompt, total, llama_threads):
    """Decodes into split-KV attention (padded n_kv 512+), whose chunks follow llama_threads."""
    greedy_identical(record, load(MIX, backend, llama_threads=llama_threads), tokens(prompt, 11), total)


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_kquant_named_tensors_identical(record, backend):
    r = diff(models.path(MIX), tokens(65, 3), backend=backend)
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), model=MIX, backend=backend, tokens=65, outputs="all")
    assert r.first_difference is None, r.summary()
    got = {c.name for c in r.compared}
    for want in ("embd", "Qcur-0", "Vcur-1", "ffn_out-1", "result_output"):
        assert want in got, want
    assert not r.missing, r.missing
