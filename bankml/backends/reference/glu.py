"""SwiGLU, SiLU, sigmoid, softplus, GeGLU, scale and add in ggml's float order (GGML_MAP §7, §8).

ggml-cpu/vec.cpp:ggml_vec_swiglu_f32 (AVX2+FMA branch), per row of n = gate.shape[-1]:
    i < n - n%8 (8-lane chunks, ggml_v_silu): y = r( r(g / r(1 + ggml_v_expf(r(0 - g)))) * u )
    the n%8 tail (ggml_silu_f32):             y = r( r(g / r(1 + expf(-g))) * u )   # glibc expf
No FMA outside ggml_v_expf (checked: vaddps, vdivps, vmulps). gate is src0 of
ggml_swiglu_split and up is src1. ggml_vec_silu_f32 (ggml_silu) is the same without the `* u`.
ggml-cpu/unary-ops.cpp, one element at a time, glibc's expf and logf as the haswell build calls them:
    sigmoid: r(1 / r(1 + expf(-x)))          softplus: x > 20 ? x : logf(r(1 + expf(x)))
"""
from __future__ import annotations

import numpy as np

from bankml.backends.reference.lowerings import check_order
from bankml.ir.order import ELEMENTWISE, GEGLU, SCALE, SIGMOID, SILU, SOFTPLUS, SWIGLU, FloatOrder
from bankml.numerics import gelu
from bankml.numerics.expf import ggml_v_expf
from bankml.numerics.libm import expf, logf

f32 = np.float32


def swiglu(gate: np.ndarray, up: np.ndarray, order: FloatOrder = SWIGLU) -> np.ndarray:
    """silu(gate) * up over rows [..., n] (ggml_vec_swiglu_f32); f32, the shape of gate."""
    check_order(order, SWIGLU, "swiglu")
    return (_silu(np.asarray(gate, f32), order.lanes) * np.asarray(up, f32)).astype(f32)


def silu(x: np.ndarray, order: FloatOrder = SILU) -> np.ndarray:
    """x / (1 + expf(-x)) over rows [..., n] (ggml_vec_silu_f32); f32, x's shape."""
    check_order(order, SILU, "silu")
    return _silu(np.asarray(x, f32), order.lanes)


def _silu(g: np.ndarray, lanes: int) -> np.ndarray:
    """ggml_v_silu on each row's chunks of `lanes`, ggml_silu_f32 on the rest."""
    n = g.shape[-1]
    body = n - n % lanes
    e = np.empty_like(g)
    e[..., :body] = ggml_v_expf((f32(0) - g[..., :body]).astype(f32))     # _mm256_sub_ps(zero, x)
    e[..., body:] = expf(-g[..., body:])                                  # ggml_silu_f32: expf(-x)
    return (g / (f32(1) + e).astype(f32)).astype(f32)


def add(a: np.ndarray, b: np.ndarray, order: FloatOrder = ELEMENTWISE) -> np.ndarray:
    """r(a+b), b broadcast (binary-ops.cpp:apply_binary_op<op_add>)."""
    check_order(order, ELEMENTWISE, "add")
    return (np.asarray(a, f32) + np.asarray(b, f32)).astype(f32)


def geglu(gate: np.ndarray, up: np.ndarray, order: FloatOrder = GEGLU) -> np.ndarray:
    """gelu(gate) * up (ggml_vec_geglu_f32 with GGML_GELU_FP16, bankml/numerics/gelu.py): the gate rounded
    to f16 indexes ggml's GELU table; gates <= -10 give 0 and gates >= 10 give r(gate*up)."""
    check_order(order, GEGLU, "geglu")
    return gelu.geglu(gate, up)


def scale(x: np.ndarray, s: float, order: FloatOrder = SCALE) -> np.ndarray:
    """r(x*s) (ggml_vec_scale_f32)."""
    check_order(order, SCALE, "scale")
    return (np.asarray(x, f32) * f32(s)).astype(f32)


def sigmoid(x: np.ndarray, order: FloatOrder = SIGMOID) -> np.ndarray:
    """op_sigmoid over every element; f32, x's shape."""
    check_order(order, SIGMOID, "sigmoid")
    x = np.asarray(x, f32)
    return (f32(1) / (f32(1) + expf(-x)).astype(f32)).astype(f32)


def softplus(x: np.ndarray, order: FloatOrder = SOFTPLUS) -> np.ndarray:
    """op_softplus over every element; f32, x's shape."""
    check_order(order, SOFTPLUS, "softplus")
    x = np.asarray(x, f32)
    return np.where(x > f32(20), x, logf((f32(1) + expf(x)).astype(f32))).astype(f32)
