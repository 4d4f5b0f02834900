"""The int8 K/V cache and the attention of the portable profile.

Cache: one row per (cell, K/V head) of D values (cache_row): an f16 scale
s = f16(r(absmax * r(1/127))) (absmax passes a NaN over) and D int8 codes under inv = recip(s)
(int8_codes: the nearest integer of r(x * inv), ties to even, within +-127, a NaN product 0;
every code 0 when inv is infinite, i.e. s rounded to 0). `cache_dtype(D)` is one such row.

Attention of query rows q [M, H, D] over n_kv cells (head h reads K/V head h // (H/Hkv)), the
document's attend_int8 over each row's live cells (mask 0; a cell under -inf is not a position):
  1. q is quantized in blocks of 32 (quant.quantize_act; quantize_head for D <= 256), or under
     ActScaling PerBlock each head as one block (quantize_head(q, PER_BLOCK));
  2. score[j] = the exact q.k_j (codes times scales) rounded once, then r(score * scale)
     (int8_score); a masked cell's score -inf, whatever its K row holds;
  3. p = softmax(scores) (funcs.softmax: max, exp, fold_sum, recip, products); a row with no
     live cell has no positions (weights 0, the output -0.0, the sum of no blocks);
  4. w_j = r(p_j * s_vj) (the V row's scale; 0 for a masked cell), and per block of VALUE_BLOCK
     cells a power-of-two scale 2^E, the least with 127 * 2^E >= max |w_j| (E = 0 for an
     all-zero block); codes W_j = rint(w_j / 2^E) (exact);
  5. out = Σ over blocks in cell order (f32 adds, from the first block) of
     r(2^E * Σ_j W_j * v_codes_j) (weighted_int8): each block's integer sum (|.| < 2^19) exact,
     0 rounding to +0; a block with no live cell is no block of the document's: -0.0, which
     changes no bit. For a causal row (its live cells the first ones) the blocks of cells are
     the document's blocks of positions.
"""
from __future__ import annotations

import numpy as np

from bankml.profiles.portable.arith import F32, add, canon, fdot, fields, int_to_f32, mul, round_exact
from bankml.profiles.portable.funcs import absmax, recip, softmax
from bankml.profiles.portable.quant import (GROUP, QK, ActBlocks, ActScaling, Words, f16_parts, quantize_act,
                                            quantize_blocks)
from bankml.profiles.portable.tables import constants
from bankml.quants.kv_cache import i8_row


def cache_dtype(d: int) -> np.dtype:
    """One cache row of d values (the cache's layout is quants/kv_cache.py's "i8r")."""
    return i8_row(d)


def int8_codes(x, inv) -> np.ndarray:
    """The int8 codes of x under the inverse scale inv: each x·inv to the nearest integer, ties to
    even, within ±127, a NaN product zero; every code zero when inv is infinite, the reciprocal of a
    scale that rounded to zero. (inv broadcasts against x.)"""
    p = mul(x, inv)
    q = np.where(np.isnan(p), F32(0), np.clip(np.rint(p), -127, 127))
    return np.where(np.isinf(inv), F32(0), q).astype(np.int8)


def cache_row(x: np.ndarray) -> np.ndarray:
    """A cache row stored as int8 codes under one f16 scale amax/127 (absmax): the scale's bits and
    the codes under its reciprocal (int8_codes), all zero when the scale rounds to zero.
    x f32 [..., D] -> rows [...] of cache_dtype(D); amax/127 is r(absmax · INV_127), then f16."""
    x = canon(x)
    with np.errstate(over="ignore"):
        s = mul(absmax(x), constants()["INV_127"]).astype(np.float16)   # f32 -> f16, nearest even (inf past 65504)
    out = np.empty(x.shape[:-1], cache_dtype(x.shape[-1]))
    out["d"], out["qs"] = s, int8_codes(x, recip(s.astype(F32))[..., None])
    return out


