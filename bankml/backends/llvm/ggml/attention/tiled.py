"""The FA_TILED flash_attn kernel (ggml_compute_forward_flash_attn_ext_tiled); one_chunk.py's
docstring gives the float order, which this file keeps:
Q tiles of <= 64 rows of one head, K/V tiles of 64 keys converted to f32 on the stack, Q.K and
P.V as simd_gemm register tiles, the online softmax row by row in between. The steps:
  1. _scratch: the K, V, VKQ and KQ tiles, S and M on the stack;
  2. _q_tiles: this thread's Q tiles, cut as ggml cuts them, handed out zigzag; per tile (_q_tile):
  3. _reset_rows: VKQ = 0, M = -inf, S = 0 per row;
  4. _kv_tile, per KV tile of 64 keys that some row's mask sees (_tile_seen): K and V to f32
     (_load_kv), KQ = Q K^T for all rows (_simd_gemm), step 5 row by row, VKQ += P V (_simd_gemm);
  5. _online_softmax: KQ = r(r(dot*scale) + mask) (_masked_scores), tmax (_row_max), the new M,
     the VKQ and S rescale, P = ggml_v_expf(r(KQ - M)) and S's f64 sum (_softmax_live);
  6. _store_rows: out = r(VKQ * (S == 0 ? 0 : r(1/S))).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from llvmlite import ir

from bankml.backends.llvm.emit.core import (ceil_div, f32, f64, fma, for_range, i1, i8, i16, i32, i64, intrinsic,
    llama_threads, smin, v8f32)
from bankml.backends.llvm.ggml.attention.one_chunk import NEG_INF, NEG_INF_F16_BITS, Emit, flash_attn_kernel
from bankml.backends.llvm.emit.expf import v_expf_fast, v_expf_scaled
from bankml.backends.llvm.emit.simd import broadcast, const_vec, hsums, transpose8
from bankml.backends.llvm.registry import kernel
from bankml.ir.ops import Op
from bankml.ir.order import FA_TILED

v8i16 = ir.VectorType(i16, 8)
v8i32 = ir.VectorType(i32, 8)
TILE_Q = TILE_KV = 64                  # GGML_FA_TILE_Q, GGML_FA_TILE_KV (ggml-cpu/common.h)
GEMM_RM, GEMM_RN = 6, 2                # simd_gemm's AVX2 register tile: rows x vectors of 8 columns


def _simd_gemm(b, accp, C, ldc: int, A, lda: int, B, K: int, N: int, rows, zero: bool) -> None:
    """C[rows x N] (+)= A[rows x K] @ B[K x N] as ggml's simd_gemm: each C value one serial fma
    chain over k, from 0 (zero) or from C. Register tiles of GEMM_RM rows x GEMM_RN vectors; the
    last rows % GEMM_RM rows one at a time, 8 vectors a tile. Strides in floats."""
    def tile(r0, nr: int, v0: int, nv: int):
        acc = [[accp[i * nv + c] for c in range(nv)] for i in range(nr)]
        for i in range(nr):
            c_row = b.gep(C, [b.mul(b.add(r0, i64(i)), i64(ldc))])
            for c in range(nv):
                b.store(const_vec(0.0) if zero else _vload(b, c_row, i64(8 * (v0 + c))), acc[i][c])
        with for_range(b, 0, K, name="kk") as kk:
            bv = [_vload(b, B, b.add(b.mul(kk, i64(N)), i64(8 * (v0 + c)))) for c in range(nv)]
            for i in range(nr):
                a = broadcast(b, b.load(b.gep(A, [b.add(b.mul(b.add(r0, i64(i)), i64(lda)), kk)])))
                for c in range(nv):
                    b.store(fma(b, a, bv[c], b.load(acc[i][c])), acc[i][c])
        for i in range(nr):
            c_row = b.gep(C, [b.mul(b.add(r0, i64(i)), i64(ldc))])
            for c in range(nv):
                _vstore(b, b.load(acc[i][c]), c_row, i64(8 * (v0 + c)))

    nvec = N // 8
    groups = b.sdiv(rows, i64(GEMM_RM))
    with for_range(b, 0, groups, name="rg") as g:
        for v0 in range(0, nvec, GEMM_RN):
            tile(b.mul(g, i64(GEMM_RM)), GEMM_RM, v0, min(GEMM_RN, nvec - v0))
    with for_range(b, b.mul(groups, i64(GEMM_RM)), rows, name="rt") as r:
        for v0 in range(0, nvec, 8):
            tile(r, 1, v0, min(8, nvec - v0))


def _vload(b, p, off):
    return b.load(b.bitcast(b.gep(p, [off]), v8f32.as_pointer()), align=4)


def _vstore(b, x, p, off):
    b.store(x, b.bitcast(b.gep(p, [off]), v8f32.as_pointer()), align=4)


def _tile_expf(b, xs, P) -> None:
    """P[8a:8a+8] = ggml_v_expf(xs[a]). ggml_v_expf returns its fast path fma(j, k, k) in every lane
    where |n| <= 126; when that holds in all lanes of all of xs (a tile with no -inf and no score
    87 below the max) only that path is computed, else each vector's scaled lanes too."""
    fast = [v_expf_fast(b, x) for x in xs]
    slow = fast[0][1]
    for _, c, _ in fast[1:]:
        slow = b.or_(slow, c)
    any_slow = b.icmp_unsigned("!=", b.bitcast(slow, i8), i8(0))
    with b.if_else(any_slow) as (scaled, plain):
        with scaled:
            for a, (y, c, parts) in enumerate(fast):
                b.store(v_expf_scaled(b, y, c, parts), b.bitcast(b.gep(P, [i64(8 * a)]), v8f32.as_pointer()), align=32)
        with plain:
            for a, (y, _, _) in enumerate(fast):
                b.store(y, b.bitcast(b.gep(P, [i64(8 * a)]), v8f32.as_pointer()), align=32)


