"""mul_mat of the reference backend: ggml_compute_forward_mul_mat, bit for bit, in numpy.

ggml-cpu/ggml-cpu.c:ggml_compute_forward_mul_mat converts src1 to the weight's vec_dot_type
(f16, q8_0 or q8_1), then computes every output either with one vec_dot per element or
with llamafile tinyBLAS (sgemm.cpp); passes/choose_matmul_kernel.py picks the FloatOrder.
The order drives the float part: lanes (one SIMD accumulator of 8 f32), accs (independent
accumulators), fma (a*b+c rounded once, or r(r(a*b)+c)) and fold (hsum8 / f32x8_reduce).
The weight type supplies integers: each lane of a quantized dot holds the exact int32 sum
of 32/lanes consecutive products inside a 32-block (maddubs + madd), computed here with
float32 BLAS (|sum| <= 4*128*127 < 2^24, so exact).

Vectorized over all (column, row) pairs; only the sequential chain over K is a Python loop.
Arrays keep the weight-row axis last and contiguous; rows are processed in chunks so that
temporaries stay near 2 MB.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os

import numpy as np

from bankml.errors import LoweringError
from bankml.numerics.floats import f16, f32x8_reduce, hsum8
from bankml.ir.order import FloatOrder
from bankml.quants import F16, Q8_1, Q8_K, WEIGHT_TYPES
from bankml.quants.activation import Q8Act, quantize_q8_0, quantize_q8_1
from bankml.quants.q8_k import quantize_q8_k

f32, f64 = np.float32, np.float64
QK = 32                              # the q8 activation block
_LOW29, _HALF29 = np.uint64((1 << 29) - 1), np.uint64(1 << 28)
_TEMP_ELEMS = 1 << 18                # elements of one [M, lanes, rows] temporary

# WeightType.chain (bankml/quants) -> the ggml functions whose integer sums and float steps it spells
CHAINS = {
    "f16": "ggml_vec_dot_f16, tinyBLAS<8,__m256> (_mul_mat_f16)",
    "q8_0": "ggml_vec_dot_q8_0_q8_0 / _q4_0_q8_0 / _q5_0_q8_0, tinyBLAS_Q0_AVX, gemv/gemm_q4_0_8x8 (_scaled_chain)",
    "q4_1": "ggml_vec_dot_q4_1_q8_1 / _q5_1_q8_1: the q8_0 chain, then + the mins' summs",
    "q1_0": "ggml_vec_dot_q1_0_q8_0 (_nested_chain, a plain first product)",
    "q2_0": "ggml_vec_dot_q2_0_q8_0_generic (_nested_chain, an fma into 0)",
    "k_quant": "Q4_K / Q6_K against q8_K: vec_dot, tiled, repacked gemv/gemm (matmul_kquants.py)",
}


def quantize_activation(x: np.ndarray, act_type: int) -> np.ndarray | Q8Act:
    """src1 converted to the weight's vec_dot_type, as ggml_compute_forward_mul_mat does once
    into wdata: f16 (ggml_cpu_fp32_to_fp16, RNE) for F16 weights, q8_0 or q8_1 blocks."""
    x = np.ascontiguousarray(x, f32)
    if act_type == F16:
        return x.astype(np.float16)
    if act_type == Q8_K:
        return quantize_q8_k(x)
    return quantize_q8_1(x) if act_type == Q8_1 else quantize_q8_0(x)


def mul_mat(w_raw: np.ndarray, wtype: int, x: np.ndarray | Q8Act, order: FloatOrder) -> np.ndarray:
    """ggml_mul_mat(w, x): w_raw uint8 [N, row_bytes] of type wtype, x f32 [M, K] -> f32 [M, N].

    x may already be converted by quantize_activation (one conversion shared by several
    mul_mats, as Q/K/V share attn_norm's): a Q8Act, or an f16 array for F16 weights.
    """
    if wtype not in WEIGHT_TYPES:
        raise LoweringError(f"mul_mat: weight type {wtype} has no reference lowering")
    wt = WEIGHT_TYPES[wtype]
    if wt.chain not in CHAINS:
        raise LoweringError(f"mul_mat: {wt.name}'s chain {wt.chain!r} has no reference lowering")
    if wt.chain == "k_quant":
        from bankml.backends.reference.matmul_kquants import mul_mat_kquant
        return mul_mat_kquant(w_raw, wtype, x, order)
    if order.acc != "f32":
        raise LoweringError(f"mul_mat: order {order.kernel} accumulates in {order.acc}; only f32 is lowered")
    if not isinstance(x, Q8Act) and x.dtype != np.float16:
        x = np.ascontiguousarray(x, f32)
    w_raw = np.ascontiguousarray(w_raw, np.uint8)
    K = (x.q if isinstance(x, Q8Act) else x).shape[1]
    if K % max(wt.block, QK if wt.chain != "f16" else 1) or w_raw.shape[1] != wt.row_bytes(K):
        raise LoweringError(f"mul_mat: {wt.name} weight rows of {w_raw.shape[1]} bytes do not fit K = {K} "
                            f"(blocks of {wt.block}, {wt.block_bytes} bytes)")
    if wt.chain == "f16":
        return _mul_mat_f16(w_raw, x, order)
    return _mul_mat_quant(w_raw, wtype, x, order)


# ---- float steps ------------------------------------------------------------------------

class _Work:
    """Temporaries reused across steps: a fresh multi-MB array per step costs page faults
    that make the loop several times slower than the arithmetic."""

    def __init__(self):
        self._bufs: dict = {}

    def __call__(self, name: str, shape: tuple[int, ...], dtype=f32) -> np.ndarray:
        key = (name, shape, np.dtype(dtype))
        if key not in self._bufs:
            self._bufs[key] = np.empty(shape, dtype)
        return self._bufs[key]


def _madd(order: FloatOrder, a: np.ndarray, b: np.ndarray, acc: np.ndarray, ws: _Work,
          exact_product: bool = False) -> np.ndarray:
    """acc += a*b in place (f32 arrays, a and b broadcast to acc): fused when order.fma,
    else r(r(a*b) + acc).

    exact_product: the caller knows a*b fits in 24 bits (f16 x f16, f16 x int < 2^13), so
    the fused and the unfused step are the same f32 add of the product.
    Otherwise a*b is exact in f64 (24+24 bits) and the f64 sum rounds at most once more;
    converting it to f32 is then wrong only when it lands exactly on an f32 midpoint (low
    29 bits 1000...0) after rounding. For those few elements the TwoSum error says which
    way the exact sum lies. No result here is an f32 subnormal (where that test would not
    hold): every operand is an f16 scale (a multiple of 2^-24) times integers, or sums of
    such, so nonzero values stay far above 2^-126.
    """
    if not order.fma or exact_product:
        t = ws("prod", acc.shape)
        np.multiply(a, b, out=t)
        return np.add(t, acc, out=acc)
    s = ws("fma_sum", acc.shape, f64)
    np.multiply(a, b, out=s, dtype=f64)
    np.add(s, acc, out=s)
    low = ws("fma_low", acc.shape, np.uint64)
    np.bitwise_and(s.view(np.uint64), _LOW29, out=low)
    mid = ws("fma_mid", acc.shape, bool)
    np.equal(low, _HALF29, out=mid)
    fix = None
    if mid.any():
        idx = np.unravel_index(np.flatnonzero(mid), acc.shape)
        p = np.multiply(np.broadcast_to(a, acc.shape)[idx], np.broadcast_to(b, acc.shape)[idx], dtype=f64)
        c, ss = acc[idx].astype(f64), s[idx]
        bp = ss - c
        err = (p - bp) + (c - (ss - bp))               # TwoSum: exact sum = ss + err
        fix = (idx, np.where(err != 0, np.nextafter(ss, ss + err), ss).astype(f32))
    np.copyto(acc, s, casting="unsafe")
    if fix is not None:
        acc[fix[0]] = fix[1]
    return acc


def _fold(order: FloatOrder, acc: np.ndarray) -> np.ndarray:
    """Lanes (axis 1 of [M, lanes, n]) of one accumulator to [M, n]."""
    lanes = acc.shape[1]
    if order.fold == "hsum8" and lanes == 8:
        return hsum8(np.moveaxis(acc, 1, -1))
    if order.fold == "seq" and lanes == 1:
        return acc[:, 0].copy()
    raise LoweringError(f"mul_mat: fold {order.fold} of {lanes} lanes is not lowered ({order.kernel})")


def _chunks(n_rows: int, per_row: int):
    step = max(32, _TEMP_ELEMS // max(per_row, 1))
    for r0 in range(0, n_rows, step):
        yield r0, min(n_rows, r0 + step)


@contextlib.contextmanager
def _one_blas_thread():
    """The lane-sum matmuls are small; OpenBLAS threads only add jitter on a busy machine."""
    fn = _openblas_set_threads()
    if fn is None:
        yield
        return
    get, set_ = fn
    old = get()
    set_(1)
    try:
        yield
    finally:
        set_(old)


@functools.cache
def _openblas_set_threads():
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, set_ in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                          ("openblas_get_num_threads", "openblas_set_num_threads")):
            if hasattr(lib, get) and hasattr(lib, set_):
                g, s = getattr(lib, get), getattr(lib, set_)
                g.restype, s.argtypes = ctypes.c_int, [ctypes.c_int]
                return g, s
    return None


# ---- F16: vec_dot_f16 and tinyBLAS ----------------------------------------------------------

def _mul_mat_f16(w_raw: np.ndarray, x: np.ndarray, order: FloatOrder) -> np.ndarray:
    """F16 weights times f16-rounded src1 (ggml_cpu_fp32_to_fp16, RNE).

    ggml_vec_dot_f16: 4 accumulators of 8 lanes over K & ~31, GGML_F32x8_REDUCE, then the
    leftovers added in f64. tinyBLAS<8,__m256>: one 8-lane accumulator, a zero-filled masked
    tail load, hsum. An f16*f16 product is exact in f32 (11+11 bits, no underflow), so
    fma(a, b, acc) = r(r(a*b) + acc): both settings of order.fma are one f32 add here.
    """
    N = w_raw.shape[0]
    M, K = x.shape
    if x.dtype == np.float16:                          # already converted (quantize_activation)
        xs = x.astype(f32)
    else:
        xs = f16(x) if "src1" in order.f16_at else x
    L, A = order.lanes, order.accs
    if not ((order.fold == "f32x8_reduce" and (A, L) == (4, 8)) or (order.fold == "hsum8" and (A, L) == (1, 8))):
        raise LoweringError(f"mul_mat: F16 order {order.kernel} ({A} accs of {L}, fold {order.fold}) is not lowered")
    step = L * A
    n_steps = -(-K // step) if order.fold == "hsum8" else K // step
    kp = n_steps * step
    kv = min(K, kp)                                    # elements covered by vector steps
    xt = np.zeros((M, kp), f32)
    xt[:, :kv] = xs[:, :kv]
    xt = np.ascontiguousarray(xt.reshape(M, n_steps, A, L).transpose(1, 2, 0, 3))[..., None]   # [S, A, M, L, 1]
    out = np.empty((M, N), f32)
    ws = _Work()
    for r0, r1 in _chunks(N, M * step):
        n = r1 - r0
        w = WEIGHT_TYPES[F16].dequantize(w_raw[r0:r1], K)
        wt = np.zeros((n, kp), f32)
        wt[:, :kv] = w[:, :kv]
        wt = np.ascontiguousarray(wt.reshape(n, n_steps, A, L).transpose(1, 2, 3, 0))[:, :, None]  # [S, A, 1, L, n]
        acc, prod = ws("acc", (A, M, L, n)), ws("prod", (A, M, L, n))
        acc.fill(0)
        for s in range(n_steps):
            np.multiply(xt[s], wt[s], out=prod)        # exact
            np.add(acc, prod, out=acc)
        if order.fold == "hsum8":
            res = _fold(order, acc[0])
        else:
            res = f32x8_reduce([np.moveaxis(acc[j], 1, -1) for j in range(4)])
            if kp < K:                                 # leftovers: sumf += (double)(x*y)
                tot = res.astype(f64)
                for k in range(kp, K):
                    tot += (xs[:, k:k + 1] * w[None, :, k]).astype(f64)
                res = tot.astype(f32)
        out[:, r0:r1] = res
    return out


# ---- quantized: integer lane sums, then the kernel's float chain ----------------------------

def _lane_matrix(q: np.ndarray, lanes: int) -> np.ndarray:
    """Block-diagonal activations [K/32, M*lanes, 32] f32: row (m, l) holds column m's
    elements of lane l (32/lanes consecutive ones) and zeros elsewhere, so one BLAS matmul
    with the weights' [32, rows] block gives every lane sum of that block."""
    M, K = q.shape
    B, g = K // QK, QK // lanes
    a = q.astype(f32).reshape(M, B, lanes, g).transpose(1, 0, 2, 3)     # [B, M, L, g]
    out = np.zeros((B, M, lanes, lanes, g), f32)
    i = np.arange(lanes)
    out[:, :, i, i, :] = a[:, :, i, :]
    return out.reshape(B, M * lanes, QK)


def _mul_mat_quant(w_raw: np.ndarray, wtype: int, x: np.ndarray, order: FloatOrder) -> np.ndarray:
    wt = WEIGHT_TYPES[wtype]
    N = w_raw.shape[0]
    act = x if isinstance(x, Q8Act) else quantize_activation(x, wt.act_type)
    M, K = act.q.shape
    L = order.lanes
    if order.accs != 1 or QK % L:
        raise LoweringError(f"mul_mat: {wt.name} with {order.accs} accs of {L} lanes is not lowered")
    amat = _lane_matrix(act.q, L)
    da = act.d[:, :, None, None]                       # [M, B, 1, 1]: broadcasts over lanes and rows
    B = K // QK
    out = np.empty((M, N), f32)
    ws = _Work()
    with _one_blas_thread():
        for r0, r1 in _chunks(N, M * L):
            n = r1 - r0
            u = wt.unpack(w_raw[r0:r1], K)
            wq = np.ascontiguousarray(u.q.reshape(n, B, QK).transpose(1, 2, 0), f32)   # [B, 32, n]
            sums = ws("lane_sums", (M * L, n))

            def lane_sums(b: int) -> np.ndarray:       # [M, L, n], exact integers
                return np.matmul(amat[b], wq[b], out=sums).reshape(M, L, n)

            dw = np.ascontiguousarray(u.d.T)[:, None, None, :]   # [weight blocks, 1, 1, n]
            acc = ws("acc", (M, L, n))
            acc.fill(0)
            if wt.chain in ("q8_0", "q4_1"):
                _scaled_chain(order, lane_sums, dw, da, B, acc, ws)
            else:                                      # "q1_0", "q2_0"
                _nested_chain(order, lane_sums, dw, da, wt.block // QK, wt.chain == "q1_0", acc, ws)
            res = _fold(order, acc)
            if wt.chain == "q4_1":                     # r(hsum8(acc) + summs), summs = fma chain of m*s
                summs = ws("summs", (M, n))
                summs.fill(0)
                mw = np.ascontiguousarray(u.m.T)
                for b in range(B):
                    _madd(order, mw[b][None, :], act.s[:, b:b + 1], summs, ws, exact_product=True)   # f16 x f16
                res += summs
            out[:, r0:r1] = res
    return out


def _scaled_chain(order, lane_sums, dw, da, B, acc, ws) -> None:
    """ggml_vec_dot_q8_0_q8_0 / q4_1_q8_1 / q4_0_q8_0 / q5_0_q8_0 / q5_1_q8_1 (and tinyBLAS_Q0_AVX):
    per q8 block acc = fma(r(dw*da), float(lane sums), acc). With one lane (Q4_0_REPACK:
    ggml_gemv/gemm_q4_0_8x8_q8_0) the lane sum is the whole block's."""
    for b in range(B):
        d = dw[b] * da[:, b]                           # r(dw*da), f32 [M, 1, n]
        _madd(order, d, lane_sums(b), acc, ws)


def _nested_chain(order, lane_sums, dw, da, sub, first_mul, acc, ws) -> None:
    """ggml_vec_dot_q1_0_q8_0 (AVX2) / ggml_vec_dot_q2_0_q8_0_generic: per weight block of
    `sub` q8 blocks, blk = chain of da_k * lane sums_k (Q1_0 starts with a plain product,
    Q2_0 with an fma into 0.0f), then acc = fma(dw, blk, acc)."""
    blk = ws("blk", acc.shape)
    for i in range(dw.shape[0]):
        for k in range(sub):
            b = i * sub + k
            if k == 0 and first_mul:
                np.multiply(da[:, b], lane_sums(b), out=blk)
                continue
            if k == 0:
                blk.fill(0)
            _madd(order, da[:, b], lane_sums(b), blk, ws, exact_product=True)   # f16 x |int| < 2^13
        _madd(order, dw[i], blk, acc, ws)
