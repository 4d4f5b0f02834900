"""The Q1_0 mat-vec by table lookups (backends/llvm/ggml/matmul/q1_lut.py) equals the reference backend bit
for bit: one activation column, row counts with and without a tail of fewer than 16 rows, K from
one 128-block to 6,144, 1, 2 and 3 threads, and activations at the ends of the tables' range."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.backends.llvm import registry  # noqa: E402
from bankml.backends.llvm.ggml.matmul.q1_lut import ROWS  # noqa: E402
from bankml.backends.reference.matmul import mul_mat, quantize_activation  # noqa: E402
from bankml.ir.dims import Dim  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import Q1_0, Q8_0, WEIGHT_TYPES  # noqa: E402
from bankml.quants.activation import to_bytes  # noqa: E402

WT = WEIGHT_TYPES[Q1_0]


def _weights(n: int, k: int, seed: int) -> np.ndarray:
    """Random bits, f16 scales of both signs."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, WT.row_bytes(k)), dtype=np.uint8)
    nb = k // WT.block
    d = (rng.uniform(0.001, 0.1, (n, nb)) * rng.choice([-1, 1], (n, nb))).astype(np.float16)
    raw.reshape(n, nb, WT.block_bytes)[:, :, 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    return raw


def _activation(m: int, k: int, seed: int) -> np.ndarray:
    """Random rows, a zero block, and blocks of equal magnitudes (quants of +-127: table sums
    of +-508) with random and with equal signs."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 20, (m, 1))).astype(np.float32)
    x[:, 32:64] = 0
    if k >= 256:
        x[:, 64:96] = rng.choice([-3.0, 3.0], (m, 32))
        x[:, 96:128] = 3.0
        x[:, 128:160] = -3.0
    return x


def _nodes(k: int, m, n: int, order_cols: int = 1):
    x = Node(0, Op.INPUT, (), (m, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), WT.name, params={"tensor": "w", "ggml_type": Q1_0})
    q = Node(2, Op.QUANTIZE, (0,), (m, k), "Q8_0", params={"type": Q8_0})
    mm = Node(3, Op.MUL_MAT, (1, 2), (m, n), "f32", name="mm", order=matmul_order(Q1_0, n, order_cols))
    return graph_of(x, w, q, mm), mm


def _check(out: np.ndarray, raw: np.ndarray, x: np.ndarray, order) -> None:
    ref = mul_mat(raw, Q1_0, quantize_activation(x, Q8_0), order)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


CASES = [(k, n) for k in (128, 2048, 6144) for n in (16, 37, 100)] + [(2048, 15), (256, 48)]


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("k,n", CASES, ids=[f"K{k}-N{n}" for k, n in CASES])
def test_q1_0_lookup_matvec_bits_equal_reference(k, n, nth):
    raw, x = _weights(n, k, k + n), _activation(1, k, 7 * k + n)
    g, mm = _nodes(k, 1, n)
    out = np.full((1, n), np.nan, np.float32)
    run_kernel(g, mm, out, [raw, to_bytes(quantize_activation(x, Q8_0))], nth)
    _check(out, raw, x, mm.order)


def test_q1_0_lookup_matvec_in_a_generic_kernel():
    """A column count known at run time: one column takes the lookup tiles, more take 1 x 8."""
    k, n, dim = 2048, 37, Dim("T", 1, 9)
    g, mm = _nodes(k, dim, n, order_cols=dim.hi)
    kernel = compile_kernel(g, mm)
    raw = _weights(n, k, 5)
    for m in range(1, 10):
        x = _activation(m, k, 100 + m)
        out = np.full((m, n), np.nan, np.float32)
        run_kernel(g, mm, out, [raw, to_bytes(quantize_activation(x, Q8_0))], 2, {"T": m}, kernel)
        _check(out, raw, x, mm.order)


def test_one_column_q1_0_kernel_uses_the_lookup_tiles():
    """The decode mat-vec is the lookup kernel (its transpose and table loops are in the IR)."""
    g, mm = _nodes(2048, 1, 4 * ROWS)
    m = ir.Module(name="t")
    text = str(registry.define(m, g, mm).module)
    assert '"lut.t' in text or "lut.t." in text
    assert "lut.bits" in text
