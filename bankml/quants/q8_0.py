"""Q8_0 weights: blocks of 32 int8 with one f16 scale (ggml-common.h block_q8_0, 34 bytes)."""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 32, 34
DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Integer weights [rows, n] (int8) and scales d [rows, n/32] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    return Unpacked(q=b["qs"].reshape(len(raw), n), d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q8_0: y = r(q*d)."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None]).reshape(len(raw), n)