def _partial_i16(b, p, off, lanes: int):
    """The first `lanes` i16 at p[off] in a vector whose other lanes hold -inf's bits (a pad key)."""
    v = ir.Constant(v8i16, [NEG_INF_F16_BITS] * 8)
    for l in range(lanes):
        v = b.insert_element(v, b.load(b.gep(p, [b.add(off, i64(l))])), i32(l))
    return v


@dataclass
class _Tiles:
    """The tiled kernel's stack scratch and constants, beside its node's Emit."""
    e: Emit
    kt: ir.Value                   # the K tile in f32, transposed: [D][TILE_KV]
    vt: ir.Value                   # the V tile in f32: [TILE_KV][DV]
    vkq: ir.Value                  # the Q tile's VKQ rows: [TILE_Q][DV]
    KQ: ir.Value                   # the Q tile's scores, then P: [TILE_Q][TILE_KV]
    S: ir.Value                    # per Q tile row: S and M
    M: ir.Value
    accp: list                     # simd_gemm's register tile
    anyp: ir.Value                 # <8 x i16>: any row sees a key of the KV tile
    maxnum: ir.Function
    vmax: ir.Function
    n_full: ir.Value               # whole KV tiles
    last: int                      # the keys of a last partial tile (n_kv known and not whole tiles), else 0


def _define_tiled(e: Emit) -> None:
    """FA_TILED for the node of e, in the steps of the module's docstring."""
    t = _scratch(e)                                                # 1.
    _q_tiles(e, functools.partial(_q_tile, t))                     # 2.


def _scratch(e: Emit) -> _Tiles:
    """1. The K, V, VKQ and KQ tiles, S and M on the stack; the count of whole KV tiles."""
    b, m = e.b, e.m
    D, DV, T = e.D, e.DV, TILE_KV
    kt, vt = e.alloca(f32, D * T, "k_tile"), e.alloca(f32, T * DV, "v_tile")
    vkq, KQ = e.alloca(f32, TILE_Q * DV, "vkq"), e.alloca(f32, TILE_Q * T, "kq")     # KQ: scores, then P
    Sx, Mx = e.alloca(f32, TILE_Q, "S"), e.alloca(f32, TILE_Q, "M")
    accp = [e.alloca(v8f32, 1, f"acc{a}") for a in range(GEMM_RM * GEMM_RN)]
    anyp = e.alloca(v8i16, 1, "active")
    maxnum = intrinsic(m, "llvm.maxnum.f32", f32, [f32, f32])
    vmax = intrinsic(m, "llvm.x86.avx.max.ps.256", v8f32, [v8f32, v8f32])
    if e.kv_static is None:            # KV cells come in 256s (llama_kv_cache::get_n_kv): whole tiles
        n_full, last = b.sdiv(e.n_kv, i64(T)), 0
    else:
        n_full, last = divmod(e.kv_static, T)
        n_full = i64(n_full)            # the last partial tile starts at n_full * T = kv - last
    return _Tiles(e, kt, vt, vkq, KQ, Sx, Mx, accp, anyp, maxnum, vmax, n_full, last)


