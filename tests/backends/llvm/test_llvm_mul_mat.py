"""llvm mul_mat and quantize kernels equal the reference backend bit for bit, for every weight
type and float order (the legacy types on every path: Q4_0 vec_dot for rows % 8 != 0, the Q4_0
repack for 8k rows, Q5_0, Q5_1), with the work split over 1, 2 and 3 threads, and with column
counts known only at run time."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.backends.llvm import jit, registry  # noqa: E402
from bankml.backends.reference.matmul import mul_mat, quantize_activation  # noqa: E402
from bankml.gguf.reader import ggml_type_name  # noqa: E402
from bankml.ir import order as fo  # noqa: E402
from bankml.ir.dims import Dim  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import F16, Q1_0, Q2_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, WEIGHT_TYPES  # noqa: E402
from bankml.quants.activation import to_bytes  # noqa: E402

TYPES = [F16, Q8_0, Q4_1, Q1_0, Q2_0]
LEGACY = [Q4_0, Q5_0, Q5_1]                     # 37 rows: vec_dot; 40 rows: Q4_0's repack
CASES = [(t, k, m, n) for t in TYPES for k in (128, 576, 1536) for m in (1, 2, 5, 7, 8, 19) for n in (36, 37)
         if k % WEIGHT_TYPES[t].block == 0] + [(F16, 100, 3, 36), (F16, 100, 1, 37), (F16, 44, 6, 40),
                                                (F16, 100, 13, 36), (F16, 44, 17, 40)] + \
        [(t, k, m, n) for t in LEGACY for k in (128, 576) for m in (1, 2, 5, 8, 19) for n in (37, 40)]
WIDE = [(t, k, m, 37) for t in (Q8_0, Q4_0, Q5_0) for k in (576, 2080) for m in (32, 45)]   # Tiler.wide: 1x8, 2x4
TYPE_ROWS = [(t, n) for t in TYPES for n in (36, 37)] + [(t, n) for t in LEGACY for n in (37, 40)]
CHUNKED = [(t, 256, 21, 37) for t in TYPES] + [(t, 256, 21, n) for t in LEGACY for n in (37, 40)] + \
          [(t, k, 40, 37) for t in (Q8_0, Q4_0, Q5_0) for k in (256, 2080)]


def _id(c) -> str:
    t, k, m, n = c
    return f"{WEIGHT_TYPES[t].name}-K{k}-M{m}-N{n}"


def _quantize_weights(t: int, w: np.ndarray) -> np.ndarray:
    """Weight bytes of type t from f32 rows (the activation quantizers suffice for random tests)."""
    if t == F16:
        return w.astype(np.float16).view(np.uint8)
    rng = np.random.default_rng(w.size + t)
    n, k = w.shape
    wt = WEIGHT_TYPES[t]
    raw = rng.integers(0, 256, (n, wt.row_bytes(k)), dtype=np.uint8)
    nb = k // wt.block
    d = (rng.uniform(0.001, 0.1, (n, nb)) * rng.choice([-1, 1], (n, nb))).astype(np.float16)
    blocks = raw.reshape(n, nb, wt.block_bytes)
    blocks[:, :, 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    if t in (Q4_1, Q5_1):
        mn = rng.uniform(-0.1, 0.1, (n, nb)).astype(np.float16)
        blocks[:, :, 2:4] = mn.view(np.uint8).reshape(n, nb, 2)
    return raw


@functools.cache
def _problem(t, k, m, n):
    rng = np.random.default_rng(1000 * k + 10 * m + n + t)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 20, (m, 1))).astype(np.float32)
    x[0, 32:64] = 0
    return _quantize_weights(t, w), x


def _act_bytes(x: np.ndarray, act: int) -> np.ndarray:
    a = quantize_activation(x, act)
    return a.view(np.uint8).reshape(x.shape[0], -1) if act == F16 else to_bytes(a)


def _nodes(t, k, m, n, order_cols=None):
    wt = WEIGHT_TYPES[t]
    x = Node(0, Op.INPUT, (), (m, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), wt.name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (m, k), ggml_type_name(wt.act_type), params={"type": wt.act_type})
    mm = Node(3, Op.MUL_MAT, (1, 2), (m, n), "f32", name="mm", order=matmul_order(t, n, order_cols or m))
    return graph_of(x, w, q, mm), q, mm


def test_the_legacy_cases_take_every_path():
    orders = {matmul_order(t, n, m) for t, _, m, n in CASES if t in LEGACY}
    assert orders == {fo.Q4_0_DOT, fo.Q4_0_REPACK, fo.Q5_0_DOT, fo.Q5_1_DOT}


@pytest.mark.parametrize("t, n", TYPE_ROWS, ids=[f"{WEIGHT_TYPES[t].name}-N{n}" for t, n in TYPE_ROWS])
@pytest.mark.parametrize("dim", [Dim("T", 2, 63), Dim("O", 0, 1)], ids=["T2-63", "O0-1"])
def test_generic_mul_mat_bits_equal_reference_at_every_column_count(t, dim, n):
    """One kernel for a column count known at run time: full tiles, then tiles of 4, 2 and 1
    (F16 with 36 rows: tinyBLAS for T, vec_dot for O)."""
    k = 256
    g, q, mm = _nodes(t, k, dim, n, order_cols=dim.hi)
    kernel = compile_kernel(g, mm)
    for m in sorted({dim.lo, dim.hi, *range(max(dim.lo, 1), min(dim.hi, 20) + 1)}):
        raw, x = _problem(t, k, max(m, 1), n)
        x = x[:m]
        out = np.full((max(m, 1), n), np.nan, np.float32)
        run_kernel(g, mm, out, [raw, _act_bytes(x, WEIGHT_TYPES[t].act_type) if m else np.zeros(1, np.uint8)], 2,
                   {dim.name: m}, kernel)
        if m == 0:
            assert np.isnan(out).all()              # no column: nothing written
            continue
        ref = mul_mat(raw, t, quantize_activation(x, WEIGHT_TYPES[t].act_type), mm.order)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), f"{m} columns"


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_mul_mat_bits_equal_reference(case, nth):
    t, k, m, n = case
    raw, x = _problem(*case)
    g, q, mm = _nodes(*case)
    act = _act_bytes(x, WEIGHT_TYPES[t].act_type)
    out = np.full((m, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, act], nth)
    ref = mul_mat(raw, t, quantize_activation(x, WEIGHT_TYPES[t].act_type), mm.order)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("case", WIDE, ids=[_id(c) for c in WIDE])
def test_wide_mul_mat_bits_equal_reference(case, nth):
    """A prompt's kernels (32 columns or more) of the Q8_0 chain take Tiler.wide (widen_pairs:
    the lane sums by vpmaddwd, never vpsignb); tiles of 1 x 8 and, past K 2048, of 2 x 4 with a
    leftover row."""
    t, k, m, n = case
    raw, x = _problem(*case)
    g, q, mm = _nodes(*case)
    text = jit.asm(_module_of(g, mm), optimize=True)
    assert "vpmaddwd" in text and "vpsignb" not in text
    out = np.full((m, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, _act_bytes(x, WEIGHT_TYPES[t].act_type)], nth)
    ref = mul_mat(raw, t, quantize_activation(x, WEIGHT_TYPES[t].act_type), mm.order)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_few_columns_keep_the_narrow_tiles():
    """Below WIDE_COLS (a decode, a batch of sequences) the Q8_0 chain keeps ggml's own steps
    (vpsignb, vpmaddubsw): widening the chunk does not pay for so few columns."""
    g, q, mm = _nodes(Q8_0, 576, Dim("T", 2, 16), 37, order_cols=16)
    assert "vpsignb" in jit.asm(_module_of(g, mm), optimize=True)


def _module_of(g, mm):
    mod = ir.Module()
    registry.define(mod, g, mm).linkage = "external"
    return mod


@pytest.mark.parametrize("case", CHUNKED, ids=[_id(c) for c in CHUNKED])
def test_mul_mat_bits_equal_reference_in_row_chunks(case, monkeypatch):
    """Tiny row chunks (several chunks per thread, a short last one) keep every output's bits."""
    from bankml.backends.llvm.ggml.matmul import tiling
    monkeypatch.setattr(tiling, "CHUNK_BYTES", 1500)
    t, k, m, n = case
    raw, x = _problem(*case)
    g, q, mm = _nodes(*case)
    out = np.full((m, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, _act_bytes(x, WEIGHT_TYPES[t].act_type)], 2)
    ref = mul_mat(raw, t, quantize_activation(x, WEIGHT_TYPES[t].act_type), mm.order)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("act", [F16, Q8_0, Q8_1], ids=["f16", "q8_0", "q8_1"])
def test_quantize_bits_equal_reference(act, nth):
    rng = np.random.default_rng(act)
    x = (rng.standard_normal((5, 256)) * rng.uniform(0.001, 50, (5, 1))).astype(np.float32)
    x[1, 64:96] = 0
    x[2, :32] = np.float32(0.5) / np.float32(127) * np.arange(32)      # ties for round-half-even
    x[3, 5] = 1e30
    wt = {F16: 2 * 256, Q8_0: 8 * 34, Q8_1: 8 * 36}[act]
    g = graph_of(Node(0, Op.INPUT, (), x.shape, "f32", params={"input": "x"}),
                 Node(1, Op.QUANTIZE, (0,), x.shape, ggml_type_name(act), params={"type": act}))
    out = np.full((5, wt), 0xAB, np.uint8)
    run_kernel(g, g[1], out, [x], nth)
    assert np.array_equal(out, _act_bytes(x, act))
