"""Q5_1 weights: blocks of 32 five-bit codes with f16 scale d and min m (block_q5_1, 24 bytes).

d, m (f16), qh (4 bytes: bit j is the fifth bit of element j), qs (16 bytes: element j < 16
is the low nibble of qs[j], element j + 16 its high nibble). The value is code * d + m.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks
from bankml.quants.q5_0 import codes

BLOCK, BLOCK_BYTES = 32, 24
DTYPE = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Codes [rows, n] (0..31 as int8), d and m [rows, n/32] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    q = codes(b).astype(np.int8)
    return Unpacked(q=q.reshape(len(raw), n), d=b["d"].astype(np.float32), m=b["m"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q5_1: y = r(r(code*d) + m), two roundings (ggml-base has no FMA)."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None] + u.m[:, :, None]).reshape(len(raw), n)
