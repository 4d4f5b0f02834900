"""hsum8_x8 (the eight hsum8 of a 1x8 quantized tile as vector adds, backends/llvm/ggml/matmul/tiling.py) and
hsums (groups of eight, a short last group padded) equal hsum8 of each vector and ggml's
hsum_float_8 order, bit for bit: random f32 of many magnitudes
(so that any other order of the adds would round differently), signed zeros and infinities."""
from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import f32, i64, new_function
from bankml.backends.llvm.emit.simd import hsum8, hsum8_x8, hsums

V8 = ir.VectorType(f32, 8)


def _compiled():
    """f(in: f32[64], out: f32[16]): out[0:8] = hsum8_x8 of the eight rows of in, out[8:16] =
    hsum8 of each row; hsums of 4 rows (one padded group) into out[16:20], of 12 (a full group,
    then a padded one: the F16 4x3 tile) into out[20:32], of 2 (scalar) into out[32:34]."""
    m = ir.Module(name="hsum")
    ptr = f32.as_pointer()
    fn, b = new_function(m, "f", ir.FunctionType(ir.VoidType(), [ptr, ptr]))
    x, out = fn.args
    vs = [b.load(b.bitcast(b.gep(x, [i64(8 * c)]), V8.as_pointer()), align=4) for c in range(8)]
    b.store(hsum8_x8(b, vs), b.bitcast(out, V8.as_pointer()), align=4)
    for c in range(8):
        b.store(hsum8(b, vs[c]), b.gep(out, [i64(8 + c)]))
    for first, group in ((16, vs[:4]), (20, vs + vs[:4]), (32, vs[:2])):
        for c, h in enumerate(hsums(b, group)):
            b.store(h, b.gep(out, [i64(first + c)]))
    b.ret_void()
    eng = jit.compile_module(m)
    return eng, ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(eng.get_function_address("f"))


def _ggml_hsum8(v: np.ndarray) -> np.float32:
    """hsum_float_8 in f32: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))."""
    a, b_, c, d = v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]
    return (a + c) + (b_ + d)


def test_hsum8_x8_bits_equal_hsum8():
    eng, f = _compiled()
    rng = np.random.default_rng(7)
    for trial in range(300):
        x = (rng.standard_normal(64) * np.exp2(rng.integers(-30, 30, 64))).astype(np.float32)
        if trial % 10 == 0:
            x[rng.integers(0, 64, 6)] = np.float32(-0.0)
        if trial % 25 == 0:
            x[rng.integers(0, 64, 2)] = np.float32(np.inf)
        out = np.zeros(34, np.float32)
        f(x.ctypes.data, out.ctypes.data)
        want = np.array([_ggml_hsum8(x[8 * c:8 * c + 8]) for c in range(8)], np.float32)
        assert np.array_equal(out[:8].view(np.uint32), want.view(np.uint32)), trial
        assert np.array_equal(out[8:16].view(np.uint32), want.view(np.uint32)), trial
        assert np.array_equal(out[16:20].view(np.uint32), want[:4].view(np.uint32)), trial
        assert np.array_equal(out[20:32].view(np.uint32), np.concatenate([want, want[:4]]).view(np.uint32)), trial
        assert np.array_equal(out[32:34].view(np.uint32), want[:2].view(np.uint32)), trial
    del eng
