"""llvm RMS_NORM kernel against the reference backend, bit for bit, for every thread split."""
from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm import ggml  # noqa: F401  (registers every kernel)
from bankml.backends.llvm.jit import call_kernel, compile_module
from bankml.backends.llvm.registry import define, kernel_name
from bankml.backends.reference import norm
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import ELEMENTWISE, RMS_NORM

EPS = 9.999999974752427e-07


def _node(shape, order=RMS_NORM):
    g = Graph()
    g.add(Node(0, Op.INPUT, (), shape, "f32"))
    return g, g.add(Node(1, Op.RMS_NORM, (0,), shape, "f32", "norm-0", order, {"eps": EPS}))


def _engine(g, n):
    m = ir.Module()
    define(m, g, n)
    return compile_module(m)


@pytest.mark.parametrize("shape", [(7, 576), (3, 2048), (1, 576), (5, 4, 128), (2, 9, 64), (35, 576), (16, 2048),
                                   (19, 12)], ids=str)
def test_rms_norm_bits_equal_reference_for_any_nth(shape):
    """Eight-row groups (K % 8 == 0) and the rows left over, and the one-row path (K = 12), with
    magnitudes from 1e-6 to 1e6 in a row."""
    g, n = _node(shape)
    eng = _engine(g, n)
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.choice([1e-6, 0.01, 1, 30, 1e6], size=shape)).astype(np.float32)
    want = norm.rms_norm(x.reshape(-1, shape[-1]), EPS).reshape(shape)
    for nth in (1, 2, 3):
        out = np.full(shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [x], ith, nth)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), f"nth={nth}"


def test_rms_norm_refuses_other_order():
    g, n = _node((2, 64), ELEMENTWISE)
    with pytest.raises(LoweringError):
        define(ir.Module(), g, n)
