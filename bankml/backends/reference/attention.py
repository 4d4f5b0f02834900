"""flash_attn_ext in ggml's float order: the three CPU kernels (GGML_MAP §5, ggml-cpu/ops.cpp).

Shapes (numpy order): q f32 [M, n_head, D]; k, v f16 [n_kv, n_head_kv, D]; mask f16 [M, n_kv]
holding 0 or -inf (llama_kv_cache::set_input_kq_mask); out f32 [M, n_head, DV], i.e. ggml's
[DV, n_head, M]. Head h reads kv head h // (n_head // n_head_kv). Internally rows are
[M, n_head_kv, group, ...] so a kv head broadcasts over its group.

- FA_REFERENCE, ggml_compute_forward_flash_attn_ext_f16_one_chunk: Q rounded to f16, K.Q by
  ggml_vec_dot_f16, masked (-inf) keys skipped, an f16 V accumulator rounded every key, glibc expf.
- FA_SPLIT, the split-KV branch of ggml_compute_forward_flash_attn_ext_f16 (one query row,
  n_kv >= 512): one_chunk over key chunks of ceil(n_kv / n_threads), combined in chunk order by
  ggml_flash_attn_ext_reduce_partials. The bits depend on n_threads (llama.cpp's -t).
- FA_TILED, ggml_compute_forward_flash_attn_ext_tiled (M >= 64): f32 Q, simd_gemm's serial fma
  chains, ggml_v_expf probabilities, an f64 row sum in ggml_vec_soft_max_f32's hsum8 order.

Every row is independent, so each kernel is vectorised over query rows and heads; the one_chunk
recurrence is sequential over keys only through its V accumulator.
"""
from __future__ import annotations

import numpy as np

from bankml.errors import LoweringError
from bankml.numerics.expf import ggml_v_expf
from bankml.numerics.floats import fma
from bankml.numerics.floats import f16, f32x8_reduce, hsum8
from bankml.ir.order import FA_REFERENCE, FA_SPLIT, FA_TILED, FloatOrder
from bankml.numerics.libm import expf

f32, f64 = np.float32, np.float64
NEG_INF = f32(-np.inf)
TILE_Q = TILE_KV = 64           # GGML_FA_TILE_Q, GGML_FA_TILE_KV (ggml-cpu/common.h)


def flash_attn(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
               order: FloatOrder, n_threads: int = 1) -> np.ndarray:
    """softmax(scale * q.k + mask) @ v per head, with the bits of the ggml kernel named by order.kernel."""
    M, H, D = q.shape
    n_kv, Hkv, _ = k.shape
    if H % Hkv or k.shape[2] != D or v.shape[:2] != k.shape[:2]:
        raise LoweringError(f"reference backend: flash_attn shapes q{q.shape} k{k.shape} v{v.shape} do not fit")
    g, DV = H // Hkv, v.shape[2]
    q4 = np.asarray(q, f32).reshape(M, Hkv, g, D)
    k32 = np.asarray(k, np.float16).astype(f32)                     # exact, as ggml_cpu_fp16_to_fp32
    v32 = np.asarray(v, np.float16).astype(f32)
    m32 = np.zeros((M, n_kv), f32) if mask is None else np.asarray(mask, np.float16).astype(f32)
    scale = f32(scale)
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        if order == FA_REFERENCE:
            out = _one_chunk(q4, k32, v32, m32, scale)
        elif order == FA_SPLIT:
            if M != 1:
                raise LoweringError(f"reference backend: split-KV attention takes 1 query row, not {M}")
            out = _split_kv(q4, k32, v32, m32, scale, n_threads)
        elif order == FA_TILED:
            out = _tiled(q4, k32, v32, m32, scale, n_threads)
        else:
            raise LoweringError(f"reference backend: no flash_attn kernel for {order.describe()!r}")
    return out.reshape(M, H, DV)


# ---- one_chunk and split-KV ---------------------------------------------------------------