def _q_tile(t: _Tiles, ir0, R) -> None:
    """2. One Q tile, rows ir0 = h*M + m .. + R of head h: 3., 4. per KV tile, 6. (ggml's tile loop)."""
    e = t.e
    b = e.b
    h, row0 = b.sdiv(ir0, e.M), b.srem(ir0, e.M)
    hk = b.sdiv(h, i64(e.grp))
    _reset_rows(t, R)
    with for_range(b, 0, t.n_full, name="kvt") as kvt:
        _kv_tile(t, row0, R, h, hk, b.mul(kvt, i64(TILE_KV)), TILE_KV)
    if t.last:
        _kv_tile(t, row0, R, h, hk, i64(e.kv_static - t.last), t.last)
    _store_rows(t, row0, R, h)


def _reset_rows(t: _Tiles, R) -> None:
    """3. Each row's VKQ = 0, M = -inf, S = 0."""
    e = t.e
    b = e.b
    with for_range(b, 0, R, name="ir") as r:
        e.reset(b.gep(t.vkq, [b.mul(r, i64(e.DV))]), None, None)
        b.store(f32(NEG_INF), b.gep(t.M, [r]))
        b.store(f32(0.0), b.gep(t.S, [r]))


def _kv_tile(t: _Tiles, row0, R, h, hk, ic, kc: int) -> None:
    """4. KV tile [ic, ic+kc) for Q rows row0..row0+R of head h, if a row sees a key: KQ = Q K^T, 5., VKQ += P V."""
    e = t.e
    b, D, DV, T = e.b, e.D, e.DV, TILE_KV
    with b.if_then(_tile_seen(t, row0, R, ic, kc)):
        _load_kv(t, hk, ic, kc)
        q0 = b.gep(e.q, [b.mul(b.add(b.mul(row0, i64(e.H)), h), i64(D))])
        _simd_gemm(b, t.accp, t.KQ, T, q0, e.H * D, t.kt, D, T, R, zero=True)      # KQ = Q K^T, all rows
        with for_range(b, 0, R, name="sr") as r:
            _online_softmax(t, b.add(row0, r), r, ic, kc)
        _simd_gemm(b, t.accp, t.vkq, DV, t.KQ, T, t.vt, T, DV, R, zero=False)     # VKQ += P V, all rows


def _tile_seen(t: _Tiles, row0, R, ic, kc: int) -> ir.Value:
    """4. i1: a row of the Q tile has a mask other than -inf in keys [ic, ic+kc)."""
    e = t.e
    b = e.b
    b.store(ir.Constant(v8i16, [0] * 8), t.anyp)              # any row sees any key here?
    with for_range(b, 0, R, name="ar") as r:                   # (explicit vectors: LLVM would
        moff = b.add(b.mul(b.add(row0, r), e.n_kv), ic)         # otherwise vectorise over rows)
        seen = b.load(t.anyp)
        for a in range(0, kc, 8):
            lanes = min(8, kc - a)
            bits = b.load(b.bitcast(b.gep(e.mask16, [b.add(moff, i64(a))]), v8i16.as_pointer()), align=2) \
                if lanes == 8 else _partial_i16(b, e.mask16, b.add(moff, i64(a)), lanes)
            ne = b.icmp_unsigned("!=", bits, ir.Constant(v8i16, [NEG_INF_F16_BITS] * 8))
            seen = b.or_(seen, b.sext(ne, v8i16))
        b.store(seen, t.anyp)
    return b.icmp_unsigned("!=", b.bitcast(b.load(t.anyp), ir.IntType(128)), ir.IntType(128)(0))


