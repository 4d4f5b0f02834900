"""Q8_K activations (block_q8_K: f32 d, 256 int8, 16 int16 sums of 16; 292 bytes).

ggml-cpu's quantize_row_q8_K is ggml-base's quantize_row_q8_K_ref (plain C, SSE2, no FMA):
    max = the first element of largest |x| (strictly greater replaces); amax = |max|
    amax == 0: d = 0, q = 0
    iscale = r(-127/max);  q = min(127, nearest_int(r(iscale*x)))   (round half to even)
    d = r(1/iscale);  bsums[j] = sum of q[16j .. 16j+15]
So the element of largest magnitude becomes -127 and d has the opposite sign of max.

ggml_quantize_mat_q8_K_4x8 (the repacked Q4_K gemm's four interleaved columns, AVX2) takes
-127/amax whenever +amax occurs in the block, +127/amax otherwise: the same q and d as above
except when both +amax and -amax occur and -amax comes first, where q and d both change sign.
Every K-quant kernel multiplies d into integer sums of q (and of bsums), so both signs give the
same float results bit for bit (r(-a*b) = -r(a*b), fma likewise): one quantizer serves all paths.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

QK = 256
DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", (QK,)), ("bsums", "<i2", (QK // 16,))])


class Q8KAct(NamedTuple):
    """q int8 [M, K]; d f32 [M, K/256]."""
    q: np.ndarray
    d: np.ndarray

    def bsums(self, width: int = 16) -> np.ndarray:
        """int64 [M, K/width]: sums of `width` consecutive q (ggml's bsums for width 16)."""
        M, K = self.q.shape
        return self.q.reshape(M, K // width, width).astype(np.int64).sum(-1)


def quantize_q8_k(x: np.ndarray) -> Q8KAct:
    """x f32 [M, K] -> q8_K activations (quantize_row_q8_K_ref)."""
    x = np.ascontiguousarray(x, np.float32)
    M, K = x.shape
    if K % QK:
        raise ValueError(f"activation row of {K} values is not a multiple of {QK}")
    xb = x.reshape(M, K // QK, QK)
    first = np.abs(xb).argmax(axis=-1)                        # argmax takes the first of equal maxima
    mx = np.take_along_axis(xb, first[..., None], axis=-1)[..., 0]
    nz = mx != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(nz, np.float32(-127) / np.where(nz, mx, 1), 0).astype(np.float32)
        v = np.rint(xb * iscale[..., None])                   # r(iscale*x), then half to even
        d = np.where(nz, np.float32(1) / np.where(nz, iscale, 1), 0).astype(np.float32)
    q = np.minimum(v, 127).astype(np.int8)
    return Q8KAct(q=q.reshape(M, K), d=d)


def to_bytes(act: Q8KAct) -> np.ndarray:
    """The ggml block_q8_K bytes [M, K/256*292]."""
    M, K = act.q.shape
    out = np.zeros((M, K // QK), DTYPE)
    out["d"] = act.d
    out["qs"] = act.q.reshape(M, K // QK, QK)
    out["bsums"] = act.bsums().reshape(M, K // QK, QK // 16)
    return out.view(np.uint8).reshape(M, -1)


def from_bytes(raw: np.ndarray, K: int) -> Q8KAct:
    b = np.ascontiguousarray(raw, np.uint8).view(DTYPE).reshape(len(raw), K // QK)
    return Q8KAct(q=b["qs"].reshape(len(raw), K), d=b["d"].astype(np.float32))
