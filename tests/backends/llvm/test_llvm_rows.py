"""llvm GET_ROWS, ADD, MUL and SET_ROWS equal the reference backend bit for bit, split over 1-3 threads."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import graph_of, run_kernel  # noqa: E402

from bankml.backends.reference import glu, norm  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.ir.order import ELEMENTWISE, SET_ROWS_F16  # noqa: E402
from bankml.quants import F16, Q1_0, Q2_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, WEIGHT_TYPES  # noqa: E402

NTH = [1, 2, 3]


def _weight_bytes(t: int, rows: int, k: int, rng) -> np.ndarray:
    wt = WEIGHT_TYPES[t]
    if t == F16:
        return rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8)
    raw = rng.integers(0, 256, (rows, wt.row_bytes(k)), dtype=np.uint8)
    nb = k // wt.block
    blocks = raw.reshape(rows, nb, wt.block_bytes)
    blocks[:, :, 0:2] = (rng.standard_normal((rows, nb)) * 0.05).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if t in (Q4_1, Q5_1):
        blocks[:, :, 2:4] = (rng.standard_normal((rows, nb)) * 0.05).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    return raw


@pytest.mark.parametrize("nth", NTH)
@pytest.mark.parametrize("t", [F16, Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1], ids=lambda t: WEIGHT_TYPES[t].name)
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
    ref = WEIGHT_TYPES[t].dequantize(raw[ids], k)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("nth", NTH)
def test_get_rows_of_f32_copies_rows(nth):
    x = np.random.default_rng(0).standard_normal((7, 96)).astype(np.float32)
    ids = np.array([6, 2], np.int32)
    g = graph_of(Node(0, Op.INPUT, (), x.shape, "f32", params={"input": "x"}),
                 Node(1, Op.INPUT, (), ids.shape, "i32", params={"input": "out_ids"}),
                 Node(2, Op.GET_ROWS, (0, 1), (2, 96), "f32"))
    out = np.zeros((2, 96), np.float32)
    run_kernel(g, g[2], out, [x, ids], nth)
    assert np.array_equal(out.view(np.uint32), x[ids].view(np.uint32))


@pytest.mark.parametrize("nth", NTH)
@pytest.mark.parametrize("op", [Op.ADD, Op.MUL], ids=["add", "mul"])
@pytest.mark.parametrize("shapes", [((5, 96), (96,)), ((1, 576), (576,)), ((3, 4, 128), (128,)), ((6, 40), (6, 40))],
                         ids=["rows", "one-row", "heads", "same"])
def test_binary_bits_equal_reference(op, shapes, nth):
    rng = np.random.default_rng(len(shapes[0]))
    a = (rng.standard_normal(shapes[0]) * 100).astype(np.float32)
    w = rng.standard_normal(shapes[1]).astype(np.float32)
    g = graph_of(Node(0, Op.INPUT, (), a.shape, "f32", params={"input": "a"}),
                 Node(1, Op.WEIGHT, (), w.shape, "F32", params={"tensor": "w", "ggml_type": 0}),
                 Node(2, op, (0, 1), a.shape, "f32", name="y", order=ELEMENTWISE))
    out = np.full(a.shape, np.nan, np.float32)
    run_kernel(g, g[2], out, [a, w], nth)
    ref = glu.add(a, w) if op is Op.ADD else norm.mul(a, w)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("nth", NTH)
def test_set_rows_writes_f16_rows_at_positions(nth):
    rng = np.random.default_rng(5)
    cache = rng.standard_normal((512, 3, 64)).astype(np.float16)
    vals = (rng.standard_normal((4, 3, 64)) * 1e3).astype(np.float32)
    vals[0, 0, :4] = [65520.0, 1e-8, -2.0 ** -25, 2.0 ** -24 * 1.5]       # overflow, underflow, ties
    pos = np.array([7, 8, 300, 9], np.int32)
    g = graph_of(Node(0, Op.CACHE, (), (256, 3, 64), "f16", params={"layer": 0, "kind": "k"}),
                 Node(1, Op.INPUT, (), vals.shape, "f32", params={"input": "v"}),
                 Node(2, Op.INPUT, (), pos.shape, "i32", params={"input": "pos"}),
                 Node(3, Op.SET_ROWS, (0, 1, 2), (256, 3, 64), "f16", name="cache_k_l0 (view)", order=SET_ROWS_F16))
    ref = cache.copy()
    with np.errstate(over="ignore"):
        ref[pos] = vals.astype(np.float16)
    run_kernel(g, g[3], cache, [cache, vals, pos], nth)
    assert np.array_equal(cache.view(np.uint16), ref.view(np.uint16))
