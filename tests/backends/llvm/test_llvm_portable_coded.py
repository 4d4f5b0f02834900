"""Coded rows on llvm (backends/llvm/portable/coded.py): MUL_MAT of Q4_0, Q5_0, Q5_1, Q4_K and Q6_K
weights gives coded.dot_sub32's bits and GET_ROWS of every weight type coded.get_rows', for 1,
2 and 3 threads and several column counts, with bad, zero and denormal activation blocks, a
last group shorter than 256, scales far apart (Q5_1's and Q4_K's two) and every code."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, run_kernel  # noqa: E402

from bankml.profiles.portable import coded, quant  # noqa: E402
from bankml.quants import F16, Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES  # noqa: E402
from tests.backends.llvm.test_llvm_portable_matmul import (T_DIM, THREADS, _graph, activations, bits,  # noqa: E402
                                                           edge_activations, pq8)

CODED = [Q4_0, Q5_0, Q5_1, Q4_K, Q6_K]
NAME = {t: WEIGHT_TYPES[t].name for t in WEIGHT_TYPES}
# byte offsets of the f16 scales in a block: (first, second or None)
SCALES = {Q4_0: (0, None), Q5_0: (0, None), Q5_1: (0, 2), Q4_K: (0, 2), Q6_K: (208, None),
          Q8_0: (0, None), Q4_1: (0, 2), Q1_0: (0, None), Q2_0: (0, None)}


def weights(t: int, n: int, k: int, rng, far: bool = False) -> np.ndarray:
    """Random bytes of n rows of type t with finite f16 scales (far: the two scales 2^20 apart)."""
    if t == F16:
        return (rng.standard_normal((n, k)) * 0.05).astype(np.float16).view(np.uint8)
    wt = WEIGHT_TYPES[t]
    raw = rng.integers(0, 256, (n, wt.row_bytes(k)), dtype=np.uint8)
    blocks = raw.reshape(n, k // wt.block, wt.block_bytes)
    first, second = SCALES[t]
    d = rng.uniform(1e-3, 0.1, blocks.shape[:2]) * rng.choice([-1, 1], blocks.shape[:2])
    blocks[:, :, first:first + 2] = d.astype(np.float16)[..., None].view(np.uint8)
    if second is not None:
        m = d * (2.0 ** -20 if far else rng.uniform(0.1, 2, d.shape))
        blocks[:, :, second:second + 2] = m.astype(np.float16)[..., None].view(np.uint8)
    return raw


@functools.cache
def _kernel(kind: str, t: int, k: int, n: int):
    """(graph, node, compiled kernel) of test_llvm_portable_matmul's graph's "mm" or "rows" node."""
    g, _, mm, gr = _graph(t, k, T_DIM, n)
    node = mm if kind == "mm" else gr
    return g, node, compile_kernel(g, node)


def run_mul_mat(raw: np.ndarray, t: int, a: quant.ActBlocks, nth: int) -> np.ndarray:
    T, K = a.q.shape
    g, mm, kern = _kernel("mm", t, K, len(raw))
    out = np.full((T, len(raw)), np.nan, np.float32)
    return run_kernel(g, mm, out, [raw, pq8(a)], nth, {"T": T}, kernel=kern)


def ks(t: int) -> list[int]:
    return [256, 512] if t in (Q4_K, Q6_K) else [64, 576]          # 576: a last group of 64


@pytest.mark.parametrize("t", CODED, ids=lambda t: NAME[t])
@pytest.mark.parametrize("far", [False, True], ids=["near", "far"])
def test_mul_mat_of_coded_rows_bits_equal_spec(t, far):
    rng = np.random.default_rng(t * 10 + far)
    for k in ks(t):
        raw = weights(t, 23, k, rng, far)
        x = np.concatenate([activations(5, k, rng), edge_activations(k, rng)[[0, 1, 3, 5, 6]]])
        a = quant.quantize_act(x)
        for cols in (1, 4, len(x)):
            ac = quant.ActBlocks(a.q[:cols], a.m[:cols], a.e[:cols], a.bad[:cols])
            want = coded.dot_sub32(raw, t, ac)
            for nth in THREADS:
                got = run_mul_mat(raw, t, ac, nth)
                assert np.array_equal(bits(got), bits(want)), f"{NAME[t]} K={k} T={cols} nth={nth}"


def test_dot_sub32_is_the_documents_dot():
    """coded.dot_sub32 of quantize_act'd activations is the document's dot under Sub32 (the same
    group rounding as quant.mul_mat's for the formats it reads)."""
    rng = np.random.default_rng(3)
    for t in CODED + [Q4_1, Q8_0]:
        k = ks(t)[-1]
        raw, x = weights(t, 7, k, rng), activations(3, k, rng)
        assert np.array_equal(bits(coded.dot_sub32(raw, t, quant.quantize_act(x), rows_per_chunk=3)),
                              bits(coded.dot(raw, t, x))), NAME[t]


@pytest.mark.parametrize("t", [F16, Q8_0, Q4_1, Q1_0, Q2_0] + CODED, ids=lambda t: NAME[t])
def test_get_rows_bits_equal_spec(t):
    """Every weight's exact value rounded once (coded.get_rows: a·coef + b·offs), rows picked in
    any order and repeated."""
    rng = np.random.default_rng(t)
    k = 512 if t in (Q4_K, Q6_K) else 256
    raw = weights(t, 19, k, rng, far=t in (Q5_1, Q4_K))
    ids = np.array([3, 0, 18, 3, 7], np.int32)
    want = coded.get_rows(raw[ids], t, k)
    g, gr, kern = _kernel("rows", t, k, len(raw))
    for nth in THREADS:
        out = np.zeros((len(ids), k), np.float32)
        got = run_kernel(g, gr, out, [raw, ids], nth, {"T": len(ids)}, kernel=kern)
        assert np.array_equal(bits(got), bits(want)), f"{NAME[t]} nth={nth}"


def test_k_quant_get_rows_are_the_weights_exact_values():
    """coded.get_rows of a K-quant row is its exact a·coef + b·offs rounded once: equal to the
    f64 value of the dequantization's exact terms wherever that fits f32's 24 bits."""
    rng = np.random.default_rng(9)
    for t in (Q4_K, Q6_K):
        raw = weights(t, 4, 256, rng)
        cr = coded.coded_rows(raw, t, 256)
        exact = cr.a.sig[:, :1] * cr.coef * 2.0 ** cr.a.exp[:, :1]
        if cr.b is not None:
            exact = exact + cr.b.sig[:, :1] * cr.offs * 2.0 ** cr.b.exp[:, :1]
        assert np.array_equal(coded.get_rows(raw, t, 256), exact.astype(np.float32)), NAME[t]
