"""A quantized K/V cache in ggml's float order: the Hadamard rotation, the quantized cache write
and flash_attn_ext's one_chunk kernel over q8_0/q4_0 rows (bankml/quants/kv_cache.py says when).

- fwht, ggml-cpu/ops.cpp:ggml_compute_forward_fwht (ggml_mul_mat with GGML_HINT_SRC0_IS_HADAMARD,
  which llama_mul_mat_hadamard sets): per row of n values y = r(x * r(1/sqrtf(n))), then the
  butterflies of len 1, 2, 4, ... n/2 on (u, v) = (y[i+j], y[i+len+j]): (r(u+v), r(u-v)).
  The Hadamard matrix llama.cpp fills (ggml_gen_hadamard) is never read on the CPU, only its size.
- quantize_rows, ggml_compute_forward_set_rows with a q8_0 / q4_0 destination: each row through
  ggml-cpu's from_float, quantize_row_q8_0 (the AVX2 path, the same as the q8_0 activations) or
  quantize_row_q4_0_ref.
- flash_attn_quant, ggml_compute_forward_flash_attn_ext_f16_one_chunk, the only kernel ggml runs
  when K or V is not f16 (ggml_compute_forward_flash_attn_ext_f16 takes split-KV and tiled only for
  K and V of one f16/f32 type). Per query row and head:
      K q8_0/q4_0: Qq = quantize_row_q8_0(Q); s = vec_dot_{q8_0,q4_0}_q8_0(K, Qq):
                   per 32-block acc = fma(r(f32(K.d)*f32(Qq.d)), lane sums, acc) (8 lanes, each the
                   int sum of 4 products), then hsum8
      K f16:       s = ggml_vec_dot_f16(K, f16(Q)) (as the f16 kernel)
      s = r(r(s*scale) + mask); keys whose mask is -inf are skipped
      V f16:       the f16 accumulator of the f16 kernel (rounded every key)
      V q8_0/q4_0: V32 = to_float(V row) (ggml-base: r(q*d), no FMA); s > M: ms = expf(M-s),
                   M = s, VKQ = r(VKQ*ms) (ggml_vec_scale_f32), vs = 1; else ms = 1, vs = expf(s-M);
                   VKQ = fma(V32, vs, VKQ) (ggml_vec_mad_f32); S = fma(S, ms, vs)
      out = r(VKQ * (S == 0 ? 0 : r(1/S)))
"""
from __future__ import annotations

import numpy as np

from bankml.backends.reference.attention import NEG_INF, _f32, _kq_vec_dot_f16, _normalise, _online_f16
from bankml.errors import LoweringError
from bankml.numerics.floats import f16, fma, hsum8
from bankml.ir.order import FA_REFERENCE_QK, FA_REFERENCE_QKV, FA_REFERENCE_QV, FloatOrder
from bankml.quants import q4_0, q8_0
from bankml.quants.activation import quantize_q8_0, to_bytes

f32 = np.float32
_UNPACK = {"q8_0": q8_0.unpack, "q4_0": q4_0.unpack}
_DEQUANTIZE = {"q8_0": q8_0.dequantize, "q4_0": q4_0.dequantize}


