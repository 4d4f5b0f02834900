"""ggml's one-input activations (ggml-cpu/unary-ops.cpp), element by element as the haswell
build runs them: glibc's expf and logf (bankml/numerics/libm.py), each + and / rounded to f32.

    sigmoid: r(1 / r(1 + expf(-x)))
    softplus: x > 20 ? x : logf(r(1 + expf(x)))
"""
from __future__ import annotations

import numpy as np

from bankml.errors import LoweringError
from bankml.ir.order import SIGMOID, SOFTPLUS, FloatOrder
from bankml.numerics.libm import expf, logf

f32 = np.float32


def _check(order: FloatOrder, want: FloatOrder, op: str) -> None:
    if order != want:
        raise LoweringError(f"reference backend: {op} lowers only {want.describe()!r}, not {order.describe()!r}")


def sigmoid(x: np.ndarray, order: FloatOrder = SIGMOID) -> np.ndarray:
    """op_sigmoid over every element; f32, x's shape."""
    _check(order, SIGMOID, "sigmoid")
    x = np.asarray(x, f32)
    return (f32(1) / (f32(1) + expf(-x)).astype(f32)).astype(f32)


def softplus(x: np.ndarray, order: FloatOrder = SOFTPLUS) -> np.ndarray:
    """op_softplus over every element; f32, x's shape."""
    _check(order, SOFTPLUS, "softplus")
    x = np.asarray(x, f32)
    return np.where(x > f32(20), x, logf((f32(1) + expf(x)).astype(f32))).astype(f32)
