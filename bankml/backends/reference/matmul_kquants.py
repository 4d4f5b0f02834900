"""mul_mat of Q4_K / Q6_K weights against q8_K activations, bit for bit, in numpy.

Every path ggml-cpu (AVX2 build) runs for these types makes exact integer sums first and then
a short chain of f32 steps; the integers are the same whatever their order, so only the
chain and the grouping of the integers into f32 conversions decide the bits. Notation per
output (weight row n, activation column m), per 256-element super-block i:
    q: weight code (Q4_K 0..15; Q6_K 0..63, used as q-32), a: q8_K value, sc/mn: sub-block
    scale/min (Q4_K: 8 sub-blocks of 32; Q6_K: 16 of 16, int8 scales), dw/dmw: the block's f16
    d/dmin as f32, da: the activation block's f32 d, S32/S16: sums of 32/16 consecutive a.
    f(i) = (float)i (cvtepi32_ps, rounds to nearest even above 2^24).

ggml_vec_dot_q4_K_q8_K (fewer than 8 columns, rows not repacked): 8 int32 lanes, lane l the
  elements with e % 32 in [4l, 4l+4), each times its sub-block's sc; 4 int32 min lanes,
  lane p = mn[2p]*S32[2p] + mn[2p+1]*S32[2p+1].
      acc = fma(r(da*dw), f(lane), acc);  accm = fma(r(-da*dmw), f(minlane), accm)
      out = hsum8(acc) + ((accm0+accm2) + (accm1+accm3))
ggml_vec_dot_q6_K_q8_K (fewer than 8 columns): the same 8 lanes of sc*q*a (sc of e // 16),
  minus, in lane l, 32*(S16[2l]*sc[2l] + S16[2l+1]*sc[2l+1]).
      acc = fma(r(da*dw), f(lane), acc);  out = hsum8(acc)
tiled (tiled_run_microtile_avx2, 8 columns or more, rows not repacked): one int32 per block,
  s1 = sum of sc*q*a (Q6_K: sc*(q-32)*a), s2 = sum of mn*S32 (Q4_K).
      Q4_K: res = fma(-dmw, f(s2), r(dw*f(s1)));  Q6_K: res = r(dw*f(s1))
      acc = fma(res, da, acc);  out = acc
ggml_gemv_q4_K_8x8_q8_K (repacked rows, the columns after the last group of 4):
      acc = fma(f(s1), r(dw*da), acc);  accm = fma(f(s2), r(dmw*da), accm);  out = acc - accm
ggml_gemm_q4_K_8x8_q8_K (repacked rows, each group of 4 columns): the gemv chain per 64
  elements (two sub-blocks) instead of per block.
The K loop runs from 0 upwards in every path; thread count never changes the bits.
"""
from __future__ import annotations

import numpy as np

from bankml.errors import LoweringError
from bankml.numerics.floats import fma, hsum8
from bankml.ir import order as fo
from bankml.quants import Q4_K, Q6_K, WEIGHT_TYPES
from bankml.quants.q8_k import Q8KAct, quantize_q8_k

f32 = np.float32
TILED_MIN_COLS = 8          # tiled.cpp:ggml_tiled_min_batch
GEMM_COLS = 4               # repack.cpp forward_mul_mat_one_chunk: gemm on nrows - nrows % 4
_TEMP_ELEMS = 1 << 20      # elements of one [M, K/4, rows] integer temporary


def f(i: np.ndarray) -> np.ndarray:
    """cvtepi32_ps: int32 to f32, round to nearest even."""
    return i.astype(np.int64).astype(f32)


