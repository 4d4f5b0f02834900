"""Q5_0 weights: blocks of 32 five-bit codes with one f16 scale (block_q5_0, 22 bytes).

d (f16), qh (4 bytes: bit j is the fifth bit of element j), qs (16 bytes): element j < 16 is
the low nibble of qs[j], element j + 16 its high nibble. The value is (code - 16) * d.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 32, 22
DTYPE = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])


def codes(b: np.ndarray) -> np.ndarray:
    """The 5-bit codes [rows, nb, 32] (0..31, uint8) of blocks with fields qh and qs."""
    qs = b["qs"]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    high = (b["qh"][..., None] >> np.arange(32, dtype=np.uint32)) & 1
    return low | (high.astype(np.uint8) << 4)


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Values code - 16 [rows, n] (-16..15 as int8) and scales d [rows, n/32] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    q = codes(b).astype(np.int8) - 16
    return Unpacked(q=q.reshape(len(raw), n), d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q5_0: y = r((float)(code - 16) * d)."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None]).reshape(len(raw), n)
