"""Reference mul_mat equals ggml_mul_mat of the oracle build (vec_dot or tinyBLAS), bit for bit.

The order comes from passes/choose_matmul_kernel.matmul_order, so these tests check the
kernel rule too: F16 with n_cols >= 2 and n_rows % 4 == 0 is tinyBLAS, else vec_dot_f16;
Q8_0 with n_cols >= 2 runs tinyBLAS_Q0_AVX in ggml and our vec_dot order must match it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from matmul_util import case_id, ggml_mul_mat, problem  # noqa: E402

from bankml.backends.reference.matmul import mul_mat  # noqa: E402
from bankml.errors import LoweringError  # noqa: E402
from bankml.ir import order as fo  # noqa: E402
from bankml.oracle import ggml as G  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import WEIGHT_TYPES  # noqa: E402

TYPES = [G.TYPE_F16, G.TYPE_Q8_0, G.TYPE_Q4_1, G.TYPE_Q1_0, G.TYPE_Q2_0]
COLS = [1, 2, 3, 7, 64, 65]
ROWS = [36, 37]                     # a multiple of 4 and not
KS = [128, 576, 1536, 2048]
CASES = [(t, k, m, n) for t in TYPES for k in KS for m in COLS for n in ROWS
         if k % WEIGHT_TYPES[t].block == 0]          # Q1_0 blocks of 128 cannot make K = 576


@pytest.mark.oracle
@pytest.mark.parametrize("threads", [1, 3], ids=["t1", "t3"])
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_mul_mat_bits_equal_ggml(case, threads):
    ggml_type, k, m, n = case
    raw, x = problem(*case)
    mine = mul_mat(raw, ggml_type, x, matmul_order(ggml_type, n, m))
    ref = ggml_mul_mat(ggml_type, raw, x, threads)
    assert mine.dtype == np.float32 and mine.shape == (m, n)
    assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32))


@pytest.mark.oracle
def test_f16_tinyblas_and_vec_dot_differ_and_ggml_picks_by_shape():
    """The two F16 orders give different bits on the same data, so the rule matters."""
    raw, x = problem(G.TYPE_F16, 1536, 7, 36)
    tiny = mul_mat(raw, G.TYPE_F16, x, fo.F16_TINYBLAS)
    vec = mul_mat(raw, G.TYPE_F16, x, fo.F16_VEC_DOT)
    ref = ggml_mul_mat(G.TYPE_F16, raw, x, 2)
    assert not np.array_equal(tiny.view(np.uint32), vec.view(np.uint32))
    assert np.array_equal(tiny.view(np.uint32), ref.view(np.uint32))


def test_matmul_order_rule():
    assert matmul_order(G.TYPE_F16, 576, 1) is fo.F16_VEC_DOT
    assert matmul_order(G.TYPE_F16, 576, 2) is fo.F16_TINYBLAS
    assert matmul_order(G.TYPE_F16, 49153, 64) is fo.F16_VEC_DOT
    assert matmul_order(G.TYPE_Q8_0, 576, 64) is fo.Q8_0_DOT
    assert matmul_order(G.TYPE_Q4_1, 576, 64) is fo.Q4_1_DOT
    assert matmul_order(G.TYPE_Q1_0, 576, 1) is fo.Q1_0_DOT
    assert matmul_order(G.TYPE_Q2_0, 576, 2) is fo.Q2_0_DOT
    with pytest.raises(ValueError):
        matmul_order(20, 576, 2)                             # IQ4_NL is not a bankml weight type


def test_refuses_k_that_is_not_whole_blocks():
    raw = np.zeros((4, 18 * 4), np.uint8)
    with pytest.raises(LoweringError):
        mul_mat(raw, G.TYPE_Q1_0, np.zeros((1, 576), np.float32), fo.Q1_0_DOT)
