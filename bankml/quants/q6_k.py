"""Q6_K weights: super-blocks of 256 six-bit codes in 16 sub-blocks of 16 (block_q6_K, 210 bytes).

    ql[128]: low 4 bits; qh[64]: high 2 bits; scales[16]: int8; d: f16.
Per half h (128 elements), element 32k + l (k = 0..3, l < 32) takes its low bits from
ql[64h + l + 32*(k&1)] (low nibble for k < 2, high nibble for k >= 2) and its high bits from
bits 2k..2k+1 of qh[32h + l]. Element e belongs to sub-block e // 16; value d*sc*(code-32).
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import blocks
from bankml.quants.q4_k import KUnpacked

BLOCK, BLOCK_BYTES = 256, 210
DTYPE = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])


def unpack(raw: np.ndarray, n: int) -> KUnpacked:
    """Raw codes 0..63 (the kernels subtract 32), scales per 16, d."""
    b = blocks(raw, DTYPE, n // BLOCK)
    rows, nb = b.shape
    ql = b["ql"].reshape(rows, nb, 2, 2, 32)          # [.., half, k&1, l]
    qh = b["qh"].reshape(rows, nb, 2, 1, 32)
    low = np.stack([ql[:, :, :, 0] & 0xF, ql[:, :, :, 1] & 0xF, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], axis=3)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None]) & 3
    q = (low | (high << 4)).reshape(rows, n).astype(np.int8)
    return KUnpacked(q=q, sc=b["scales"].astype(np.int32).reshape(rows, -1), d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q6_K: y = r(r(d*sc)*(code-32))."""
    u = unpack(raw, n)
    rows = len(raw)
    d1 = np.repeat(u.d, 16, axis=1) * u.sc.astype(np.float32)         # [rows, n/16]
    q = (u.q.astype(np.int32) - 32).astype(np.float32).reshape(rows, -1, 16)
    return (d1[:, :, None] * q).reshape(rows, n)
