"""Q4_K / Q6_K weights with q8_K activations: each path ggml-cpu (AVX2) takes, against single
ggml ops of the oracle build, on both backends.

Paths (by shape): Q6_K and Q4_K with rows % 8 != 0 run ggml_vec_dot_q{4,6}_K_q8_K below 8
columns and the tiled kernel from 8 (a plain ggml_mul_mat); Q4_K with rows % 8 == 0 is
repacked (q4_K_8x8_q8_K: gemm per 4 columns, gemv for the rest), run here by putting the
weight in ggml-cpu's repack buffer as llama.cpp does. Also quantize_row_q8_K and get_rows's
to_float for both types.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "backends" / "llvm"))
from llvm_kernel_util import graph_of, run_kernel  # noqa: E402

from bankml.backends.reference.matmul import mul_mat  # noqa: E402
from bankml.gguf.reader import ggml_type_name  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.oracle import ggml as G  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import Q4_K, Q6_K, Q8_K, WEIGHT_TYPES  # noqa: E402
from bankml.quants import q8_k  # noqa: E402

pytestmark = pytest.mark.oracle

# (type, rows N, K, columns M): rows 40 repack Q4_K, 36 does not; M 1/3/7 vec_dot or gemv only,
# 4/8/9/11/20 gemm groups plus 0-3 gemv columns, or the tiled kernel; K of 1 to 3 super-blocks
CASES = [(Q6_K, 36, 512, m) for m in (1, 7, 8, 20)] + [(Q6_K, 40, 256, 3), (Q6_K, 40, 768, 9)] + \
        [(Q4_K, 36, 512, m) for m in (1, 7, 8, 20)] + [(Q4_K, 37, 768, 9)] + \
        [(Q4_K, 40, 768, m) for m in (1, 3, 4, 5, 8, 11)] + [(Q4_K, 16, 256, 9)]


def _id(c):
    t, n, k, m = c
    return f"{WEIGHT_TYPES[t].name}-N{n}-K{k}-M{m}"


def _problem(t, n, k, m):
    rng = np.random.default_rng(7 * n + k + m + t)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 1, (n, 1))).astype(np.float32)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 20, (m, 1))).astype(np.float32)
    x[0, 256 - 64:256] = 0
    return G.quantize_chunk(t, w), x


def _ggml(t, raw, x, repacked: bool, threads=2):
    if repacked:
        return G.mul_mat_repacked(t, raw, x, threads)
    ctx = G.Context()
    (n, _), (m, k) = raw.shape, x.shape
    out = ctx.op("ggml_mul_mat", ctx.tensor(t, (k, n), raw), ctx.tensor(G.TYPE_F32, (k, m), x))
    return ctx.compute(out, threads=threads, shape=(m, n))


def _llvm(t, raw, x, nth):
    (n, k), m = (raw.shape[0], x.shape[1]), x.shape[0]
    xn = Node(0, Op.INPUT, (), (m, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), WEIGHT_TYPES[t].name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (m, k), ggml_type_name(Q8_K), params={"type": Q8_K})
    mm = Node(3, Op.MUL_MAT, (1, 2), (m, n), "f32", name="mm", order=matmul_order(t, n, m))
    g = graph_of(xn, w, q, mm)
    act = np.zeros((m, k // 256 * 292), np.uint8)
    run_kernel(g, q, act, [x], nth)
    assert np.array_equal(act, q8_k.to_bytes(q8_k.quantize_q8_k(x)))         # the llvm quantize too
    out = np.full((m, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, act], nth)
    return out


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_mul_mat_bits_equal_ggml_on_both_backends(case):
    t, n, k, m = case
    raw, x = _problem(*case)
    order = matmul_order(t, n, m)
    ref = _ggml(t, raw, x, repacked=t == Q4_K and n % 8 == 0)
    assert _same(mul_mat(raw, t, x, order), ref)
    assert _same(_llvm(t, raw, x, nth=1 + m % 3), ref)


def test_paths_differ_so_the_cases_discriminate():
    """The kernels disagree on these data: a wrong choice of path would fail the test above."""
    from bankml.backends.reference import matmul_kquants as mk
    raw, x = _problem(Q4_K, 40, 768, 8)
    u, a = WEIGHT_TYPES[Q4_K].unpack(raw, 768), q8_k.quantize_q8_k(x)
    s = mk._int_sums(u, a, Q4_K)
    outs = [fn(u, a, s) for (t, _), fn in mk._PATHS.items() if t == Q4_K]
    assert all(not _same(outs[i], outs[j]) for i in range(4) for j in range(i))


def test_quantize_q8_k_bits_equal_ggml():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.001, 50, (6, 1))).astype(np.float32)
    x[1, :256] = 0
    x[2, 3], x[2, 9] = 5, -5                   # equal magnitudes: the first one decides the sign
    x[3, 3], x[3, 9] = -5, 5
    x[4] = np.float32(0.5) / np.float32(127) * np.arange(512) % 3     # ties for round-half-even
    x[5, 300], x[5, 263], x[5, 511] = 900, -900, 900  # the largest magnitude twice: the first (-) decides
    x[0, 7], x[0, 255] = -900, 900                    # ... in the first and last 8 lanes of a block
    ref = np.stack([np.frombuffer(G.from_float(Q8_K, r), np.uint8) for r in x])
    assert np.array_equal(q8_k.to_bytes(q8_k.quantize_q8_k(x)), ref)
    xn = Node(0, Op.INPUT, (), x.shape, "f32", params={"input": "x"})
    q = Node(1, Op.QUANTIZE, (0,), x.shape, ggml_type_name(Q8_K), params={"type": Q8_K})
    for nth in (1, 2, 3):                              # the llvm kernel (a vector scan for the first max)
        act = np.zeros((x.shape[0], 2 * 292), np.uint8)
        run_kernel(graph_of(xn, q), q, act, [x], nth)
        assert np.array_equal(act, ref), f"nth={nth}"


@pytest.mark.parametrize("t", [Q4_K, Q6_K], ids=["Q4_K", "Q6_K"])
def test_get_rows_dequantize_bits_equal_ggml_on_both_backends(t):
    rng = np.random.default_rng(t)
    w = (rng.standard_normal((6, 768)) * rng.uniform(0.01, 3, (6, 1))).astype(np.float32)
    raw = G.quantize_chunk(t, w)
    ref = np.stack([G.to_float(t, r.tobytes(), 768) for r in raw])
    assert _same(WEIGHT_TYPES[t].dequantize(raw, 768), ref)
    ids = np.array([5, 0, 3, 3], np.int32)
    wn = Node(0, Op.WEIGHT, (), (6, 768), WEIGHT_TYPES[t].name, params={"tensor": "w", "ggml_type": t})
    idn = Node(1, Op.INPUT, (), (4,), "i32", params={"input": "ids"})
    gr = Node(2, Op.GET_ROWS, (0, 1), (4, 768), "f32", name="rows")
    g = graph_of(wn, idn, gr)
    out = np.full((4, 768), np.nan, np.float32)
    run_kernel(g, gr, out, [raw, ids], 2)
    assert _same(out, ref[ids])


def test_gemm_columns_with_tied_signed_maxima_equal_ggml():
    """ggml_quantize_mat_q8_K_4x8 (the gemm's activations) takes -127/amax whenever +amax occurs,
    quantize_row_q8_K the sign of the first maximum: here they disagree (row 1: -amax first),
    q and d both flip sign, and the gemm's output bits stay those of the one quantizer we use."""
    raw, x = _problem(Q4_K, 40, 512, 4)
    x[1, 3], x[1, 9] = -40, 40
    x[2, 300], x[2, 260] = 40, -40
    mat = np.zeros(2 * (16 + 1024 + 128), np.uint8)              # two block_q8_Kx4: d[4], qs, bsums
    fn = G.lib()._Z19ggml_quantize_mat_tILl8EL9ggml_type15EEvPKfPvll    # ggml_quantize_mat_t<8, Q8_K>
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    fn(np.ascontiguousarray(x).ctypes.data, mat.ctypes.data, 4, 512)
    d4 = mat[:16].view(np.float32)
    d1 = q8_k.quantize_q8_k(x).d[:, 0]
    assert np.array_equal(d4, d1 * np.array([1, -1, 1, 1], np.float32))   # the sign flips in row 1 only
    order = matmul_order(Q4_K, 40, 4)
    ref = _ggml(Q4_K, raw, x, repacked=True)
    assert _same(mul_mat(raw, Q4_K, x, order), ref)
    assert _same(_llvm(Q4_K, raw, x, nth=2), ref)


@pytest.mark.parametrize("t,n", [(Q4_K, 40), (Q6_K, 36)], ids=["Q4_K", "Q6_K"])
def test_reference_mul_mat_of_no_columns(t, n):
    """A micro-batch that wants no logits multiplies the output matrix by zero rows."""
    raw, x = _problem(t, n, 256, 1)
    assert mul_mat(raw, t, x[:0], matmul_order(t, n, 0)).shape == (0, n)


@pytest.mark.parametrize("t,n", [(Q4_K, 40), (Q4_K, 36), (Q6_K, 36)], ids=["Q4_K-repacked", "Q4_K", "Q6_K"])
def test_generic_llvm_kernel_bits_equal_ggml_at_every_column_count(t, n):
    """One llvm kernel for T = 2..63 columns known at run time: the vec_dot/tiled switch at 8 and
    the gemm/gemv split at M - M % 4 happen inside it; every count takes every mix of the
    kernel's tiles (LANE_TILES widths in lanes, single columns)."""
    from bankml.ir.dims import Dim
    from llvm_kernel_util import compile_kernel
    k, T = 512, Dim("T", 2, 63)
    xn = Node(0, Op.INPUT, (), (T, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), WEIGHT_TYPES[t].name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (T, k), ggml_type_name(Q8_K), params={"type": Q8_K})
    mm = Node(3, Op.MUL_MAT, (1, 2), (T, n), "f32", name="mm", order=matmul_order(t, n, 63))
    g = graph_of(xn, w, q, mm)
    kernel = compile_kernel(g, mm)
    raw, x = _problem(t, n, k, 63)
    for m in range(2, 64):
        out = np.full((m, n), np.nan, np.float32)
        run_kernel(g, mm, out, [raw, q8_k.to_bytes(q8_k.quantize_q8_k(x[:m]))], 2, {"T": m}, kernel)
        assert _same(out, _ggml(t, raw, x[:m], repacked=t == Q4_K and n % 8 == 0)), f"{m} columns"


@pytest.mark.parametrize("t,n", [(Q4_K, 1408), (Q4_K, 1412), (Q6_K, 1000)], ids=["Q4_K-repacked", "Q4_K", "Q6_K"])
def test_llvm_kernel_over_several_row_chunks_equals_reference(t, n):
    """Rows past one L2 chunk (the column tiles' interleaved activations are made again per
    chunk), an odd thread split, and 63 columns: every LANE_TILES width and single columns
    (with tiles of 8 and 4: 7 x 8 + 4 + 3)."""
    k, m = 256, 63
    raw, x = _problem(t, n, k, m)
    assert n * WEIGHT_TYPES[t].row_bytes(k) > 2 * 96 * 1024
    assert _same(_llvm(t, raw, x, nth=3), mul_mat(raw, t, x, matmul_order(t, n, m)))