def attend_vector(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """One query head's attention over its cached rows on the vector units: each position's score
    the head's dot with the key times scale, the softmax of the scores, and each value element the
    probabilities' dot (fdot, lanes by position) with that element across the positions.
    q f32 [D]; k, v f32 [n, D] (the cached rows); -> f32 [D]. Not yet a graph op: the profile's
    graphs keep the int8 cache."""
    s = mul(fdot(k, q), F32(scale))                                   # [n]: lanes by element
    p = softmax(s)
    return fdot(np.swapaxes(v, 0, 1), p)                              # [D]: lanes by position


VALUE_BLOCK = 32          # positions a block of the weighted sum spans (docs/PORTABLE.md)


def quantize_head(x: np.ndarray, scaling: ActScaling = ActScaling.SUB32) -> ActBlocks:
    """A query head as the array reads it: per 32 elements (the head padded with zeros to a whole
    group), or the whole head one block. x f32 [..., D]."""
    x = canon(np.asarray(x, F32))
    if scaling is ActScaling.PER_BLOCK:
        return quantize_blocks(x, x.shape[-1])
    pad = np.zeros((*x.shape[:-1], -x.shape[-1] % GROUP), F32)
    return quantize_act(np.concatenate([x, pad], -1))


def int8_score(qh: ActBlocks, row: np.ndarray) -> np.float32:
    """A score as the array computes it against a cached int8 key row (its f16 scale's bits and its
    codes): per activation block of the query, its scale's m times the integer dot of its codes
    and the key's codes, times the key's scale, summed exactly and rounded once.
    qh: quantize_head of one head; row: one cache row (cache_dtype(D))."""
    codes = np.zeros(qh.q.shape[-1], np.int64)
    codes[:row["qs"].shape[-1]] = row["qs"]
    ks, kx, kbad = f16_parts(row["d"])
    dots = (qh.q.astype(np.int64) * codes).reshape(len(qh.m), -1).sum(-1)
    if kbad or qh.bad.any():
        return F32(np.nan)
    return round_exact(qh.m * dots * ks, qh.e + kx)[()]


def weighted_int8(p: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The weighted sum on the array over cached int8 value rows (each its f16 scale's bits and its
    codes): each position's probability times its row's scale, quantized per block of VALUE_BLOCK
    positions to 8-bit codes at a power-of-two scale; per value element the block's exact integer
    sum against the value codes, rounded once a block; the blocks added in order.
    p f32 [n]; rows [n] cache rows of D -> f32 [D] (no positions: -0.0, the sum of no blocks)."""
    D = rows["qs"].shape[-1]
    out = np.full(D, F32(-0.0))
    for b0 in range(0, len(p), VALUE_BLOCK):
        w = mul(p[b0:b0 + VALUE_BLOCK], rows["d"][b0:b0 + VALUE_BLOCK].astype(F32))
        amax = np.max(np.abs(w))
        if np.isnan(amax):
            return np.full(D, F32(np.nan))
        if np.isinf(amax):           # no scale holds it: every sum int64's least value (as attention)
            r = np.full(D, F32(-np.inf))
        else:
            E = int(_pow2_scale(amax[None].astype(F32))[0])
            W = np.rint(np.ldexp(w.astype(np.float64), -E)).astype(np.int64)       # exact, |W| <= 127
            r = int_to_f32(W @ rows["qs"][b0:b0 + VALUE_BLOCK].astype(np.int64), E)  # 0 -> +0
        out = r if b0 == 0 else add(out, r)
    return canon(out)


def attend_int8(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, words: Words = Words.I8,
                scaling: ActScaling = ActScaling.SUB32) -> np.ndarray:
    """One query head's attention over its cached int8 rows on the array: the query quantized as
    words and scaling name (quantize_head), each position's int8_score times scale, the softmax,
    the weighted_int8 sum. q f32 [D]; k, v cache rows [n] -> f32 [D]."""
    if not isinstance(words, Words) or not isinstance(scaling, ActScaling):
        raise ValueError(f"attend_int8: words {words!r} and scaling {scaling!r} must be a Words and an ActScaling")
    qh = quantize_head(q, scaling)
    s = np.array([int8_score(qh, row) for row in k], F32)
    return weighted_int8(softmax(mul(s, F32(scale))), v)


def dequantize_rows(rows: np.ndarray) -> np.ndarray:
    """The exact values s * q as f32 (what a cache row stands for; for tests and diffs)."""
    return (rows["qs"].astype(np.float64) * rows["d"].astype(np.float64)[..., None]).astype(F32)


def _pow2_scale(amax: np.ndarray) -> np.ndarray:
    """E, the least integer with 127 * 2^E >= amax (0 for amax 0)."""
    _, b, frac = fields(amax)
    c, p = frac | 0x800000, b - 127
    e = np.where(c <= (127 << 17), p - 6, p - 5)                    # amax * 2^-p <= 127/64 ?
    return np.where(amax == 0, 0, e)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
              scaling: ActScaling = ActScaling.SUB32) -> np.ndarray:
    """q f32 [M, H, D]; k, v cache rows [n_kv, Hkv]; mask [M, n_kv] (0 or -inf) -> f32 [M, H, D].
    scaling: how each query head is quantized (quantize_head: per 32, or PerBlock the whole head
    one block, its scale given to each 32 here: the exact sum is the one term's)."""
    M, H, D = q.shape
    n_kv, Hkv = k.shape
    g = H // Hkv
    nsub = D // QK
    if scaling is ActScaling.PER_BLOCK:
        w = quantize_blocks(np.asarray(q, F32), D)
        a = ActBlocks(w.q, *(np.repeat(f, nsub, -1) for f in (w.m, w.e, w.bad)))
    else:
        a = quantize_act(q.reshape(M, H, D))
    # scores: exact per row (D <= 256: one group), rounded once
    ks, kx, kbad = f16_parts(k["d"])                                 # [n_kv, Hkv]
    kq = k["qs"].astype(np.float32)                                  # [n_kv, Hkv, D]
    qa = a.q.astype(np.float32).reshape(M, Hkv, g, nsub, QK)
    kb = kq.reshape(n_kv, Hkv, nsub, QK)
    dots = np.rint(np.einsum("mhgsk,jhsk->mhgjs", qa, kb)).astype(np.int64)   # exact in f32 (< 2^19)
    am = a.m.reshape(M, Hkv, g, 1, nsub)
    ae = a.e.reshape(M, Hkv, g, 1, nsub)
    ksb = ks.T[None, :, None, :, None]
    kxb = kx.T[None, :, None, :, None]
    s = round_exact(am * ksb * dots, np.broadcast_to(ae + kxb, dots.shape))    # [M, Hkv, g, n_kv]
    bad = a.bad.reshape(M, Hkv, g, 1, nsub).any(-1) | kbad.T[None, :, None, :]
    s = np.where(bad, F32(np.nan), s).astype(F32)
    live = (np.asarray(mask) != -np.inf)[:, None, None, :]           # [M, 1, 1, n_kv]
    s = np.where(live, mul(s, F32(scale)), F32(-np.inf))
    p = softmax(s)                                                   # [M, Hkv, g, n_kv]
    # a row with no live cell attends over no positions: no weights (the softmax of a row of
    # -inf is NaN), the output the sum of no blocks, -0.0
    p = np.where(live.any(-1, keepdims=True), p, F32(0))
    # values: w_j = r(p_j * s_vj), a power-of-two block scale per 32 cells, exact block sums
    w = np.where(live, mul(p, v["d"].astype(F32).T[None, :, None, :]), F32(0))
    wb = w.reshape(M, Hkv, g, n_kv // VALUE_BLOCK, VALUE_BLOCK)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(wb), axis=-1)
    E = _pow2_scale(np.nan_to_num(amax, nan=0.0).astype(F32))
    W = np.rint(np.ldexp(wb.astype(np.float64), -E[..., None])).astype(np.float32)  # exact, |W| <= 127
    vq = v["qs"].astype(np.float32).reshape(n_kv // VALUE_BLOCK, VALUE_BLOCK, Hkv, D)
    with np.errstate(invalid="ignore"):           # an infinite w: int64's least value
        sums = np.rint(np.einsum("mhgbj,bjhd->mhgbd", W, vq)).astype(np.int64)   # exact (< 2^19)
    r = int_to_f32(sums, E[..., None])                                            # 0 -> +0
    blive = live.reshape(M, 1, 1, n_kv // VALUE_BLOCK, VALUE_BLOCK).any(-1)
    r = np.where(blive[..., None], r, F32(-0.0))      # no live cell: no block, -0.0 changes nothing
    out = r[..., 0, :]
    for b in range(1, n_kv // VALUE_BLOCK):
        out = add(out, r[..., b, :])
    nan = np.isnan(amax).any(-1)[..., None]
    out = np.where(nan, F32(np.nan), out)
    return canon(out).reshape(M, H, D)