def fwht(x: np.ndarray, n: int) -> np.ndarray:
    """ggml_compute_forward_fwht on every row of n values of x (f32); same shape out."""
    y = np.asarray(x, f32).reshape(-1, n)
    y = (y * (f32(1) / np.sqrt(f32(n)))).astype(f32)
    step = 1
    while step < n:
        p = y.reshape(len(y), n // (2 * step), 2, step)
        u, v = p[:, :, 0, :], p[:, :, 1, :]
        y = np.stack([u + v, u - v], axis=2).reshape(len(y), n)
        step *= 2
    return y.reshape(np.shape(x))


def quantize_rows(x: np.ndarray, cache_type: str) -> np.ndarray:
    """Rows f32 [T, n] -> the cache's bytes [T, row_bytes] (set_rows' from_float)."""
    x = np.ascontiguousarray(x, f32).reshape(len(x), -1)
    if cache_type == "q8_0":
        return to_bytes(quantize_q8_0(x))
    if cache_type == "q4_0":
        return q4_0.quantize(x)
    raise LoweringError(f"set_rows: no reference lowering into a {cache_type} cache")


def flash_attn_quant(q: np.ndarray, k, v, k_type: str, v_type: str, Hkv: int, mask: np.ndarray, scale: float,
                     order: FloatOrder) -> np.ndarray:
    """one_chunk attention: q f32 [M, H, D]; k, v the first n_kv cells of the caches (f16
    [n_kv, Hkv, D] or block bytes [n_kv, row_bytes]); mask f16 [M, n_kv] -> f32 [M, H, D]."""
    want = {("q8_0", "f16"): FA_REFERENCE_QK, ("q4_0", "f16"): FA_REFERENCE_QK,
            ("f16", "q8_0"): FA_REFERENCE_QV, ("f16", "q4_0"): FA_REFERENCE_QV}.get((k_type, v_type), FA_REFERENCE_QKV)
    if order != want:
        raise LoweringError(f"reference backend: flash_attn over a {k_type}/{v_type} cache has no kernel "
                            f"for {order.describe()!r}")
    M, H, D = q.shape
    n_kv = len(k)
    g = H // Hkv
    q4 = np.asarray(q, f32).reshape(M, Hkv, g, D)
    m32 = np.asarray(mask, np.float16).astype(f32)
    scale = f32(scale)
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        s = np.full((M, Hkv, g, n_kv), NEG_INF, f32)
        seen = np.nonzero((m32 != NEG_INF).any(axis=0))[0]
        if seen.size:
            if k_type == "f16":
                dot = _kq_vec_dot_f16(f16(q4), np.asarray(k, np.float16)[seen].astype(f32))
            else:
                dot = _kq_vec_dot_q(q4, np.asarray(k)[seen], k_type, Hkv)
            s[..., seen] = ((dot * scale).astype(f32) + m32[:, None, None, seen]).astype(f32)
        visible = m32 != NEG_INF
        kidx = np.arange(n_kv)[None, :]
        if v_type == "f16":
            _, S, acc = _online_f16(s, visible, kidx, np.asarray(v, np.float16).astype(f32))
        else:
            v32 = _DEQUANTIZE[v_type](np.asarray(v), Hkv * D).reshape(n_kv, Hkv, D)
            _, S, acc = _online_f16(s, visible, kidx, v32, acc_round=_f32)
        out = _normalise(acc, S)
    return out.reshape(M, H, D)


def _kq_vec_dot_q(q4: np.ndarray, k_raw: np.ndarray, k_type: str, Hkv: int, block: int = 64) -> np.ndarray:
    """s[m, kvh, g, j] = vec_dot_{k_type}_q8_0(D, K[j, kvh], quantize_row_q8_0(Q[m, kvh, g]))."""
    M, _, g, D = q4.shape
    n_kv, nb = len(k_raw), D // 32
    qa = quantize_q8_0(q4.reshape(-1, D))
    qq = qa.q.reshape(M, Hkv, g, nb, 8, 4).astype(f32)
    qd = qa.d.reshape(M, Hkv, g, nb)
    ku = _UNPACK[k_type](k_raw, Hkv * D)
    kq = ku.q.reshape(n_kv, Hkv, nb, 8, 4).astype(f32)
    kd = ku.d.reshape(n_kv, Hkv, nb)
    out = np.empty((M, Hkv, g, n_kv), f32)
    for j0 in range(0, n_kv, block):
        kb, kdb = kq[j0:j0 + block], kd[j0:j0 + block]
        lanes = np.einsum("mhgbli,jhbli->mhgjbl", qq, kb)          # exact: |sum| <= 4*128*127 < 2^24
        d = (qd[:, :, :, None, :] * kdb.transpose(1, 0, 2)[None, :, None, :, :]).astype(f32)   # [M,Hkv,g,J,nb]
        acc = np.zeros(lanes.shape[:-2] + (8,), f32)
        for b in range(nb):
            acc = fma(d[..., b, None], lanes[..., b, :], acc)
        out[..., j0:j0 + block] = hsum8(acc)
    return out


