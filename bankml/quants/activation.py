"""Activation quantization exactly as ggml-cpu's AVX2 from_float (arch/x86/quants.c).

quantize_row_q8_0 / quantize_row_q8_1, per block of 32 (not the *_ref versions):
    amax = max|x|;  d = r(amax / 127.f);  block.d = f16(d)
    id = amax != 0 ? r(127.f / amax) : 0
    q = cvtps_epi32(round_ps(r(x * id), _MM_ROUND_NEAREST))   ties to even
        then packs_epi32 / packs_epi16: saturate to int16, then int8
    q8_1 only: block.s = f16(r(d * (float)hsum_i32_8(q)))     the unrounded f32 d, int32 sum
cvtps_epi32 turns NaN and out-of-range values into INT32_MIN (-> -128 after the packs);
that only happens for non-finite input or a subnormal amax (id = inf).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

QK = 32
Q8_0_DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
Q8_1_DTYPE = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK,))])
_INT_MIN = np.int64(-(2 ** 31))


class Q8Act(NamedTuple):
    """Quantized activations: q int8 [M, K]; d (and s for q8_1) f32 [M, K/32], already f16-rounded."""
    q: np.ndarray
    d: np.ndarray
    s: np.ndarray | None = None


def _quantize(x: np.ndarray, with_sum: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    x = np.ascontiguousarray(x, np.float32)
    M, K = x.shape
    if K % QK:
        raise ValueError(f"activation row of {K} values is not a multiple of {QK}")
    xb = x.reshape(M, K // QK, QK)
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), np.float32(0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.rint(xb * idv[..., None])                       # np.rint rounds half to even
        ok = np.abs(v) < 2.0 ** 31                              # False for NaN and out of range
        i32 = np.where(ok, v, 0).astype(np.int64)
    i32 = np.where(ok, i32, _INT_MIN)
    q = np.clip(i32, -128, 127).astype(np.int8)                 # the two saturating packs
    s = None
    if with_sum:
        tot = i32.sum(axis=-1)
        tot = ((tot + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)   # int32 wraparound of the adds
        with np.errstate(over="ignore"):                       # f16 overflow gives inf, as F16C does
            s = (d * tot.astype(np.float32)).astype(np.float16)
    with np.errstate(over="ignore"):
        return q.reshape(M, K), d.astype(np.float16), s


def quantize_q8_0(x: np.ndarray) -> Q8Act:
    """x f32 [M, K] -> q8_0 activations (quantize_row_q8_0, AVX2 path)."""
    q, d16, _ = _quantize(x, with_sum=False)
    return Q8Act(q=q, d=d16.astype(np.float32))


def quantize_q8_1(x: np.ndarray) -> Q8Act:
    """x f32 [M, K] -> q8_1 activations (quantize_row_q8_1, AVX2 path)."""
    q, d16, s16 = _quantize(x, with_sum=True)
    return Q8Act(q=q, d=d16.astype(np.float32), s=s16.astype(np.float32))


def to_bytes(act: Q8Act) -> np.ndarray:
    """The ggml block bytes [M, row_bytes] of quantized activations (q8_1 when act.s is set)."""
    M, K = act.q.shape
    dt = Q8_0_DTYPE if act.s is None else Q8_1_DTYPE
    out = np.zeros((M, K // QK), dt)
    out["d"] = act.d.astype(np.float16)
    if act.s is not None:
        out["s"] = act.s.astype(np.float16)
    out["qs"] = act.q.reshape(M, K // QK, QK)
    return out.view(np.uint8).reshape(M, -1)