def _load_kv(t: _Tiles, hk, ic, kc: int) -> None:
    """4. Keys [ic, ic+kc) of K/V head hk to f32: K transposed into kt[d][j], V into vt[j][d], pad keys 0."""
    e = t.e
    b, D, DV, T = e.b, e.D, e.DV, TILE_KV
    kc8 = kc // 8 * 8
    with for_range(b, 0, kc8, step=8, name="kg") as j0:    # K -> f32, transposed: kt[d][j],
        for d in range(0, D, 8):                           # 8 keys x 8 d at a time
            x = [e.hload(e.k, e.kv_off(b.add(ic, b.add(j0, i64(l))), hk, d)) for l in range(8)]
            for l, y in enumerate(transpose8(b, x)):
                e.vstore(y, t.kt, b.add(i64((d + l) * T), j0), 32)
    if kc8 < kc:
        with for_range(b, kc8, kc, name="kj") as j:
            base = e.kv_off(b.add(ic, j), hk)
            for d in range(0, D, 8):
                x = e.hload(e.k, b.add(base, i64(d)))
                for l in range(8):
                    at = b.add(b.mul(i64(d + l), i64(T)), j)
                    b.store(b.extract_element(x, i32(l)), b.gep(t.kt, [at]))
    with for_range(b, 0, kc, name="vj") as j:
        base = e.kv_off(b.add(ic, j), hk)
        for d in range(0, DV, 8):                          # V -> f32: vt[j][d]
            e.vstore(e.hload(e.v, b.add(base, i64(d))), t.vt, b.add(b.mul(j, i64(DV)), i64(d)), 32)
    if kc < T:                                             # pad keys: zeros
        with for_range(b, kc, T, name="pj") as j:
            with for_range(b, 0, D, name="pd") as d:
                b.store(f32(0.0), b.gep(t.kt, [b.add(b.mul(d, i64(T)), j)]))
            with for_range(b, 0, DV // 8, name="pv") as d:
                e.vstore(const_vec(0.0), t.vt, b.add(b.mul(j, i64(DV)), b.mul(d, i64(8))), 32)


def _online_softmax(t: _Tiles, mrow, r, ic, kc: int) -> None:
    """5. Row r's online softmax step (ggml's tiled one): its scores and tmax, then P (else 0) in place of KQ[r]."""
    e = t.e
    b = e.b
    prow = b.gep(t.KQ, [b.mul(r, i64(TILE_KV))])
    kq = _masked_scores(t, prow, mrow, ic, kc)
    tmax = _row_max(t, kq)
    vrow = b.mul(r, i64(e.DV))
    with b.if_else(b.fcmp_unordered("!=", tmax, f32(NEG_INF))) as (live, dead):
        with live:
            _softmax_live(t, r, prow, vrow, kq, tmax)
        with dead:
            for a in range(8):
                e.vstore(const_vec(0.0), prow, i64(8 * a), 32)


def _masked_scores(t: _Tiles, prow, mrow, ic, kc: int) -> list:
    """5. The row's 64 scores r(r(dot*scale) + mask) as 8 vectors; pad keys -inf."""
    e = t.e
    b = e.b
    kq = []
    for a in range(8):
        sc = b.fmul(e.vload(prow, i64(8 * a), 32), broadcast(b, e.scale))
        lanes = [8 * a + l < kc for l in range(8)]
        if all(lanes):
            mk = e.hload(e.mask, b.add(b.mul(mrow, e.n_kv), b.add(ic, i64(8 * a))))
        else:
            valid = ir.Constant(ir.VectorType(i1, 8), [int(x) for x in lanes])
            sc = b.select(valid, sc, const_vec(NEG_INF))
            mk = const_vec(NEG_INF)
            for l in range(8):
                if lanes[l]:
                    mk = b.insert_element(mk, e.mask32(mrow, b.add(ic, i64(8 * a + l))), i32(l))
        kq.append(b.fadd(sc, mk))
    return kq


def _row_max(t: _Tiles, kq: list) -> ir.Value:
    """5. tmax = max(KQ) of the row, in any order (no NaN scores; a zero M's sign never reaches a bit)."""
    b = t.e.b
    vm = kq[0]
    for a in range(1, 8):
        vm = b.call(t.vmax, [vm, kq[a]])
    for idx in ([4, 5, 6, 7, 0, 1, 2, 3], [2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
        vm = b.call(t.vmax, [vm, b.shuffle_vector(vm, vm, ir.Constant(v8i32, idx))])
    return b.extract_element(vm, i32(0))


def _softmax_live(t: _Tiles, r, prow, vrow, kq: list, tmax) -> None:
    """5. The new M, VKQ and S rescaled, P = ggml_v_expf(r(KQ - M)) and S's f64 sum (ggml_vec_soft_max_f32)."""
    # Mn = fmaxf(M, tmax); Mn > M: ms = expf(M - Mn), VKQ = r(VKQ*ms), S = r(S*ms); M = Mn;
    # P = ggml_v_expf(r(KQ - Mn)); S = (float)((double)S + sum_c (double)hsum8(P_c))
    e = t.e
    b = e.b
    mp, sp = b.gep(t.M, [r]), b.gep(t.S, [r])
    m_old = b.load(mp)
    m_new = b.call(t.maxnum, [m_old, tmax])
    with b.if_then(b.fcmp_ordered(">", m_new, m_old)):
        ms = b.call(e.expf, [b.fsub(m_old, m_new)])
        msb = broadcast(b, ms)
        for i in range(0, e.DV, 8):
            at = b.add(vrow, i64(i))
            e.vstore(b.fmul(e.vload(t.vkq, at, 32), msb), t.vkq, at, 32)
        b.store(b.fmul(b.load(sp), ms), sp)
    b.store(m_new, mp)
    mb = broadcast(b, m_new)
    _tile_expf(b, [b.fsub(kq[a], mb) for a in range(8)], prow)    # ggml_vec_soft_max_f32
    psum = f64(0.0)
    for p in hsums(b, [e.vload(prow, i64(8 * a), 32) for a in range(8)]):
        psum = b.fadd(psum, b.fpext(p, f64))
    b.store(b.fptrunc(b.fadd(b.fpext(b.load(sp), f64), psum), f32), sp)


def _store_rows(t: _Tiles, row0, R, h) -> None:
    """6. Each row's out = r(VKQ * (S == 0 ? 0 : r(1/S)))."""
    e = t.e
    b, DV = e.b, e.DV
    with for_range(b, 0, R, name="or") as r:
        out_off = b.mul(b.add(b.mul(b.add(row0, r), i64(e.H)), h), i64(DV))
        e.store_normalised(b.gep(t.vkq, [b.mul(r, i64(DV))]), b.load(b.gep(t.S, [r])), out_off)


def _q_tiles(e: Emit, q_tile) -> None:
    """q_tile(first row ir = h*M + m, rows) for this thread's Q tiles: the cut of
    backends/reference/attention.py:q_tiles at run time (M rows, llama_threads), tiles handed
    to threads in the order it lists them, zigzag (threads 0, 1, .., nth-1, then nth-1, .., 0):
    a causal prompt's tiles grow in cost along each head, and round-robin gave the last
    thread 11% more of a 512-row prompt's work than the first (zigzag: equal). Each tile is
    computed by one thread alone, so the owner never changes a bit."""
    b = e.b
    nr = b.mul(e.M, i64(e.H), name="nr")
    nt = llama_threads(b, e.dims)
    chunk = ceil_div(b, nr, b.mul(nt, i64(4)))
    nchunk = ceil_div(b, nr, chunk)
    nchunk = b.select(b.or_(b.icmp_signed("==", nt, i64(1)), b.icmp_signed("<", nchunk, nt)), nt, nchunk)
    dr = ceil_div(b, nr, nchunk)
    tile_no, irp = e.alloca(i64, 1, "tile_no"), e.alloca(i64, 1, "ir")
    b.store(i64(0), tile_no)
    with for_range(b, 0, nchunk, name="qc") as c:
        ir0 = b.mul(dr, c)
        ir1 = smin(b, b.add(ir0, dr), nr)
        b.store(ir0, irp)
        with for_range(b, 0, dr, name="qstep"):                  # at most dr tiles in a chunk
            at = b.load(irp)
            with b.if_then(b.icmp_signed("<", at, ir1)):
                rows = smin(b, smin(b, i64(TILE_Q), b.sub(ir1, at)), b.sub(e.M, b.srem(at, e.M)))
                t = b.load(tile_no)
                p = b.srem(t, b.mul(e.nth, i64(2)))                   # zigzag: 0, 1, .., nth-1, nth-1, .., 0
                owner = b.select(b.icmp_signed("<", p, e.nth), p, b.sub(b.sub(b.mul(e.nth, i64(2)), i64(1)), p))
                with b.if_then(b.icmp_signed("==", owner, e.ith)):
                    q_tile(at, rows)
                b.store(b.add(t, i64(1)), tile_no)
                b.store(b.add(at, rows), irp)


define_tiled = kernel(Op.FLASH_ATTN, order=FA_TILED)(flash_attn_kernel(_define_tiled))
