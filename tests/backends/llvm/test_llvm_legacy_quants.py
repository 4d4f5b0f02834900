"""llvm mul_mat and get_rows of Q4_0, Q5_0 and Q5_1 equal the reference backend bit for bit, on
every path (Q4_0 vec_dot for rows % 8 != 0, the Q4_0 repack for 8k rows, Q5_0, Q5_1), with the
work split over 1, 2 and 3 threads, and with column counts known only at run time."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.backends.reference.matmul import mul_mat, quantize_activation  # noqa: E402
from bankml.gguf.reader import ggml_type_name  # noqa: E402
from bankml.ir import order as fo  # noqa: E402
from bankml.ir.dims import Dim  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import Q4_0, Q5_0, Q5_1, WEIGHT_TYPES  # noqa: E402
from bankml.quants.activation import to_bytes  # noqa: E402

TYPES = [Q4_0, Q5_0, Q5_1]
NAMES = [WEIGHT_TYPES[t].name for t in TYPES]
CASES = [(t, k, m, n) for t in TYPES for k in (128, 576) for m in (1, 2, 5, 8, 19) for n in (37, 40)]


def _id(c) -> str:
    t, k, m, n = c
    return f"{WEIGHT_TYPES[t].name}-K{k}-M{m}-N{n}"


def _weight_bytes(t: int, n: int, k: int, rng) -> np.ndarray:
    """Random codes (every nibble and fifth bit) with sane f16 scales (and mins)."""
    wt = WEIGHT_TYPES[t]
    raw = rng.integers(0, 256, (n, wt.row_bytes(k)), dtype=np.uint8)
    nb = k // wt.block
    blocks = raw.reshape(n, nb, wt.block_bytes)
    halves = 2 if t == Q5_1 else 1
    scales = (rng.uniform(0.001, 0.1, (n, nb, halves)) * rng.choice([-1, 1], (n, nb, halves))).astype(np.float16)
    blocks[:, :, :2 * halves] = scales.view(np.uint8).reshape(n, nb, 2 * halves)
    return raw


@functools.cache
def _problem(t, k, m, n):
    rng = np.random.default_rng(1000 * k + 10 * m + n + t)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 20, (m, 1))).astype(np.float32)
    x[0, 32:64] = 0
    return _weight_bytes(t, n, k, rng), x


def _act_bytes(x: np.ndarray, t: int) -> np.ndarray:
    return to_bytes(quantize_activation(x, WEIGHT_TYPES[t].act_type))


def _nodes(t, k, m, n, order_cols=None):
    wt = WEIGHT_TYPES[t]
    x = Node(0, Op.INPUT, (), (m, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), wt.name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (m, k), ggml_type_name(wt.act_type), params={"type": wt.act_type})
    mm = Node(3, Op.MUL_MAT, (1, 2), (m, n), "f32", name="mm", order=matmul_order(t, n, order_cols or m))
    return graph_of(x, w, q, mm), mm


def _reference(raw, t, x, order):
    return mul_mat(raw, t, quantize_activation(x, WEIGHT_TYPES[t].act_type), order)


def _same(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_cases_take_every_path():
    orders = {matmul_order(t, n, m) for t, _, m, n in CASES}
    assert orders == {fo.Q4_0_DOT, fo.Q4_0_REPACK, fo.Q5_0_DOT, fo.Q5_1_DOT}


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_mul_mat_bits_equal_reference(case, nth):
    t, k, m, n = case
    raw, x = _problem(*case)
    g, mm = _nodes(*case)
    out = np.full((m, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, _act_bytes(x, t)], nth)
    assert _same(out, _reference(raw, t, x, mm.order))


@pytest.mark.parametrize("n", [37, 40])
@pytest.mark.parametrize("t", TYPES, ids=NAMES)
@pytest.mark.parametrize("dim", [Dim("T", 2, 63), Dim("O", 0, 1)], ids=["T2-63", "O0-1"])
def test_generic_mul_mat_bits_equal_reference_at_every_column_count(t, dim, n):
    """One kernel for a column count known at run time: full tiles, then tiles of 4, 2 and 1."""
    k = 256
    g, mm = _nodes(t, k, dim, n, order_cols=dim.hi)
    kernel = compile_kernel(g, mm)
    for m in sorted({dim.lo, dim.hi, *range(max(dim.lo, 1), min(dim.hi, 20) + 1)}):
        raw, x = _problem(t, k, max(m, 1), n)
        x = x[:m]
        out = np.full((max(m, 1), n), np.nan, np.float32)
        run_kernel(g, mm, out, [raw, _act_bytes(x, t) if m else np.zeros(1, np.uint8)], 2, {dim.name: m}, kernel)
        if m == 0:
            assert np.isnan(out).all()
            continue
        assert _same(out, _reference(raw, t, x, mm.order)), f"{m} columns"


@pytest.mark.parametrize("case", [(t, 256, 21, n) for t in TYPES for n in (37, 40)],
                         ids=[f"{WEIGHT_TYPES[t].name}-N{n}" for t in TYPES for n in (37, 40)])
def test_mul_mat_bits_equal_reference_in_row_chunks(case, monkeypatch):
    """Tiny row chunks (several per thread, a short last one) keep every output's bits."""
    from bankml.backends.llvm import kernels_matmul
    monkeypatch.setattr(kernels_matmul, "CHUNK_BYTES", 1500)
    t, k, m, n = case
    raw, x = _problem(*case)
    g, mm = _nodes(*case)
    out = np.full((m, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, _act_bytes(x, t)], 2)
    assert _same(out, _reference(raw, t, x, mm.order))


@pytest.mark.parametrize("nth", [1, 3])
@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_get_rows_of_weight_equals_dequantize(t, nth):
    rng = np.random.default_rng(t)
    k, rows = 256, 50
    raw = _weight_bytes(t, rows, k, rng)
    ids = np.array([3, 0, 49, 3, 17], np.int32)
    g = graph_of(Node(0, Op.WEIGHT, (), (rows, k), WEIGHT_TYPES[t].name, params={"tensor": "e", "ggml_type": t}),
                 Node(1, Op.INPUT, (), ids.shape, "i32", params={"input": "tokens"}),
                 Node(2, Op.GET_ROWS, (0, 1), (len(ids), k), "f32", name="embd"))
    out = np.full((len(ids), k), np.nan, np.float32)
    run_kernel(g, g[2], out, [raw, ids], nth)
    assert _same(out, WEIGHT_TYPES[t].dequantize(raw[ids], k))
