"""ggml-cpu's f32 vector loops (vec.cpp, vec.h) as the haswell binary runs them.

    vec_dot_f32(x, y)       ggml_vec_dot_f32 of each row of x with y
    gcc_sum(x, y, s)        `for i: s += x[i]*y[i]` as GCC 12 vectorized it (ggml_vec_dot_f32's
                            leftovers, ggml_compute_forward_ssm_conv_f32's d_conv loop)
"""
from __future__ import annotations

import numpy as np

from bankml.numerics.floats import fma

F32 = np.float32


def gcc_sum(x: np.ndarray, y: np.ndarray, s) -> np.ndarray:
    """s + x[:, i]*y[i] over the columns, in the order of GCC's vectorized loop (objdump): blocks
    of 8, then one of 4, of rounded products (vmulps) added one by one (vaddss), then the last
    (at most 3) as scalar FMAs (vfmadd231ss). x [rows, n], y [n] (or [rows, n]); s [rows]."""
    n = x.shape[1]
    s = np.asarray(s, F32)
    i = 0
    for _ in range(n // 8):
        p = (x[:, i:i + 8] * y[..., i:i + 8]).astype(F32)
        for k in range(8):
            s = (s + p[:, k]).astype(F32)
        i += 8
    if n - i >= 4:
        p = (x[:, i:i + 4] * y[..., i:i + 4]).astype(F32)
        for k in range(4):
            s = (s + p[:, k]).astype(F32)
        i += 4
    for k in range(i, n):
        s = fma(x[:, k], y[..., k], s)
    return np.asarray(s, F32)


def vec_dot_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 (ggml-cpu/vec.cpp, GGML_SIMD on AVX2) of each row of x with y, in the order
    of the haswell binary (objdump): four 8-lane FMA accumulators over steps of 32, reduced (0+2,
    1+3, then the two, the 128-bit halves, two hadds); the leftovers as GCC vectorized their loop:
    blocks of 8, then one of 4, of rounded products added one by one, then the last (at most 3)
    as scalar FMAs (gcc_sum)."""
    rows, n = x.shape
    full = n & ~31
    acc = np.zeros((rows, 4, 8), F32)
    for i in range(0, full, 32):
        acc = fma(x[:, i:i + 32].reshape(rows, 4, 8), y[i:i + 32].reshape(4, 8), acc)
    v = (acc[:, 0] + acc[:, 2]) + (acc[:, 1] + acc[:, 3])
    t0 = v[:, 4:] + v[:, :4]
    s = (t0[:, 0] + t0[:, 1]) + (t0[:, 2] + t0[:, 3])
    s = gcc_sum(x[:, full:], y[full:], s)
    return np.asarray(s, F32)