def _kq_vec_dot_f16(qh: np.ndarray, k32: np.ndarray, block: int = 128) -> np.ndarray:
    """s[m, kvh, g, j] = ggml_vec_dot_f16(D, K[j, kvh], Qh[m, kvh, g]) for every key j.

    AVX2: four 8-lane accumulators, acc[a] = fma(K[i+8a..], Q[i+8a..], acc[a]) for i in steps of 32,
    GGML_F32x8_REDUCE, then an f64 tail of r(K*Q) for D % 32 and a final (float).
    """
    M, Hkv, g, D = qh.shape
    n_kv = k32.shape[0]
    body = D - D % 32
    kt = k32.transpose(1, 0, 2)                                     # [Hkv, n_kv, D]
    out = np.empty((M, Hkv, g, n_kv), f32)
    for b0 in range(0, n_kv, block):
        kb = kt[None, :, None, b0:b0 + block, :]                    # [1, Hkv, 1, nb, D]
        qb = qh[:, :, :, None, :]                                   # [M, Hkv, g, 1, D]
        accs = [np.zeros(np.broadcast_shapes(kb.shape[:-1], qb.shape[:-1]) + (8,), f32) for _ in range(4)]
        for i in range(0, body, 32):
            for a in range(4):
                lane = slice(i + 8 * a, i + 8 * a + 8)
                accs[a] = fma(kb[..., lane], qb[..., lane], accs[a])
        res = f32x8_reduce(accs).astype(f64)
        for i in range(body, D):
            res += (kb[..., i] * qb[..., i]).astype(f64)            # r(x*y) is exact for f16*f16
        out[..., b0:b0 + block] = res.astype(f32)
    return out


def _scores(q4: np.ndarray, k32: np.ndarray, m32: np.ndarray, scale: np.float32) -> np.ndarray:
    """one_chunk's s = r(r(vec_dot_f16(K, f16(Q)) * scale) + mask) (two roundings, no FMA).

    Keys no row can see are skipped by the kernel, so their scores are left at -inf here.
    """
    M, Hkv, g, _ = q4.shape
    seen = np.nonzero((m32 != NEG_INF).any(axis=0))[0]
    s = np.full((M, Hkv, g, k32.shape[0]), NEG_INF, f32)
    if seen.size:
        dot = (_kq_vec_dot_f16(f16(q4), k32[seen]) * scale).astype(f32)
        s[..., seen] = (dot + m32[:, None, None, seen]).astype(f32)
    return s


def _online_f16(s: np.ndarray, visible: np.ndarray, kidx: np.ndarray, v32: np.ndarray, acc_round=f16):
    """The one_chunk loop over keys for rows [R, Hkv, g] at once; returns (M, S, VKQ16 as f32).

    s [R, Hkv, g, L] scores; visible [R, L] (mask != -inf: others are skipped, no update);
    kidx [R or 1, L] the V row of each step. Per visible key, in order:
        s > M : ms = expf(M - s); M = s; VKQ = f16(VKQ*ms); vs = 1   (ggml_vec_scale_f16)
        else  : ms = 1; vs = expf(s - M)                               (ties s == M land here)
        VKQ = f16(fma(V, vs, VKQ))                                     (ggml_vec_mad_f16)
        S = fma(S, ms, vs)                                             (GCC-contracted)
    M is a running max, so ms and vs for all keys come from one vectorised glibc expf call.
    acc_round: f16 (an f16 V, the f16 accumulator); with a quantized V, ggml dequantizes each row
    into an f32 accumulator (ggml_vec_scale_f32, ggml_vec_mad_f32): _f32, no rounding.
    """
    R, Hkv, g, L = s.shape
    vis = visible[:, None, None, :]
    run = np.maximum.accumulate(np.where(vis, s, NEG_INF), axis=-1)
    m_old = np.concatenate([np.full(run.shape[:-1] + (1,), NEG_INF), run[..., :-1]], axis=-1)
    new = vis & (s > m_old)
    e = expf(np.where(new, m_old - s, np.where(vis, s - m_old, f32(0))).astype(f32))
    ms, vs = np.where(new, e, f32(1)), np.where(new, f32(1), e)

    acc = np.zeros((R, Hkv, g, v32.shape[2]), f32)
    S = np.zeros((R, Hkv, g), f32)
    for j in range(L):
        rows = visible[:, j]
        if not rows.any():
            continue
        if new[..., j].any():
            acc = acc_round(acc * ms[..., j, None])
        vj = v32[kidx[:, j]][:, :, None, :]                         # [R or 1, Hkv, 1, DV]
        acc_j = acc_round(fma(vj, vs[..., j, None], acc))
        S_j = fma(S, ms[..., j], vs[..., j])
        if rows.all():
            acc, S = acc_j, S_j
        else:
            acc = np.where(rows[:, None, None, None], acc_j, acc)
            S = np.where(rows[:, None, None], S_j, S)
    return run[..., -1], S, acc


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(f32)


def _normalise(acc: np.ndarray, S: np.ndarray) -> np.ndarray:
    """V /= S as ggml does it: multiply by S_inv = (S == 0 ? 0 : 1/S)."""
    s_inv = np.where(S == 0, f32(0), (f32(1) / S).astype(f32))
    return (acc * s_inv[..., None]).astype(f32)


