"""Float primitives with exact IEEE semantics, in numpy.

numpy has no fused multiply-add and no access to glibc's expf; these helpers give
both, bit for bit, so the reference backend can spell out ggml's float order.
"""
from __future__ import annotations

import numpy as np

f32, f64 = np.float32, np.float64

_LOW29 = np.uint64((1 << 29) - 1)
_HALF29 = np.uint64(1 << 28)
_TINY = 2.0 ** -125  # below this an f32 result may be subnormal: use the general midpoint test


def fma(a, b, c) -> np.ndarray:
    """f32 a*b+c rounded once (what vfmadd computes), elementwise with broadcasting.

    a*b is exact in f64 (24+24 bits); the f64 sum can round, and rounding that to f32
    again errs only when the f64 sum sits exactly on an f32 midpoint. There the exact
    remainder (TwoSum) decides the direction.
    """
    p = np.multiply(np.asarray(a, f32), np.asarray(b, f32), dtype=f64)
    c64 = np.asarray(c, f32).astype(f64)
    s = p + c64
    r = s.astype(f32)
    bits = np.abs(s).view(np.uint64)
    suspect = ((bits & _LOW29) == _HALF29) | (np.abs(s) < _TINY)
    if suspect.any():
        r = np.array(r, copy=True)
        idx = np.nonzero(suspect)
        ps, cs, ss = p[idx], np.broadcast_to(c64, s.shape)[idx], s[idx]
        bp = ss - cs
        err = (ps - bp) + (cs - (ss - bp))
        lo = ss.astype(f32)
        other = np.nextafter(lo, np.where(ss > lo.astype(f64), f32(np.inf), f32(-np.inf)))
        mid = (lo.astype(f64) + other.astype(f64)) * 0.5 == ss
        fix = mid & (err != 0) & (ss != lo.astype(f64))
        nudged = np.nextafter(ss, ss + err).astype(f32)
        r[idx] = np.where(fix, nudged, lo)
    return r


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
