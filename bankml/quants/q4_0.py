"""Q4_0 weights: blocks of 32 nibbles with one f16 scale (block_q4_0, 18 bytes).

Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the value is
(nibble - 8) * d.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 32, 18
DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Values nibble - 8 [rows, n] (-8..7 as int8) and scales d [rows, n/32] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    qs = b["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8
    return Unpacked(q=q.reshape(len(raw), n), d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q4_0: y = r((float)(nibble - 8) * d)."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None]).reshape(len(raw), n)
