"""Q2_0 weights: blocks of 64 two-bit codes with one f16 scale (block_q2_0, 18 bytes).

Element j is bits 2*(j%4) of qs[j/4]; codes 0..3 mean -1, 0, +1, +2 times d.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 64, 18
DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Values q-1 [rows, n] (-1..2 as int8) and scales d [rows, n/64] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    qs = b["qs"][..., None]
    codes = (qs >> np.array([0, 2, 4, 6], np.uint8)) & 3             # [rows, nb, 16, 4]
    q = codes.astype(np.int8).reshape(len(raw), n) - 1
    return Unpacked(q=q, d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q2_0: y = r((float)(q-1)*d); 0*d keeps d's sign as ggml does."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None]).reshape(len(raw), n)
