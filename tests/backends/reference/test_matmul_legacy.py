"""Reference mul_mat of Q4_0, Q5_0 and Q5_1 equals ggml_mul_mat of the oracle build, bit for bit,
on every path ggml takes on this AVX2 build (passes/choose_matmul_kernel.matmul_order):

- Q4_0 with rows % 8 != 0, Q5_0: vec_dot for 1 column, llamafile tinyBLAS_Q0_AVX for 2 or more
  (a plain ggml context: no repack buffer);
- Q5_1: vec_dot for every column count (llamafile has no Q5_1);
- Q4_0 with rows % 8 == 0: the weight in ggml-cpu's CPU_REPACK buffer, as llama.cpp loads it
  (q4_0_8x8): its gemm for groups of 4 columns and gemv for the rest, chunked over threads.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from matmul_util import case_id, ggml_mul_mat, problem  # noqa: E402

from bankml.backends.reference.matmul import mul_mat  # noqa: E402
from bankml.ir import order as fo  # noqa: E402
from bankml.oracle import ggml as G  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402

COLS = [1, 2, 3, 4, 5, 7, 8, 65]
PLAIN = [(t, k, m, n) for t, k, n in [(G.TYPE_Q4_0, 576, 37), (G.TYPE_Q4_0, 1536, 36), (G.TYPE_Q5_0, 576, 40),
                                      (G.TYPE_Q5_0, 1536, 37), (G.TYPE_Q5_1, 576, 40), (G.TYPE_Q5_1, 1536, 37)]
         for m in COLS]
REPACK = [(G.TYPE_Q4_0, k, m, n) for k, n in [(576, 40), (1536, 64)] for m in COLS + [16, 17]]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("threads", [1, 3], ids=["t1", "t3"])
@pytest.mark.parametrize("case", PLAIN, ids=[case_id(c) for c in PLAIN])
def test_vec_dot_and_tinyblas_bits_equal_ggml(case, threads):
    ggml_type, k, m, n = case
    raw, x = problem(*case)
    assert matmul_order(ggml_type, n, m) is not fo.Q4_0_REPACK
    assert _same(mul_mat(raw, ggml_type, x, matmul_order(ggml_type, n, m)), ggml_mul_mat(ggml_type, raw, x, threads))


@pytest.mark.oracle
@pytest.mark.parametrize("threads", [1, 2, 3], ids=["t1", "t2", "t3"])
@pytest.mark.parametrize("case", REPACK, ids=[case_id(c) for c in REPACK])
def test_repacked_q4_0_bits_equal_ggml(case, threads):
    ggml_type, k, m, n = case
    raw, x = problem(*case)
    assert matmul_order(ggml_type, n, m) is fo.Q4_0_REPACK
    assert _same(mul_mat(raw, ggml_type, x, fo.Q4_0_REPACK), ggml_mul_mat(ggml_type, raw, x, threads, repacked=True))


@pytest.mark.oracle
@pytest.mark.parametrize("m", [1, 7])
def test_repack_and_vec_dot_differ_and_the_rule_picks_the_repack(m):
    """Q4_0 of 8k rows: the repacked result is not vec_dot's (nor tinyBLAS's), so the rule matters."""
    raw, x = problem(G.TYPE_Q4_0, 1536, m, 64)
    repack = mul_mat(raw, G.TYPE_Q4_0, x, fo.Q4_0_REPACK)
    dot = mul_mat(raw, G.TYPE_Q4_0, x, fo.Q4_0_DOT)
    assert not _same(repack, dot)
    assert _same(dot, ggml_mul_mat(G.TYPE_Q4_0, raw, x, 2))
    assert _same(repack, ggml_mul_mat(G.TYPE_Q4_0, raw, x, 2, repacked=True))


def test_matmul_order_rule_of_the_legacy_types():
    assert matmul_order(G.TYPE_Q4_0, 576, 1) is fo.Q4_0_REPACK
    assert matmul_order(G.TYPE_Q4_0, 49152, 64) is fo.Q4_0_REPACK
    assert matmul_order(G.TYPE_Q4_0, 36, 1) is fo.Q4_0_DOT
    assert matmul_order(G.TYPE_Q4_0, 37, 64) is fo.Q4_0_DOT
    assert matmul_order(G.TYPE_Q5_0, 576, 1) is fo.Q5_0_DOT
    assert matmul_order(G.TYPE_Q5_0, 576, 64) is fo.Q5_0_DOT
    assert matmul_order(G.TYPE_Q5_1, 576, 64) is fo.Q5_1_DOT
