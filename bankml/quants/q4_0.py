"""Q4_0: blocks of 32 nibbles with one f16 scale (ggml-common.h block_q4_0, 18 bytes).

Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the value is
(nibble - 8) * d. A weight type, and a quantized K/V cache type (`--cache-type-k q4_0`):
ggml-cpu's from_float for Q4_0 is quantize_row_q4_0_ref (ggml-cpu/quants.c calls it), in
ggml-base, built without FMA.
"""
from __future__ import annotations

import numpy as np

from bankml.quants.blocks import Unpacked, blocks

BLOCK, BLOCK_BYTES = 32, 18
DTYPE = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


def unpack(raw: np.ndarray, n: int) -> Unpacked:
    """Signed values q - 8 [rows, n] (int8, -8..7) and d [rows, n/32] (f32)."""
    b = blocks(raw, DTYPE, n // BLOCK)
    qs = b["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return Unpacked(q=q.reshape(len(raw), n), d=b["d"].astype(np.float32))


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """ggml-quants.c:dequantize_row_q4_0: y = r((q - 8) * d)."""
    u = unpack(raw, n)
    q = u.q.astype(np.float32).reshape(len(raw), -1, BLOCK)
    return (q * u.d[:, :, None]).reshape(len(raw), n)


def quantize(x: np.ndarray) -> np.ndarray:
    """ggml-quants.c:quantize_row_q4_0_ref of rows x f32 [rows, n] -> bytes [rows, n/32*18]. Per block:
        max = the first element of largest |x| (strict <, so the first wins a tie)
        d = r(max / -8); id = d != 0 ? r(1/d) : 0; block.d = f16(d)
        nibble = min(15, (int8)(r(r(x*id) + 8.5)))     truncation toward zero, no FMA
    """
    x = np.ascontiguousarray(x, np.float32)
    rows, n = x.shape
    xb = x.reshape(rows, n // BLOCK, BLOCK)
    first = np.argmax(np.abs(xb), axis=-1)                       # argmax returns the first maximum
    mx = np.take_along_axis(xb, first[..., None], axis=-1)[..., 0]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = ((xb * idv[..., None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
        q = np.minimum(15, _to_int8(v)).astype(np.uint8)
    out = np.zeros((rows, n // BLOCK), DTYPE)
    out["d"] = d.astype(np.float16)
    out["qs"] = q[..., :16] | (q[..., 16:] << 4)
    return out.view(np.uint8).reshape(rows, -1)


def _to_int8(v: np.ndarray) -> np.ndarray:
    """(int8_t) of a float in 0..16.5: truncation toward zero (cvttss2si), then the low byte, as int."""
    return np.trunc(v).astype(np.int64).astype(np.int8).astype(np.int64)