def mul_mat_kquant(w_raw: np.ndarray, wtype: int, x: np.ndarray | Q8KAct, order: fo.FloatOrder) -> np.ndarray:
    """ggml_mul_mat(w, x) for a Q4_K or Q6_K w [N, row_bytes] and x f32 [M, K] (or its q8_K)."""
    act = x if isinstance(x, Q8KAct) else quantize_q8_k(x)
    M, K = act.q.shape
    wt = WEIGHT_TYPES[wtype]
    if K % 256 or w_raw.shape[1] != wt.row_bytes(K):
        raise LoweringError(f"mul_mat: {wt.name} rows of {w_raw.shape[1]} bytes do not fit K = {K}")
    paths = column_paths(wtype, order, M)
    N = w_raw.shape[0]
    out = np.empty((M, N), f32)
    step = max(8, _TEMP_ELEMS // max(1, M * K // 4))
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        u = wt.unpack(np.ascontiguousarray(w_raw[r0:r1]), K)
        for path, c0, c1 in paths:
            if c1 > c0:
                a = Q8KAct(act.q[c0:c1], act.d[c0:c1])
                out[c0:c1, r0:r1] = _PATHS[(wtype, path)](u, a, _int_sums(u, a, wtype))
    return out


def column_paths(wtype: int, order: fo.FloatOrder, M: int) -> list[tuple[str, int, int]]:
    """Which ggml kernel computes which columns [c0, c1) of an M-column product."""
    if order is fo.Q4_K_REPACK and wtype == Q4_K:
        g = M - M % GEMM_COLS
        return [("gemm", 0, g), ("gemv", g, M)]
    if (wtype, order) in ((Q4_K, fo.Q4_K_MUL_MAT), (Q6_K, fo.Q6_K_MUL_MAT)):
        return [("tiled" if M >= TILED_MIN_COLS else "vec_dot", 0, M)]
    raise LoweringError(f"mul_mat: {WEIGHT_TYPES[wtype].name} with order {order.kernel} is not lowered")


# ---- the integers ----------------------------------------------------------------------------

def _int_sums(u, a: Q8KAct, wtype: int) -> np.ndarray:
    """int64 [M, K/32, 8, n]: for each 32-block and lane l (its elements 4l..4l+3), the exact
    sum of q*a times the element's sub-block scale (Q6_K: raw codes, the -32 not applied)."""
    M, K = a.q.shape
    n = u.q.shape[0]
    qa = a.q.reshape(M, K // 32, 8, 4).astype(np.float64)
    qw = u.q.reshape(n, K // 32, 8, 4).astype(np.float64)
    lane = np.einsum("mblt,nblt->mbln", qa, qw, optimize=True).astype(np.int64)   # exact (< 2^53)
    sub = u.sc.shape[1] // (K // 32)                  # scales per 32-block: 1 (Q4_K) or 2 (Q6_K)
    sc = u.sc.reshape(n, K // 32, sub).astype(np.int64)
    scale = np.repeat(sc, 8 // sub, axis=2)           # lane l of a 32-block: scale sc[l // (8/sub)]
    return lane * scale.transpose(1, 2, 0)[None]


def _blocks(t: np.ndarray) -> np.ndarray:
    """[M, K/32, ...] -> [M, K/256, 8, ...]."""
    return t.reshape(t.shape[0], -1, 8, *t.shape[2:])


def _min_lanes(u, a: Q8KAct) -> np.ndarray:
    """Q4_K: int64 [M, K/256, 4, n], lane p = mn[2p]*S32[2p] + mn[2p+1]*S32[2p+1]."""
    M, K = a.q.shape
    S = a.bsums(32).reshape(M, K // 256, 4, 2, 1)
    mn = u.m.reshape(-1, K // 256, 4, 2).transpose(1, 2, 3, 0)[None]
    return (S * mn).sum(axis=3)


def _q6_bias(u, a: Q8KAct) -> np.ndarray:
    """Q6_K: int64 [M, K/256, 8, n], lane l = 32*(S16[2l]*sc[2l] + S16[2l+1]*sc[2l+1])."""
    M, K = a.q.shape
    S = a.bsums(16).reshape(M, K // 256, 8, 2, 1)
    sc = u.sc.reshape(-1, K // 256, 8, 2).transpose(1, 2, 3, 0)[None].astype(np.int64)
    return 32 * (S * sc).sum(axis=3)


def _scales(u, a: Q8KAct):
    """da [M, K/256, 1] and the weights' dw, dmw [1, K/256, n] for broadcasting to [M, ., n]."""
    return a.d[:, :, None], u.d.T[None], (u.dmin.T[None] if u.dmin is not None else None)


# ---- the float chains -----------------------------------------------------------------------

def _vec_dot_q4_k(u, a, s):
    da, dw, dmw = _scales(u, a)
    lanes = _blocks(s).sum(axis=2)                    # [M, K/256, 8, n]
    mins = _min_lanes(u, a)
    d = (da * dw)[:, :, None, :]                      # r(y.d * x.d)
    dm = (-da * dmw)[:, :, None, :]                   # r(-y.d * x.dmin)
    M, n = lanes.shape[0], lanes.shape[-1]
    acc, accm = np.zeros((M, 8, n), f32), np.zeros((M, 4, n), f32)
    for i in range(lanes.shape[1]):
        acc = fma(d[:, i], f(lanes[:, i]), acc)
        accm = fma(dm[:, i], f(mins[:, i]), accm)
    return hsum8(np.moveaxis(acc, 1, -1)) + ((accm[:, 0] + accm[:, 2]) + (accm[:, 1] + accm[:, 3]))


def _vec_dot_q6_k(u, a, s):
    da, dw, _ = _scales(u, a)
    lanes = _blocks(s).sum(axis=2) - _q6_bias(u, a)
    d = (da * dw)[:, :, None, :]
    acc = np.zeros((lanes.shape[0], 8, lanes.shape[-1]), f32)
    for i in range(lanes.shape[1]):
        acc = fma(d[:, i], f(lanes[:, i]), acc)
    return hsum8(np.moveaxis(acc, 1, -1))


def _tiled_q4_k(u, a, s):
    da, dw, dmw = _scales(u, a)
    s1 = _blocks(s).sum(axis=(2, 3))                  # [M, K/256, n]
    s2 = _min_lanes(u, a).sum(axis=2)
    acc = np.zeros((s1.shape[0], s1.shape[-1]), f32)
    for i in range(s1.shape[1]):
        res = fma(-dmw[:, i], f(s2[:, i]), dw[:, i] * f(s1[:, i]))
        acc = fma(res, da[:, i], acc)
    return acc


def _tiled_q6_k(u, a, s):
    da, dw, _ = _scales(u, a)
    s1 = (_blocks(s).sum(axis=2) - _q6_bias(u, a)).sum(axis=2)   # = sum of sc*(q-32)*a
    acc = np.zeros((s1.shape[0], s1.shape[-1]), f32)
    for i in range(s1.shape[1]):
        acc = fma(dw[:, i] * f(s1[:, i]), da[:, i], acc)
    return acc


def _repack_chain(u, a, s1, s2, per_block: int):
    """gemv (per_block 1) / gemm (per_block 4): acc = fma(f(s1), r(dw*da), acc) and the mins
    likewise, for each of the per_block pieces of a block in order; out = acc - accm."""
    da, dw, dmw = _scales(u, a)
    d, dm = dw * da, dmw * da                         # r(col_d * row_d), [M, K/256, n]
    acc = np.zeros((s1.shape[0], s1.shape[-1]), f32)
    accm = np.zeros_like(acc)
    for i in range(s1.shape[1]):
        for p in range(per_block):
            acc = fma(f(s1[:, i, p]), d[:, i], acc)
            accm = fma(f(s2[:, i, p]), dm[:, i], accm)
    return acc - accm


def _gemv_q4_k(u, a, s):
    s1 = _blocks(s).sum(axis=(2, 3))[:, :, None]      # [M, K/256, 1, n]
    return _repack_chain(u, a, s1, _min_lanes(u, a).sum(axis=2)[:, :, None], 1)


def _gemm_q4_k(u, a, s):
    b = _blocks(s).sum(axis=3)                        # [M, K/256, 8 sub-blocks, n]
    s1 = b[:, :, 0::2] + b[:, :, 1::2]                # per 64 elements: [M, K/256, 4, n]
    return _repack_chain(u, a, s1, _min_lanes(u, a), 4)


_PATHS = {(Q4_K, "vec_dot"): _vec_dot_q4_k, (Q6_K, "vec_dot"): _vec_dot_q6_k,
          (Q4_K, "tiled"): _tiled_q4_k, (Q6_K, "tiled"): _tiled_q6_k,
          (Q4_K, "gemv"): _gemv_q4_k, (Q4_K, "gemm"): _gemm_q4_k}
