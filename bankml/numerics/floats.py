"""Float primitives with exact IEEE semantics, in numpy.

numpy has no fused multiply-add and no access to glibc's expf; these helpers give
both, bit for bit, so the reference backend can spell out ggml's float order.
"""
from __future__ import annotations

import numpy as np

f32, f64 = np.float32, np.float64

u32, u64 = np.uint32, np.uint64
_LOW29, _HALF29 = u64((1 << 29) - 1), u64(1 << 28)


def fma(a, b, c) -> np.ndarray:
    """f32 a*b+c rounded once, broadcasting; the hot loop of the reference kernels.

    a*b is exact in f64 and s = a*b + c rounds at most once there; rounding s to f32 again is
    wrong only when s sits exactly on an f32 midpoint (low 29 bits 1000...0) or the result is
    subnormal. Those few lanes are redone: the TwoSum error says which way the exact sum lies.
    The step to the exact side goes by the sign of err: nextafter(s, s + err) would not move,
    since s + err == s in f64.
    """
    shape = np.broadcast_shapes(np.shape(a), np.shape(b), np.shape(c))
    s = np.atleast_1d(np.multiply(a, b, dtype=f64))
    if s.shape == np.shape(c):
        s += c
    else:
        s = np.atleast_1d(s + c)
    r = s.astype(f32)
    odd = (s.view(u64) & _LOW29) == _HALF29
    odd |= ((r.view(u32) & u32(0x7F800000)) == 0) & (s != 0)       # subnormal (0 is exact)
    idx = np.flatnonzero(odd)
    if idx.size == 0:
        return r.reshape(shape)
    at = np.unravel_index(idx, s.shape)
    p = np.multiply(np.broadcast_to(a, s.shape)[at], np.broadcast_to(b, s.shape)[at], dtype=f64)
    cc = np.broadcast_to(np.asarray(c, f32), s.shape)[at].astype(f64)
    ss = s.reshape(-1)[idx]
    bp = ss - cc
    err = (p - bp) + (cc - (ss - bp))                                # exact p + c - ss (TwoSum)
    lo = ss.astype(f32)
    other = np.nextafter(lo, np.where(ss > lo, f32(np.inf), f32(-np.inf)))
    mid = (lo.astype(f64) + other.astype(f64)) * 0.5 == ss          # ss on an f32 midpoint
    toward = np.nextafter(ss, np.where(err > 0, np.inf, -np.inf))    # one f64 step to the exact side
    r.reshape(-1)[idx] = np.where(mid & (err != 0), toward, ss).astype(f32)
    return r.reshape(shape)


def f16(x) -> np.ndarray:
    """Round f32 to half (RNE, as F16C vcvtps2ph imm 0 and ggml_compute_fp32_to_fp16) and back."""
    return np.asarray(x, f32).astype(np.float16).astype(f32)


def hsum8(v: np.ndarray) -> np.ndarray:
    """hsum_float_8 over the last axis (8 lanes): ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))."""
    v = np.asarray(v, f32)
    a = v[..., 0:4] + v[..., 4:8]             # _mm256_extractf128 + add
    b = a[..., 0:2] + a[..., 2:4]             # movehl + add: (v0+v4)+(v2+v6), (v1+v5)+(v3+v7)
    return (b[..., 0] + b[..., 1]).astype(f32)


def f32x8_reduce(accs: list[np.ndarray]) -> np.ndarray:
    """GGML_F32x8_REDUCE of four 8-lane accumulators: ((a0+a2)+(a1+a3)) lanewise, halves, two hadds."""
    s = (accs[0] + accs[2]) + (accs[1] + accs[3])
    t = s[..., 0:4] + s[..., 4:8]
    return ((t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])).astype(f32)


def inv_sqrtf(n) -> float:
    """C's 1.0f/sqrtf(float(n)): an f32 sqrt, then an f32 division (llama.cpp's kq_scale). For 242
    of the sizes 1..1024, head sizes 96 and 112 among them, this is not 1/math.sqrt(n) rounded to f32."""
    return float(f32(1) / np.sqrt(f32(n)))
