"""Q4_1 weights: blocks of 32 nibbles with f16 scale d and min m (block_q4_1, 20 bytes).

Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 32, 20
DTYPE = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Nibbles [rows, n] (0..15 as int8), d and m [rows, n/32] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    qs = b["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8)
    return Unpacked(q=q.reshape(len(raw), n), d=b["d"].astype(np.float32), m=b["m"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q4_1: y = r(r(q*d) + m), two roundings (ggml-base has no FMA)."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None] + u.m[:, :, None]).reshape(len(raw), n)