def _one_chunk(q4, k32, v32, m32, scale):
    s = _scores(q4, k32, m32, scale)
    visible = m32 != NEG_INF
    kidx = np.arange(k32.shape[0])[None, :]
    _, S, acc = _online_f16(s, visible, kidx, v32)
    return _normalise(acc, S)


def _split_kv(q4, k32, v32, m32, scale, n_threads):
    """Chunk c = keys [c*cs, min((c+1)*cs, n_kv)), cs = ceil(n_kv/nth); chunks run side by side."""
    n_kv = k32.shape[0]
    cs = -(-n_kv // n_threads)
    n_chunks = -(-n_kv // cs)                                       # chunks with ic_start < n_kv
    s = _scores(q4, k32, m32, scale)[0]                             # [Hkv, g, n_kv]
    idx = np.arange(n_chunks * cs).reshape(n_chunks, cs)
    inside = idx < n_kv
    idx = np.minimum(idx, n_kv - 1)
    visible = inside & (m32[0][idx] != NEG_INF)
    s_c = np.moveaxis(s[..., idx], 2, 0)                            # [C, Hkv, g, cs]
    Mc, Sc, accc = _online_f16(s_c, visible, idx, v32)
    return _reduce_partials(Mc, Sc, accc)[None]


def _reduce_partials(Mc, Sc, accc):
    """ggml_flash_attn_ext_reduce_partials, chunks in order, skipping S_c == 0 (checked in the .so):
        Mn = fmaxf(M, M_c); a = expf(M - Mn); b = expf(M_c - Mn)
        VKQ = fma(VKQ, a, r(VKQ_c*b)); S = fma(S, a, r(S_c*b)); M = Mn
        out = S != 0 ? r(VKQ * r(1/S)) : VKQ
    """
    M = np.full(Mc.shape[1:], NEG_INF)
    S = np.zeros(Mc.shape[1:], f32)
    acc = np.zeros(accc.shape[1:], f32)
    for c in range(Mc.shape[0]):
        use = Sc[c] != 0
        if not use.any():
            continue
        mn = np.fmax(M, Mc[c])
        a, b = expf((M - mn).astype(f32)), expf((Mc[c] - mn).astype(f32))
        acc_n = fma(acc, a[..., None], (accc[c] * b[..., None]).astype(f32))
        S_n = fma(S, a, (Sc[c] * b).astype(f32))
        acc = np.where(use[..., None], acc_n, acc)
        S, M = np.where(use, S_n, S), np.where(use, mn, M)
    s_inv = (f32(1) / S).astype(f32)
    return np.where((S != 0)[..., None], (acc * s_inv[..., None]).astype(f32), acc)


# ---- tiled ------------------------------------------------------------------------------

def _tile_plan(m32: np.ndarray, H: int, n_threads: int) -> np.ndarray:
    """active[h, m, t]: is KV tile t computed for row m of head h, or skipped with its whole Q tile?

    Q tiles follow ggml_compute_forward_flash_attn_ext_f16: rows ir = h*M + m are cut into
    chunks of dr (4 chunks per thread), and each chunk into tiles of <= 64 rows of one head.
    A KV tile is skipped for a Q tile when every valid row's mask there is -inf. Skipped or not,
    a fully masked row changes nothing (up to the sign of a -0 accumulator), so only signed
    zeros could depend on n_threads.
    """
    M, n_kv = m32.shape
    n_tiles = -(-n_kv // TILE_KV)
    pad = np.full((M, n_tiles * TILE_KV), NEG_INF, f32)
    pad[:, :n_kv] = m32
    row_masked = (pad.reshape(M, n_tiles, TILE_KV) == NEG_INF).all(axis=2)     # [M, T]
    active = np.zeros((M * H, n_tiles), bool)
    for ir, rows in q_tiles(M, H, n_threads):
        m0 = ir % M
        active[ir:ir + rows] = ~row_masked[m0:m0 + rows].all(axis=0)
    return active.reshape(H, M, n_tiles)


def q_tiles(M: int, H: int, n_threads: int) -> list[tuple[int, int]]:
    """(first row ir = h*M + m, rows) of every Q tile: ggml_compute_forward_flash_attn_ext_f16 cuts
    the rows into chunks of dr (4 chunks per thread), each chunk into <= 64 rows of one head."""
    nr = M * H
    chunk = -(-nr // (4 * n_threads))
    nchunk = -(-nr // chunk)
    if n_threads == 1 or nchunk < n_threads:
        nchunk = n_threads
    dr = -(-nr // nchunk)
    tiles = []
    for c in range(nchunk):
        ir, ir1 = dr * c, min(dr * c + dr, nr)
        while ir < ir1:
            rows = min(TILE_Q, ir1 - ir, M - ir % M)
            tiles.append((ir, rows))
            ir += rows
    return tiles


def _tiled(q4, k32, v32, m32, scale, n_threads):
    """ggml_compute_forward_flash_attn_ext_tiled, per row r and KV tile of 64 keys:
        KQ = serial fma chain over d from 0 (simd_gemm); KQ = r(KQ*scale); pad keys = -inf; KQ = r(KQ+mask)
        tmax = max(KQ); if tmax == -inf: P = 0 (row skipped)
        else: Mn = fmaxf(M, tmax); if Mn > M: ms = expf(M-Mn); VKQ = r(VKQ*ms); S = r(S*ms)
              M = Mn; P = ggml_v_expf(r(KQ - Mn)); S = (float)((double)S + sum_c (double)hsum8(P[8c:8c+8]))
        VKQ = serial fma chain over the tile's 64 keys of P[k]*V[k] (simd_gemm), continuing
    out = r(VKQ * (S == 0 ? 0 : r(1/S))).
    Rows of a computed tile run the whole V chain, P = 0 included (fma(V, 0, -0) is +0), as in ggml.
    A last partial KV tile (n_kv % 64 != 0; llama.cpp pads n_kv to 256) pads V with zeros, where
    ggml multiplies 0 by stale scratch rows: only the sign of a -0 accumulator could differ there.
    """
    M, Hkv, g, D = q4.shape
    n_kv, DV = k32.shape[0], v32.shape[2]
    active = _tile_plan(m32, Hkv * g, n_threads).reshape(Hkv, g, M, -1)
    qt = q4.transpose(1, 2, 0, 3)                                   # [Hkv, g, M, D]
    vkq = np.zeros((Hkv, g, M, DV), f32)
    S = np.zeros((Hkv, g, M), f32)
    Mx = np.full((Hkv, g, M), NEG_INF)
    for t, ic in enumerate(range(0, n_kv, TILE_KV)):
        kt = min(TILE_KV, n_kv - ic)
        act_all = active[..., t]
        rows = np.nonzero(act_all.any(axis=(0, 1)))[0]
        if rows.size == 0:
            continue
        act = act_all[:, :, rows]
        kq = np.zeros((Hkv, g, rows.size, kt), f32)
        qr, kk = qt[:, :, rows, :], k32[ic:ic + kt].transpose(1, 0, 2)[:, None, None, :, :]
        for d in range(D):
            kq = fma(qr[..., d, None], kk[..., d], kq)
        kq = (kq * scale).astype(f32)
        full = np.full((Hkv, g, rows.size, TILE_KV), NEG_INF, f32)
        mask_t = np.full((rows.size, TILE_KV), NEG_INF, f32)
        mask_t[:, :kt] = m32[rows, ic:ic + kt]
        full[..., :kt] = kq
        kq = (full + mask_t).astype(f32)

        tmax = kq.max(axis=-1)
        live = act & (tmax != NEG_INF)
        m_old, s_old, v_old = Mx[:, :, rows], S[:, :, rows], vkq[:, :, rows]
        m_new = np.fmax(m_old, tmax)
        grow = live & (m_new > m_old)
        ms = expf(np.where(grow, m_old - m_new, f32(0)).astype(f32))
        v_r = np.where(grow[..., None], (v_old * ms[..., None]).astype(f32), v_old)
        s_r = np.where(grow, (s_old * ms).astype(f32), s_old)
        p = np.where(live[..., None], ggml_v_expf((kq - m_new[..., None]).astype(f32)), f32(0))
        psum = np.zeros(s_r.shape, f64)
        for c in range(TILE_KV // 8):
            psum = psum + hsum8(p[..., 8 * c:8 * c + 8]).astype(f64)
        s_r = np.where(live, (s_r.astype(f64) + psum).astype(f32), s_r)

        vt = np.zeros((TILE_KV, Hkv, DV), f32)
        vt[:kt] = v32[ic:ic + kt]
        for j in range(TILE_KV):
            v_r = fma(vt[j][:, None, None, :], p[..., j, None], v_r)
        Mx[:, :, rows] = np.where(live, m_new, m_old)
        S[:, :, rows] = np.where(act, s_r, s_old)
        vkq[:, :, rows] = np.where(act[..., None], v_r, v_old)
    return _normalise(vkq, S).transpose(2, 0, 1, 3)                 # [M, Hkv, g, DV]
