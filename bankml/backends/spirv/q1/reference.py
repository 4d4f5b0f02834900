"""ggml_vec_dot_q1_0_q8_0 (AVX2 order) for every row, in numpy: the CPU side of the device oracle.

Written independently of the GPU kernel's trick: the one fma that needs it, fma(d_w, blk, acc),
is computed in f64 (the product of an 11-bit and a 24-bit significand is exact in f64), with the
f64 -> f32 double rounding repaired (TwoSum error decides an f64 result sitting exactly on an f32
midpoint). Tests compare it with ggml's own vec_dot.
"""
from __future__ import annotations

import numpy as np

Q1_BYTES, Q8_BYTES = 18, 34


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN_f32(a*b + c) for f32 arrays whose product is exact in f64 and whose result is normal."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)                    # TwoSum: s + e == p + c exactly
    sb = s.view(np.uint64)
    tie = ((sb & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)) & (e != 0)
    toward = np.where((s > 0) == (e > 0), np.uint64(1), np.uint64(0xFFFFFFFFFFFFFFFF))
    s = np.where(tie, (sb + toward).view(np.float64), s)  # off the midpoint, toward the exact value
    return s.astype(np.float32)


def hsum8(v: np.ndarray) -> np.ndarray:
    """hsum_float_8 (ggml-cpu/arch/x86/quants.c): ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))."""
    t = v[..., :4] + v[..., 4:]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def q1_matvec(w_raw: bytes, rows: int, k: int, act_raw: bytes) -> np.ndarray:
    """y[r] = ggml_vec_dot_q1_0_q8_0(k, w row r, act) as np.float32[rows]."""
    nb = k // 128
    W = np.frombuffer(w_raw, np.uint8).reshape(rows, nb, Q1_BYTES)
    A = np.frombuffer(act_raw, np.uint8).reshape(nb * 4, Q8_BYTES)
    dw = _f16(W[:, :, 0:2])                                        # [rows, nb]
    bits = np.unpackbits(W[:, :, 2:], axis=-1, bitorder="little")  # [rows, nb, 128]
    dy = _f16(A[:, 0:2]).reshape(nb, 4)                            # [nb, K]
    q = A[:, 2:].view(np.int8).reshape(nb, 128)
    sy = np.where(bits.astype(bool), q, -q)                        # int8: -(-128) wraps, as vpsubb
    s = sy.astype(np.int32).reshape(rows, nb, 4, 8, 4).sum(-1)     # [rows, nb, K, lane]
    sf = s.astype(np.float32)
    blk = dy[None, :, 0, None] * sf[:, :, 0]                       # exact products: one rounding each
    for K in range(1, 4):
        blk = blk + dy[None, :, K, None] * sf[:, :, K]             # == fma(dy, s, blk)
    acc = np.zeros((rows, 8), np.float32)
    for ib in range(nb):
        acc = fma_f32(np.broadcast_to(dw[:, ib, None], acc.shape), blk[:, ib], acc)
    return hsum8(acc)
