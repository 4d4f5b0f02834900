"""Q1_0 weights: blocks of 128 sign bits with one f16 scale (block_q1_0, 18 bytes).

Element j is bit j%8 of qs[j/8]: set means +d, clear means -d.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 128, 18
DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Signs [rows, n] (+1/-1 as int8) and scales d [rows, n/128] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    bits = np.unpackbits(b["qs"], axis=-1, bitorder="little")      # bit j%8 of byte j/8
    q = (bits.astype(np.int8) * 2 - 1).reshape(len(raw), n)
    return Unpacked(q=q, d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q1_0: y = bit ? d : -d."""
    u = unpack(raw, n)
    d = np.repeat(u.d, BLOCK, axis=1)
    return np.where(u.q > 0, d, -d)
