"""llvm SWIGLU (ggml_v_expf in IR, glibc expf tail), GEGLU and SCALE kernels against the reference, bit for bit."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm.emit import expf
from bankml.backends.llvm.emit.core import for_range, i8, i64, new_function, typed, v8f32
from bankml.backends.llvm.jit import call_kernel, compile_module
from bankml.backends.llvm.registry import define, kernel_name
from bankml.backends.reference.glu import geglu, scale, swiglu
from bankml.numerics.expf import ggml_v_expf
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import GEGLU, SCALE, SWIGLU



def _assert_bits_for_any_nth(eng, name, ins, want, nths):
    """Every thread split of the kernel writes want's bits."""
    for nth in nths:
        out = np.full(want.shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, name, out, ins, ith, nth)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), f"nth={nth}"


def _engine(shape):
    g = Graph()
    g.add(Node(0, Op.INPUT, (), shape, "f32"))
    g.add(Node(1, Op.INPUT, (), shape, "f32"))
    n = g.add(Node(2, Op.SWIGLU, (0, 1), shape, "f32", "ffn_swiglu-0", SWIGLU))
    m = ir.Module()
    define(m, g, n)
    return compile_module(m), kernel_name(n)


def _gate(rng, shape):
    """Realistic gates plus the v_expf edge cases: |x| past 126/ln2 and 192/ln2, +-0, +-inf."""
    g = (rng.standard_normal(shape) * rng.choice([0.5, 3, 20], size=shape)).astype(np.float32)
    flat = g.reshape(-1)
    edge = np.array([0.0, -0.0, 88.0, -88.0, 90.0, -90.0, 104.0, -104.0, 140.0, -140.0, np.inf, -np.inf],
                    np.float32)
    flat[:min(edge.size, flat.size)] = edge[:flat.size]
    return g


@pytest.mark.parametrize("shape", [(7, 1536), (1, 6144), (3, 1003), (4, 13), (2, 5)], ids=str)
def test_swiglu_bits_equal_reference_for_any_nth(shape):
    eng, name = _engine(shape)
    rng = np.random.default_rng(shape[-1])
    gate, up = _gate(rng, shape), rng.standard_normal(shape).astype(np.float32)
    want = swiglu(gate, up)
    _assert_bits_for_any_nth(eng, name, [gate, up], want, (1, 2, 3))


def test_v_expf_bits_equal_numpy_ggml_v_expf():
    """silu (up = 1) over a dense sweep that crosses v_expf's scaled paths (|n| > 126, > 192)."""
    x = np.concatenate([np.linspace(-200, 200, 40001, dtype=np.float32),
                        np.array([-87.3, -87.4, -103.9, -104.0, 88.7, 88.8, 126.5, -126.5], np.float32)])
    x = x[: x.size - x.size % 8].reshape(1, -1)
    eng, name = _engine(x.shape)
    out = np.empty_like(x)
    call_kernel(eng, name, out, [x, np.ones_like(x)], 0, 1)
    want = (x / (np.float32(1) + ggml_v_expf((np.float32(0) - x).astype(np.float32)))).astype(np.float32)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_v_expf_paths_bits_equal_numpy_ggml_v_expf():
    """v_expf_branch over a sweep of every path, vectors that mix paths, -inf and +inf. (Not
    NaN: the machine keeps a NaN's sign through vfnmadd, numpy's `-n` flips it.)"""
    x = np.concatenate([np.linspace(-300, 300, 60001, dtype=np.float32),
                        np.array([-np.inf, np.inf, -0.0, 0.0, -87.3, -103.9, -133.1, 88.8, 133.1,
                                  -126.5 / 1.4427, -192.5 / 1.4427, 1e-30, -1e-30, 3.0, -3.0], np.float32)])
    x = np.random.default_rng(5).permutation(x)                 # paths mixed inside vectors
    x = x[: x.size - x.size % 8]
    m = ir.Module()
    fn, b = new_function(m, "expf8", ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i8.as_pointer(), i64]))
    out, xp, count = fn.args
    po, px = typed(b, out, v8f32), typed(b, xp, v8f32)
    with for_range(b, 0, count, name="v") as v:
        b.store(expf.v_expf_branch(b, b.load(b.gep(px, [v]), align=4)), b.gep(po, [v]), align=4)
    b.ret_void()
    eng = compile_module(m)
    out = np.empty_like(x)
    expf8 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(eng.get_function_address("expf8"))
    expf8(out.ctypes.data, x.ctypes.data, x.size // 8)
    assert np.array_equal(out.view(np.uint32), ggml_v_expf(x).view(np.uint32))


def _one_node(op, order, shape, n_in, **params):
    g = Graph()
    for i in range(n_in):
        g.add(Node(i, Op.INPUT, (), shape, "f32"))
    n = g.add(Node(n_in, op, tuple(range(n_in)), shape, "f32", None, order, params))
    m = ir.Module()
    define(m, g, n)
    return compile_module(m), kernel_name(n)


@pytest.mark.parametrize("shape", [(7, 2048), (1, 512), (3, 13)], ids=str)
def test_geglu_bits_equal_reference_for_any_nth(shape):
    """Gates over the whole f16 table, the +-10 cut-offs (both sides), +-0 and +-inf."""
    eng, name = _one_node(Op.GEGLU, GEGLU, shape, 2)
    rng = np.random.default_rng(shape[-1])
    gate = (rng.standard_normal(shape) * rng.choice([0.5, 4, 12], size=shape)).astype(np.float32)
    edge = np.array([10.0, -10.0, 9.999, -9.999, 10.001, -10.001, 0.0, -0.0, np.inf, -np.inf, 65520.0], np.float32)
    gate.reshape(-1)[:min(edge.size, gate.size)] = edge[:gate.size]
    up = rng.standard_normal(shape).astype(np.float32)
    want = geglu(gate, up)
    _assert_bits_for_any_nth(eng, name, [gate, up], want, (1, 2, 3))


def test_scale_bits_equal_reference_for_any_nth():
    shape = (5, 2, 256)
    eng, name = _one_node(Op.SCALE, SCALE, shape, 1, scale=0.0625)
    x = (np.random.default_rng(3).standard_normal(shape) * 1e3).astype(np.float32)
    want = scale(x, 0.0625)
    _assert_bits_for_any_nth(eng, name, [x], want, (1, 3))
