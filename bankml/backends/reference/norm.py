"""rms_norm and the elementwise mul that applies its weight, in ggml's float order (GGML_MAP §2, §8).

ggml-cpu/ops.cpp:ggml_compute_forward_rms_norm_f32, per row:
    sum   = 0.0 (double); for i: sum += (double) r(x[i]*x[i])     # sequential, no FMA
    mean  = (float)(sum / K)
    scale = r(1.0f / sqrtf(r(mean + eps)))
    y     = r(x * scale)                                           # ggml_vec_scale_f32
The fused RMS_NORM+MUL path computes r(r(x*scale)*w): the same bits as rms_norm, then mul.
"""
from __future__ import annotations

import numpy as np

from bankml.backends.reference.lowerings import check_order
from bankml.ir.order import ELEMENTWISE, RMS_NORM, FloatOrder

f32, f64 = np.float32, np.float64


def rms_norm(x: np.ndarray, eps: float, order: FloatOrder = RMS_NORM) -> np.ndarray:
    """Normalise each row of x [..., K] (ggml_compute_forward_rms_norm_f32); f32 out, same shape."""
    check_order(order, RMS_NORM, "rms_norm")
    x = np.asarray(x, f32)
    k = x.shape[-1]
    sq = (x * x).astype(f64)                       # r(x*x) in f32, then widened exactly
    total = np.cumsum(sq, axis=-1)[..., -1:]       # a strictly sequential f64 sum (np.sum is pairwise)
    mean = (total / f64(k)).astype(f32)            # sum/ne00 in double, then (float)
    scale = (f32(1.0) / np.sqrt((mean + f32(eps)).astype(f32))).astype(f32)
    return (x * scale).astype(f32)


def mul(x: np.ndarray, w: np.ndarray, order: FloatOrder = ELEMENTWISE) -> np.ndarray:
    """r(x*w) with w broadcast over rows (binary-ops.cpp:apply_binary_op<op_mul>)."""
    check_order(order, ELEMENTWISE, "mul")
    return (np.asarray(x, f32) * np.asarray(w, f32)).astype(f32)
