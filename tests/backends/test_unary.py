"""SILU, SIGMOID and SOFTPLUS (issue 27: Qwen3.5's gates): the reference backend against ggml-cpu of
the oracle build (ggml_silu / ggml_sigmoid / ggml_softplus computed through libggml), and the llvm kernels
against the reference for every thread split, bit for bit, over realistic values and the edges
(softplus's cut at 20, expf's overflow and underflow, ggml_v_expf's branch past 126/ln2, +-0,
+-inf, NaN, denormals); rows whose width leaves silu's glibc tail."""
from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm.jit import call_kernel, compile_module
from bankml.backends.llvm.registry import define, kernel_name
from bankml.backends.reference import glu
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import SIGMOID, SILU, SOFTPLUS
from bankml.oracle.ggml import TYPE_F32, Context

OPS = {"silu": (Op.SILU, SILU, glu.silu), "sigmoid": (Op.SIGMOID, SIGMOID, glu.sigmoid),
       "softplus": (Op.SOFTPLUS, SOFTPLUS, glu.softplus)}
EDGES = np.array([0.0, -0.0, 20.0, np.nextafter(np.float32(20), np.float32(21)), 19.999998, -20.0, 88.0, 88.8,
                  89.0, -88.0, -103.0, -104.0, -150.0, 150.0, 1e-40, -1e-40, 1e-8, -1e-8, np.inf, -np.inf, np.nan],
                 np.float32)


def _values(shape, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([0.1, 1, 4, 30], size=shape)).astype(np.float32)
    flat = x.reshape(-1)
    flat[:min(EDGES.size, flat.size)] = EDGES[:flat.size]
    return x


def _ggml(name: str, x: np.ndarray) -> np.ndarray:
    ctx = Context(64 << 20)
    t = ctx.tensor(TYPE_F32, tuple(reversed(x.shape)), np.ascontiguousarray(x))
    return ctx.compute(ctx.op(f"ggml_{name}", t), threads=2, shape=x.shape)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.oracle
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape", [(3, 1000), (1, 16), (8, 64)], ids=str)
def test_reference_equals_ggml(name, shape):
    x = _values(shape, shape[-1])
    assert np.array_equal(_bits(OPS[name][2](x)), _bits(_ggml(name, x)))


def test_softplus_cut_and_edges():
    x = np.array([20.0, 20.000002, 100.0, -100.0, np.inf, -np.inf], np.float32)
    y = glu.softplus(x)
    assert y[1] == x[1] and y[2] == 100.0 and y[4] == np.inf       # past 20: x itself
    assert y[3] == 0.0 and y[5] == 0.0                               # logf(1 + 0)
    assert glu.softplus(np.float32([0.0]))[0] == np.float32(np.log(2.0))
    assert np.isnan(glu.softplus(np.array([np.nan], np.float32)))[0]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape", [(5, 1003), (1, 7), (2, 256)], ids=str)
def test_llvm_equals_reference_for_any_nth(name, shape):
    op, order, ref = OPS[name]
    g = Graph()
    g.add(Node(0, Op.INPUT, (), shape, "f32"))
    n = g.add(Node(1, op, (0,), shape, "f32", None, order))
    m = ir.Module()
    define(m, g, n)
    eng = compile_module(m)
    x = _values(shape, 7 + shape[-1])
    want = ref(x)
    for nth in (1, 2, 3):
        out = np.full(shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [x], ith, nth)
        assert np.array_equal(_bits(out), _bits(want)), f"nth={nth}"


# ---- ADD with src1 broadcast over rows (Qwen3.5's alpha + ssm_dt.bias) ----

@pytest.mark.oracle
@pytest.mark.parametrize("shape", [(1, 16), (7, 8), (3, 1003)], ids=str)
def test_add_broadcast_reference_equals_ggml_and_llvm(shape):
    from bankml.backends.reference.glu import add
    from bankml.ir.order import ELEMENTWISE
    rng = np.random.default_rng(shape[0])
    a, c = _values(shape, 3), rng.standard_normal(shape[-1:]).astype(np.float32)
    want = add(a, c)
    ctx = Context(64 << 20)
    ta = ctx.tensor(TYPE_F32, tuple(reversed(shape)), np.ascontiguousarray(a))
    tc = ctx.tensor(TYPE_F32, (shape[-1],), c)
    assert np.array_equal(_bits(want), _bits(ctx.compute(ctx.op("ggml_add", ta, tc), threads=2, shape=shape)))
    g = Graph()
    g.add(Node(0, Op.INPUT, (), shape, "f32"))
    g.add(Node(1, Op.INPUT, (), shape[-1:], "f32"))
    n = g.add(Node(2, Op.ADD, (0, 1), shape, "f32", None, ELEMENTWISE))
    m = ir.Module()
    define(m, g, n).linkage = "external"          # rows.py's kernels are internal until a graph's glue calls them
    eng = compile_module(m)
    for nth in (1, 2, 3):
        out = np.full(shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [a, c], ith, nth)
        assert np.array_equal(_bits(out), _bits(want)), f"nth={nth}"


# ---- SLICE: columns of each row, copied (a ggml_view_* of each row's part) ----

@pytest.mark.parametrize("shape,lo,hi", [((3, 1, 12), 0, 4), ((5, 320), 128, 320), ((2, 4, 512), 256, 512)], ids=str)
def test_slice_llvm_equals_numpy(shape, lo, hi):
    x = _values(shape, 5)
    g = Graph()
    g.add(Node(0, Op.INPUT, (), shape, "f32"))
    n = g.add(Node(1, Op.SLICE, (0,), (*shape[:-1], hi - lo), "f32", None, None, {"lo": lo, "hi": hi}))
    m = ir.Module()
    define(m, g, n).linkage = "external"
    eng = compile_module(m)
    for nth in (1, 2, 3):
        out = np.full(n.shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [x], ith, nth)
        assert np.array_equal(_bits(out), _bits(x[..., lo:hi])), f"nth={nth}"
