"""ggml's vectorised expf, `ggml_v_expf(__m256)` (ggml-cpu/vec.h, the AVX2+FMA branch), in numpy.

ggml uses it for the 8-lane chunks of silu/swiglu and for the tiled flash-attention
probabilities (GGML_MAP §7). It is not glibc's expf: its bits differ in the last place.
Every `_mm256_fmadd_ps`/`_mm256_fnmadd_ps` is one `fma` here, every `_mm256_mul_ps`/`sub_ps`
one f32 operation, and the integer steps work on the f32 bit patterns as uint32 (wrapping,
like `_mm256_slli_epi32`/`_mm256_add_epi32`). Lanes are independent, so any array shape works.
"""
from __future__ import annotations

import numpy as np

from bankml.numerics.floats import fma

f32, u32 = np.float32, np.uint32


def _c(hexfloat: str) -> np.float32:
    return f32(float.fromhex(hexfloat))


_R = _c("0x1.8p23")          # round-to-integer shifter
_LOG2E = _c("0x1.715476p+0")
_LN2_HI = _c("0x1.62e4p-1")
_LN2_LO = _c("0x1.7f7d1cp-20")
_P0 = _c("0x1.0e4020p-7")
_P1 = _c("0x1.573e2ep-5")
_P2 = _c("0x1.555e66p-3")
_P3 = _c("0x1.fffdb6p-2")
_P4 = _c("0x1.ffffecp-1")
_ONE_BITS = u32(0x3F800000)


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(u32)


def _float(b: np.ndarray) -> np.ndarray:
    return b.astype(u32, copy=False).view(f32)


def ggml_v_expf(x) -> np.ndarray:
    """exp(x) as ggml_v_expf computes it, lane by lane, exactly (incl. overflow to inf and -inf -> 0)."""
    x = np.asarray(x, f32)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        z = fma(x, _LOG2E, _R)                                   # _mm256_fmadd_ps(x, log2e, r)
        n = (z - _R).astype(f32)                                 # _mm256_sub_ps(z, r)
        b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))                # fnmadd(n, lo, fnmadd(n, hi, x))
        e = _bits(z) << u32(23)                                  # _mm256_slli_epi32(z, 23)
        k = _float(e + _ONE_BITS)                                # 2^n as bits
        c = np.abs(n) > f32(126)                                 # lanes needing the scaled path
        u = (b * b).astype(f32)
        j = fma(fma(fma(_P0, b, _P1), u, fma(_P2, b, _P3)), u, (_P4 * b).astype(f32))
        y = fma(j, k, k)                                         # the common path: k + k*j
        if not c.any():
            return y
        g = np.where(n <= f32(0), u32(0x82000000), u32(0))       # _CMP_LE_OQ: false for NaN
        s1 = _float(g + u32(0x7F000000))
        s2 = _float(e - g)
        d = np.abs(n) > f32(192)
        big = (fma(s2, j, s2) * s1).astype(f32)                  # mul(fmadd(s2, j, s2), s1)
        huge = (s1 * s1).astype(f32)                             # overflow to inf, or underflow to 0
        return np.where(d, huge, np.where(c, big, y)).astype(f32)
