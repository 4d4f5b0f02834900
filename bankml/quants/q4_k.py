"""Q4_K weights: super-blocks of 256 nibbles in 8 sub-blocks of 32 (block_q4_K, 144 bytes).

    d, dmin: f16;  scales[12]: eight 6-bit scales and eight 6-bit mins (get_scale_min_k4);
    qs[128]: per 64 elements, 32 bytes whose low nibbles are elements 0..31 and high
    nibbles elements 32..63.
Element e of a row belongs to sub-block e // 32 (scale sc, min m); its value is
d*sc*q - dmin*m.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bankml.quants.blocks import blocks

BLOCK, BLOCK_BYTES = 256, 144
DTYPE = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])


class KUnpacked(NamedTuple):
    """A K-quant matrix as its integer dot products see it.

    q: int8 [rows, n] codes (Q4_K 0..15; Q6_K the raw 6-bit code 0..63, the -32 applied by
    the kernels); sc: int32 [rows, n/sub] sub-block scales; m: int32 [rows, n/32] mins (Q4_K)
    or None; d, dmin: f32 [rows, n/256] (dmin None for Q6_K).
    """
    q: np.ndarray
    sc: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None
    dmin: np.ndarray | None = None


def scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml-quants.c:get_scale_min_k4 for j = 0..7 of scales [..., 12] -> (sc, m) [..., 8]."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, m


def unpack(raw: np.ndarray, n: int) -> KUnpacked:
    b = blocks(raw, DTYPE, n // BLOCK)
    rows, nb = b.shape
    qs = b["qs"].reshape(rows, nb, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, n).astype(np.int8)   # [.., 64-chunk, lo|hi, 32]
    sc, m = scales_mins(b["scales"])
    return KUnpacked(q=q, sc=sc.reshape(rows, -1), d=b["d"].astype(np.float32), m=m.reshape(rows, -1),
                     dmin=b["dmin"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q4_K: y = r(r(d*sc)*q) - r(dmin*m), rounded (no FMA in ggml-base)."""
    u = unpack(raw, n)
    rows = len(raw)
    d1 = np.repeat(u.d, 8, axis=1) * u.sc.astype(np.float32)          # [rows, n/32]
    m1 = np.repeat(u.dmin, 8, axis=1) * u.m.astype(np.float32)
    q = u.q.astype(np.float32).reshape(rows, -1, 32)
    return (d1[:, :, None] * q - m1[:, :, None]).reshape(rows, n)
