"""Reference mul_mat of Q4_0, Q5_0 and Q5_1 equals ggml_mul_mat of the oracle build, bit for bit,
on every path ggml takes on this AVX2 build (passes/choose_matmul_kernel.matmul_order):

- Q4_0 with rows % 8 != 0, Q5_0: vec_dot for 1 column, llamafile tinyBLAS_Q0_AVX for 2 or more
  (a plain ggml context: no repack buffer);
- Q5_1: vec_dot for every column count (llamafile has no Q5_1);
- Q4_0 with rows % 8 == 0: the weight in ggml-cpu's CPU_REPACK buffer, as llama.cpp loads it
  (q4_0_8x8): its gemm for groups of 4 columns and gemv for the rest, chunked over threads.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from bankml.backends.reference.matmul import mul_mat
from bankml.ir import order as fo
from bankml.oracle import ggml as G
from bankml.passes.choose_matmul_kernel import matmul_order
from bankml.quants import WEIGHT_TYPES

COLS = [1, 2, 3, 4, 5, 7, 8, 65]
PLAIN = [(t, k, m, n) for t, k, n in [(G.TYPE_Q4_0, 576, 37), (G.TYPE_Q4_0, 1536, 36), (G.TYPE_Q5_0, 576, 40),
                                      (G.TYPE_Q5_0, 1536, 37), (G.TYPE_Q5_1, 576, 40), (G.TYPE_Q5_1, 1536, 37)]
         for m in COLS]
REPACK = [(G.TYPE_Q4_0, k, m, n) for k, n in [(576, 40), (1536, 64)] for m in COLS + [16, 17]]


def _id(case) -> str:
    t, k, m, n = case
    return f"{WEIGHT_TYPES[t].name}-K{k}-M{m}-N{n}"


@functools.cache
def _problem(ggml_type: int, k: int, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * k + 10 * m + n + ggml_type)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2, (n, 1))).astype(np.float32)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 20, (m, 1))).astype(np.float32)
    x[0, 32:64] = 0                                          # a zero activation block
    return G.quantize_chunk(ggml_type, w), x


def _ggml_mul_mat(ggml_type, raw, x, threads, repacked=False) -> np.ndarray:
    (n, _), (m, k) = raw.shape, x.shape
    ctx = G.Context()
    w = ctx.repacked(ggml_type, (k, n), raw) if repacked else ctx.tensor(ggml_type, (k, n), raw)
    xt = ctx.tensor(G.TYPE_F32, (k, m), x)
    return ctx.compute(ctx.op("ggml_mul_mat", w, xt), threads, (m, n))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("threads", [1, 3], ids=["t1", "t3"])
@pytest.mark.parametrize("case", PLAIN, ids=[_id(c) for c in PLAIN])
def test_vec_dot_and_tinyblas_bits_equal_ggml(case, threads):
    ggml_type, k, m, n = case
    raw, x = _problem(*case)
    assert matmul_order(ggml_type, n, m) is not fo.Q4_0_REPACK
    assert _same(mul_mat(raw, ggml_type, x, matmul_order(ggml_type, n, m)), _ggml_mul_mat(ggml_type, raw, x, threads))


@pytest.mark.oracle
@pytest.mark.parametrize("threads", [1, 2, 3], ids=["t1", "t2", "t3"])
@pytest.mark.parametrize("case", REPACK, ids=[_id(c) for c in REPACK])
def test_repacked_q4_0_bits_equal_ggml(case, threads):
    ggml_type, k, m, n = case
    raw, x = _problem(*case)
    assert matmul_order(ggml_type, n, m) is fo.Q4_0_REPACK
    assert _same(mul_mat(raw, ggml_type, x, fo.Q4_0_REPACK), _ggml_mul_mat(ggml_type, raw, x, threads, repacked=True))


@pytest.mark.oracle
@pytest.mark.parametrize("m", [1, 7])
def test_repack_and_vec_dot_differ_and_the_rule_picks_the_repack(m):
    """Q4_0 of 8k rows: the repacked result is not vec_dot's (nor tinyBLAS's), so the rule matters."""
    raw, x = _problem(G.TYPE_Q4_0, 1536, m, 64)
    repack = mul_mat(raw, G.TYPE_Q4_0, x, fo.Q4_0_REPACK)
    dot = mul_mat(raw, G.TYPE_Q4_0, x, fo.Q4_0_DOT)
    assert not _same(repack, dot)
    assert _same(dot, _ggml_mul_mat(G.TYPE_Q4_0, raw, x, 2))
    assert _same(repack, _ggml_mul_mat(G.TYPE_Q4_0, raw, x, 2, repacked=True))


def test_matmul_order_rule_of_the_legacy_types():
    assert matmul_order(G.TYPE_Q4_0, 576, 1) is fo.Q4_0_REPACK
    assert matmul_order(G.TYPE_Q4_0, 49152, 64) is fo.Q4_0_REPACK
    assert matmul_order(G.TYPE_Q4_0, 36, 1) is fo.Q4_0_DOT
    assert matmul_order(G.TYPE_Q4_0, 37, 64) is fo.Q4_0_DOT
    assert matmul_order(G.TYPE_Q5_0, 576, 1) is fo.Q5_0_DOT
    assert matmul_order(G.TYPE_Q5_0, 576, 64) is fo.Q5_0_DOT
    assert matmul_order(G.TYPE_Q5_1, 576, 64) is fo.Q5_1_DOT
