"""FLASH_ATTN kernels (GGML_MAP §5): one_chunk, split-KV and tiled, by n.order, with the bits of
bankml/backends/reference/attention.py:flash_attn.

Inputs q f32 [M, n_head, D]; k, v the f16 caches [kv_size, n_head_kv, D] of which the first
n_kv cells are read (n_kv = the mask's width = the SET_ROWS node's shape[0]); mask f16 [M, n_kv].
Out f32 [M, n_head, DV]. Head h reads kv head h // (n_head // n_head_kv).

- FA_REFERENCE (ggml_compute_forward_flash_attn_ext_f16_one_chunk), per (row, head), split over
  threads: Q rounded to f16; per key whose mask is not -inf, in order:
      s = r(r(vec_dot_f16(K, Q16) * scale) + mask)       # 4x8 fma accumulators, GGML_F32x8_REDUCE
      s > M: ms = expf(M - s), M = s, VKQ = f16(VKQ*ms), vs = 1;  else ms = 1, vs = expf(s - M)
      VKQ = f16(fma(V, vs, VKQ));  S = fma(S, ms, vs)                # glibc expf
  out = r(VKQ * (S == 0 ? 0 : r(1/S))).
  Keys run in blocks of BLOCK_KV: first the scalar chain (s, M, S, expf) of the block's visible keys,
  then their VKQ updates, so the VKQ loop holds no call and keeps VKQ in registers (same order per value).
- FA_SPLIT (one row, n_kv >= 512): per head (split over threads), the one_chunk loop over key
  chunks of ceil(n_kv / llama_threads) (dims[4]), then ggml_flash_attn_ext_reduce_partials in
  chunk order (chunks with S_c == 0 skipped):
      Mn = fmaxf(M, M_c); a = expf(M - Mn); b = expf(M_c - Mn)
      VKQ = fma(VKQ, a, r(VKQ_c*b)); S = fma(S, a, r(S_c*b)); M = Mn
      out = S != 0 ? r(VKQ * r(1/S)) : VKQ
- FA_TILED (ggml_compute_forward_flash_attn_ext_tiled): Q tiles of <= 64 rows of one head, cut
  as ggml cuts them for llama_threads (computed at run time, _q_tiles), handed to threads
  round-robin; K/V tiles of 64 keys converted to f32 on the stack (K transposed, so 8 keys share
  a vector and each lane is simd_gemm's serial fma chain over d). A KV tile is skipped for a Q tile
  when every row's mask there is -inf. In a computed tile, Q.K for all rows, then their softmax
  steps, then P.V for all rows (so the K tile, then the V tile, stays in L1), both products as
  ggml's simd_gemm in register tiles of 6 rows x 16 columns (_simd_gemm). Per row:
      KQ = r(dot*scale); pad keys -inf; KQ = r(KQ + mask); tmax = max(KQ)
      tmax != -inf: Mn = fmaxf(M, tmax); Mn > M: ms = expf(M - Mn), VKQ = r(VKQ*ms), S = r(S*ms)
                    M = Mn; P = ggml_v_expf(r(KQ - Mn)); S = (float)((double)S + sum_c (double)hsum8(P_c))
      else P = 0;   VKQ = serial fma chain over the 64 keys of V[k]*P[k]
  out = r(VKQ * (S == 0 ? 0 : r(1/S))).
  ggml_v_expf's slow path (|n| > 126 in some lane) is computed only for a row whose scores need it.

Scratch lives on the stack (allocas in the entry block): a few KiB for one_chunk/split, about
(64*D + 2*64*DV + 64*64 + 200) floats for tiled (112 KiB at D = 128).
"""
from __future__ import annotations


import numpy as np
from llvmlite import ir

from bankml.backends.llvm.common import (ceil_div, dim, f16, f32, f64, fma, for_range, i1, i8, i16, i32, i64, intrinsic,
                                         llama_threads, new_function, smin, thread_range, typed, v8f32)
from bankml.backends.llvm.kernels_glu import broadcast, splat, v_expf
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import Dim, upper
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FA_QUANT_CACHE, FA_REFERENCE, FA_SPLIT, FA_TILED

v8f16 = ir.VectorType(f16, 8)
v8i16 = ir.VectorType(i16, 8)
v8i32 = ir.VectorType(i32, 8)
NEG_INF_F16_BITS = 0xFC00
TILE_Q = TILE_KV = 64                  # GGML_FA_TILE_Q, GGML_FA_TILE_KV (ggml-cpu/common.h)
GEMM_RM, GEMM_RN = 6, 2                # simd_gemm's AVX2 register tile: rows x vectors of 8 columns
BLOCK_KV = 64                          # keys per block of our one_chunk loop (its two passes)
NEG_INF = float("-inf")


class _Emit:
    """Pointers, dimensions and small emit helpers of one flash_attn kernel."""

    def __init__(self, g: Graph, n: Node, fn: ir.Function, b: ir.IRBuilder):
        self.b, self.m = b, b.module
        out, q, k, v, mask, self.ith, self.nth, self.dims = fn.args
        M, self.H, self.DV = n.shape
        qn, kn, vn, mn = (g[i] for i in n.inputs)
        self.D, self.Hkv, n_kv = qn.shape[2], kn.shape[1], mn.shape[1]
        if (qn.shape[:2] != (M, self.H) or self.H % self.Hkv or kn.shape[2] != self.D
                or vn.shape[1:] != (self.Hkv, self.DV) or mn.shape[0] != M
                or min(upper(kn.shape[:1] + vn.shape[:1])) < upper((n_kv,))[0] or self.D % 8 or self.DV % 8):
            raise LoweringError(f"llvm backend: flash_attn shapes q{qn.shape} k{kn.shape} v{vn.shape} "
                                f"mask{mn.shape} out{n.shape} do not fit ({n.name or n.id})")
        self.grp = self.H // self.Hkv
        self.M_static = None if isinstance(M, Dim) else M             # rows, when known at compile time
        self.kv_static = None if isinstance(n_kv, Dim) else n_kv      # cells, likewise
        self.M, self.n_kv = dim(b, self.dims, M), dim(b, self.dims, n_kv)   # i64 values of this call
        self.out, self.q = typed(b, out, f32), typed(b, q, f32)
        self.k, self.v = typed(b, k, f16), typed(b, v, f16)
        self.mask, self.mask16 = typed(b, mask, f16), typed(b, mask, i16)
        self.scale = f32(float(np.float32(n.params["scale"])))
        self.expf = intrinsic(self.m, "expf", f32, [f32])

    # -- memory --------------------------------------------------------------------------
    def alloca(self, t: ir.Type, count: int = 1, name: str = "") -> ir.Value:
        """Stack scratch in the entry block (32-byte aligned), as f32* / t*."""
        b = self.b
        with b.goto_entry_block():
            a = b.alloca(ir.ArrayType(t, count), name=name)
            a.align = 32
            p = b.gep(a, [i32(0), i32(0)])
        return p

    def vload(self, p, off, align=4):
        return self.b.load(self.b.bitcast(self.b.gep(p, [off]), v8f32.as_pointer()), align=align)

    def vstore(self, x, p, off, align=4):
        self.b.store(x, self.b.bitcast(self.b.gep(p, [off]), v8f32.as_pointer()), align=align)

    def hload(self, p, off):
        """8 halves at p[off] as f32 (vcvtph2ps, exact)."""
        h = self.b.load(self.b.bitcast(self.b.gep(p, [off]), v8f16.as_pointer()), align=2)
        return self.b.fpext(h, v8f32)

    def round16(self, x):
        """f16(x) and back: F16C vcvtps2ph (RNE) then vcvtph2ps."""
        t = v8f16 if x.type == v8f32 else f16
        return self.b.fpext(self.b.fptrunc(x, t), x.type)

    def kv_off(self, j, hk, d=0):
        """Element offset of [cell j, kv head hk, d] in a cache."""
        b = self.b
        return b.add(b.mul(b.add(b.mul(j, i64(self.Hkv)), hk), i64(self.D)), i64(d))

    def not_neg_inf(self, mrow, j):
        """mask[mrow, j] != -inf, on the f16 bits (the same answer, NaN included)."""
        b = self.b
        bits = b.load(b.gep(self.mask16, [b.add(b.mul(mrow, self.n_kv), j)]))
        return b.icmp_unsigned("!=", bits, i16(NEG_INF_F16_BITS))

    def mask32(self, mrow, j):
        b = self.b
        return b.fpext(b.load(b.gep(self.mask, [b.add(b.mul(mrow, self.n_kv), j)])), f32)

    def store_normalised(self, vkq, S, out_off):
        """out = r(VKQ * (S == 0 ? 0 : r(1/S)))."""
        b = self.b
        s_inv = b.select(b.fcmp_ordered("==", S, f32(0.0)), f32(0.0), b.fdiv(f32(1.0), S))
        sb = broadcast(b, s_inv)
        for i in range(0, self.DV, 8):
            self.vstore(b.fmul(self.vload(vkq, i64(i), 32), sb), self.out, b.add(out_off, i64(i)))

    # -- one_chunk ----------------------------------------------------------------------
    def q16(self, qbuf, q_off):
        """Q row rounded to f16 (ggml_cpu_fp32_to_fp16 of Q) into qbuf."""
        for i in range(0, self.D, 8):
            self.vstore(self.round16(self.vload(self.q, self.b.add(q_off, i64(i)))), qbuf, i64(i), 32)

    def dot_f16(self, qbuf, hk, j):
        """ggml_vec_dot_f16(D, K[j, hk], Q16), AVX2: acc[a] = fma(K, Q, acc[a]) in steps of 32,
        GGML_F32x8_REDUCE, then an f64 tail of r(K*Q) for D % 32."""
        b = self.b
        base = self.kv_off(j, hk)
        body = self.D - self.D % 32
        accs = [splat(0.0)] * 4
        for i in range(0, body, 32):
            for a in range(4):
                x = self.hload(self.k, b.add(base, i64(i + 8 * a)))
                accs[a] = fma(b, x, self.vload(qbuf, i64(i + 8 * a), 32), accs[a])
        s = b.fadd(b.fadd(accs[0], accs[2]), b.fadd(accs[1], accs[3]))
        lo = b.shuffle_vector(s, s, ir.Constant(ir.VectorType(i32, 4), [0, 1, 2, 3]))
        hi = b.shuffle_vector(s, s, ir.Constant(ir.VectorType(i32, 4), [4, 5, 6, 7]))
        t = b.fadd(lo, hi)
        e = [b.extract_element(t, i32(i)) for i in range(4)]
        res = b.fadd(b.fadd(e[0], e[1]), b.fadd(e[2], e[3]))
        if body == self.D:
            return res
        res = b.fpext(res, f64)
        for i in range(body, self.D):
            x = b.fpext(b.load(b.gep(self.k, [b.add(base, i64(i))])), f32)
            res = b.fadd(res, b.fpext(b.fmul(x, b.load(b.gep(qbuf, [i64(i)]))), f64))
        return b.fptrunc(res, f32)

    def one_chunk(self, mrow, heads, lo, hi):
        """The one_chunk loop over keys [lo, hi) of row mrow for each of heads, a list of
        (hk, qbuf, vkq, Mp, Sp): state VKQ (f16 values), M, S in memory.

        Run in blocks of BLOCK_KV keys, two passes each, every value's operations in ggml's order:
        (1) per visible key in order, the score, M and S (the scalar chain with its expf calls),
        noting the key, its ms, vs and whether M grew; (2) the VKQ chain over the noted keys, which
        then keeps VKQ in registers (no call in its loop). The heads share the mask row, so the
        same keys; their VKQ chains run side by side in (2), independent chains that hide each
        other's latency."""
        b = self.b
        keys, count = self.alloca(i64, BLOCK_KV, "keys"), self.alloca(i64, 1, "count")
        notes = [(self.alloca(f32, BLOCK_KV, "ms"), self.alloca(f32, BLOCK_KV, "vs"), self.alloca(i8, BLOCK_KV, "grew"))
                 for _ in heads]
        with for_range(b, lo, hi, step=BLOCK_KV, name="kb") as k0:
            b.store(i64(0), count)
            with for_range(b, k0, smin(b, b.add(k0, i64(BLOCK_KV)), hi), name="j") as j:
                with b.if_then(self.not_neg_inf(mrow, j)):
                    at = b.load(count)
                    b.store(j, b.gep(keys, [at]))
                    b.store(b.add(at, i64(1)), count)
                    for (hk, qbuf, _, Mp, Sp), (mss, vss, grew) in zip(heads, notes):
                        s = b.fadd(b.fmul(self.dot_f16(qbuf, hk, j), self.scale), self.mask32(mrow, j), name="s")
                        m_old = b.load(Mp)
                        new = b.fcmp_ordered(">", s, m_old, name="new")
                        e = b.call(self.expf, [b.select(new, b.fsub(m_old, s), b.fsub(s, m_old))])
                        ms, vs = b.select(new, e, f32(1.0)), b.select(new, f32(1.0), e)
                        b.store(b.select(new, s, m_old), Mp)
                        b.store(fma(b, b.load(Sp), ms, vs), Sp)
                        b.store(ms, b.gep(mss, [at]))
                        b.store(vs, b.gep(vss, [at]))
                        b.store(b.zext(new, i8), b.gep(grew, [at]))
            with for_range(b, 0, b.load(count), name="jv") as at:
                j = b.load(b.gep(keys, [at]))
                for (hk, _, vkq, _, _), (mss, vss, grew) in zip(heads, notes):
                    with b.if_then(b.icmp_unsigned("!=", b.load(b.gep(grew, [at])), i8(0))):   # ggml_vec_scale_f16
                        msb = broadcast(b, b.load(b.gep(mss, [at])))
                        for i in range(0, self.DV, 8):
                            self.vstore(self.round16(b.fmul(self.vload(vkq, i64(i), 32), msb)), vkq, i64(i), 32)
                for (hk, _, vkq, _, _), (mss, vss, grew) in zip(heads, notes):
                    vsb = broadcast(b, b.load(b.gep(vss, [at])))
                    base = self.kv_off(j, hk)
                    for i in range(0, self.DV, 8):                            # ggml_vec_mad_f16
                        x = self.hload(self.v, b.add(base, i64(i)))
                        self.vstore(self.round16(fma(b, x, vsb, self.vload(vkq, i64(i), 32))), vkq, i64(i), 32)

    def reset(self, vkq, Mp, Sp, count=None):
        b = self.b
        for i in range(0, count or self.DV, 8):
            self.vstore(splat(0.0), vkq, i64(i), 32)
        if Mp is not None:
            b.store(f32(NEG_INF), Mp)
            b.store(f32(0.0), Sp)


def _define_one_chunk(e: _Emit) -> None:
    b = e.b
    qbuf, vkq = e.alloca(f32, e.D, "q16"), e.alloca(f32, e.DV, "vkq")
    Mp, Sp = e.alloca(f32, 1, "M"), e.alloca(f32, 1, "S")
    lo, hi = thread_range(b, b.mul(e.M, i64(e.H)), e.ith, e.nth)
    with for_range(b, lo, hi, name="row") as r:                        # r = mrow*H + h
        mrow, h = b.sdiv(r, i64(e.H)), b.srem(r, i64(e.H))
        hk = b.sdiv(h, i64(e.grp))
        e.q16(qbuf, b.mul(r, i64(e.D)))
        e.reset(vkq, Mp, Sp)
        e.one_chunk(mrow, [(hk, qbuf, vkq, Mp, Sp)], i64(0), e.n_kv)
        e.store_normalised(vkq, b.load(Sp), b.mul(r, i64(e.DV)))


def _define_split(e: _Emit) -> None:
    """One query row: per head, one_chunk over each key chunk, reduced as the partials are.
    The chunks are ceil(n_kv / llama_threads) keys, from this call's sizes. With DV 64 a thread
    takes its heads two at a time (one_chunk's VKQ chains side by side; 16 vectors of state)."""
    b = e.b
    if e.M_static != 1:
        raise LoweringError(f"llvm backend: split-KV attention takes 1 query row, not {e.M_static or 'T'}")
    nt = llama_threads(b, e.dims)
    cs = ceil_div(b, e.n_kv, nt, name="chunk")
    n_chunks = ceil_div(b, e.n_kv, cs, name="n_chunks")
    maxnum = intrinsic(e.m, "llvm.maxnum.f32", f32, [f32, f32])
    lo, hi = thread_range(b, e.H, e.ith, e.nth)

    def heads(hs):
        """One head's (or a pair's) split-KV: chunk by chunk, then the reduction and the output."""
        state = [(h, b.sdiv(h, i64(e.grp)), e.alloca(f32, e.D, "q16"), e.alloca(f32, e.DV, "vkq_c"),
                  e.alloca(f32, e.DV, "vkq"), *(e.alloca(f32, 1, nm) for nm in ("M_c", "S_c", "M", "S"))) for h in hs]
        for h, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
            e.q16(qbuf, b.mul(h, i64(e.D)))
            e.reset(acc, Mt, St)
        with for_range(b, 0, n_chunks, name="c") as c:
            k0 = b.mul(c, cs)
            k1 = smin(b, b.add(k0, cs), e.n_kv)
            for h, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
                e.reset(vkq, Mp, Sp)
            e.one_chunk(i64(0), [(hk, qbuf, vkq, Mp, Sp) for h, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state], k0, k1)
            for h, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
                s_c = b.load(Sp)
                with b.if_then(b.fcmp_unordered("!=", s_c, f32(0.0))):       # ggml_flash_attn_ext_reduce_partials
                    m, m_c = b.load(Mt), b.load(Mp)
                    mn = b.call(maxnum, [m, m_c])
                    a = b.call(e.expf, [b.fsub(m, mn)])
                    w = b.call(e.expf, [b.fsub(m_c, mn)])
                    ab, wb = broadcast(b, a), broadcast(b, w)
                    for i in range(0, e.DV, 8):
                        part = b.fmul(e.vload(vkq, i64(i), 32), wb)
                        e.vstore(fma(b, e.vload(acc, i64(i), 32), ab, part), acc, i64(i), 32)
                    b.store(fma(b, b.load(St), a, b.fmul(s_c, w)), St)
                    b.store(mn, Mt)
        for h, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
            S = b.load(St)
            sb = broadcast(b, b.fdiv(f32(1.0), S))
            keep = b.fcmp_unordered("!=", S, f32(0.0))
            out_off = b.mul(h, i64(e.DV))
            for i in range(0, e.DV, 8):
                x = e.vload(acc, i64(i), 32)
                e.vstore(b.select(keep, b.fmul(x, sb), x), e.out, b.add(out_off, i64(i)))

    if e.DV > 64:
        with for_range(b, lo, hi, name="h") as h:
            heads([h])
        return
    n_pairs = b.sdiv(b.sub(hi, lo), i64(2))
    with for_range(b, 0, n_pairs, name="hp") as p:
        h = b.add(lo, b.mul(p, i64(2)))
        heads([h, b.add(h, i64(1))])
    with b.if_then(b.icmp_signed("!=", b.srem(b.sub(hi, lo), i64(2)), i64(0))):
        heads([b.sub(hi, i64(1))])


# ---- tiled ------------------------------------------------------------------------------

def _hsum8(b, v):
    """hsum_float_8: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))."""
    lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 4), [0, 1, 2, 3]))
    hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 4), [4, 5, 6, 7]))
    a = b.fadd(lo, hi)
    x = [b.extract_element(a, i32(i)) for i in range(4)]
    return b.fadd(b.fadd(x[0], x[2]), b.fadd(x[1], x[3]))


def _simd_gemm(b, accp, C, ldc: int, A, lda: int, B, K: int, N: int, rows, zero: bool) -> None:
    """C[rows x N] (+)= A[rows x K] @ B[K x N] as ggml's simd_gemm: each C value one serial fma
    chain over k, from 0 (zero) or from C. Register tiles of GEMM_RM rows x GEMM_RN vectors; the
    last rows % GEMM_RM rows one at a time, 8 vectors a tile. Strides in floats."""
    def tile(r0, nr: int, v0: int, nv: int):
        acc = [[accp[i * nv + c] for c in range(nv)] for i in range(nr)]
        for i in range(nr):
            c_row = b.gep(C, [b.mul(b.add(r0, i64(i)), i64(ldc))])
            for c in range(nv):
                b.store(splat(0.0) if zero else _vload(b, c_row, i64(8 * (v0 + c))), acc[i][c])
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
    87 below the max) only that path is computed, else kernels_glu.v_expf in full."""
    R = splat(float.fromhex("0x1.8p23"))
    fabs = intrinsic(b.module, "llvm.fabs.v8f32", v8f32, [v8f32])
    ys, slow = [], ir.Constant(ir.VectorType(i1, 8), [0] * 8)
    for x in xs:                                       # kernels_glu.v_expf, lines for lines
        z = fma(b, x, splat(float.fromhex("0x1.715476p+0")), R)
        n = b.fsub(z, R)
        nn = b.fsub(splat(-0.0), n)
        bb = fma(b, nn, splat(float.fromhex("0x1.7f7d1cp-20")), fma(b, nn, splat(float.fromhex("0x1.62e4p-1")), x))
        k = b.bitcast(b.add(b.shl(b.bitcast(z, v8i32), splat(23, v8i32)), splat(0x3F800000, v8i32)), v8f32)
        slow = b.or_(slow, b.fcmp_ordered(">", b.call(fabs, [n]), splat(126.0)))
        u = b.fmul(bb, bb)
        j = fma(b, fma(b, fma(b, splat(float.fromhex("0x1.0e4020p-7")), bb, splat(float.fromhex("0x1.573e2ep-5"))), u,
                       fma(b, splat(float.fromhex("0x1.555e66p-3")), bb, splat(float.fromhex("0x1.fffdb6p-2")))),
                u, b.fmul(splat(float.fromhex("0x1.ffffecp-1")), bb))
        ys.append(fma(b, j, k, k))
    any_slow = b.icmp_unsigned("!=", b.bitcast(slow, i8), i8(0))
    with b.if_else(any_slow) as (full, fast):
        with full:
            for a, x in enumerate(xs):
                b.store(v_expf(b, x), b.bitcast(b.gep(P, [i64(8 * a)]), v8f32.as_pointer()), align=32)
        with fast:
            for a, y in enumerate(ys):
                b.store(y, b.bitcast(b.gep(P, [i64(8 * a)]), v8f32.as_pointer()), align=32)


def _transpose8(b, x):
    """The 8x8 transpose of eight 8-lane vectors (unpack, shuffle, 128-bit permute stages):
    lane j of result l is lane l of x[j]."""
    def shuf(a, c, idx):
        return b.shuffle_vector(a, c, ir.Constant(ir.VectorType(i32, 8), idx))
    t = []
    for i in range(0, 8, 2):
        t += [shuf(x[i], x[i + 1], [0, 8, 1, 9, 4, 12, 5, 13]), shuf(x[i], x[i + 1], [2, 10, 3, 11, 6, 14, 7, 15])]
    u = []
    for i in (0, 4):
        for a, c in ((t[i], t[i + 2]), (t[i + 1], t[i + 3])):
            u += [shuf(a, c, [0, 1, 8, 9, 4, 5, 12, 13]), shuf(a, c, [2, 3, 10, 11, 6, 7, 14, 15])]
    return [shuf(u[k % 4], u[k % 4 + 4], [0, 1, 2, 3, 8, 9, 10, 11] if k < 4 else [4, 5, 6, 7, 12, 13, 14, 15])
            for k in range(8)]


def _partial_i16(b, p, off, lanes: int):
    """The first `lanes` i16 at p[off] in a vector whose other lanes hold -inf's bits (a pad key)."""
    v = ir.Constant(v8i16, [NEG_INF_F16_BITS] * 8)
    for l in range(lanes):
        v = b.insert_element(v, b.load(b.gep(p, [b.add(off, i64(l))])), i32(l))
    return v


def _define_tiled(e: _Emit) -> None:
    b, m = e.b, e.m
    D, DV, T = e.D, e.DV, TILE_KV
    kt, vt = e.alloca(f32, D * T, "k_tile"), e.alloca(f32, T * DV, "v_tile")
    vkq, KQ = e.alloca(f32, TILE_Q * DV, "vkq"), e.alloca(f32, TILE_Q * T, "kq")     # KQ: scores, then P
    Sx, Mx = e.alloca(f32, TILE_Q, "S"), e.alloca(f32, TILE_Q, "M")
    accp = [e.alloca(v8f32, 1, f"acc{a}") for a in range(GEMM_RM * GEMM_RN)]
    anyp = e.alloca(v8i16, 1, "active")
    maxnum = intrinsic(m, "llvm.maxnum.f32", f32, [f32, f32])
    vmaxnum = intrinsic(m, "llvm.maxnum.v8f32", v8f32, [v8f32, v8f32])
    if e.kv_static is None:            # KV cells come in 256s (llama_kv_cache::get_n_kv): whole tiles
        n_full, last = b.sdiv(e.n_kv, i64(T)), 0
    else:
        n_full, last = divmod(e.kv_static, T)
        n_full = i64(n_full)            # the last partial tile starts at n_full * T = kv - last

    def kv_tile(row0, R, h, hk, ic, kc: int):
        """One KV tile [ic, ic+kc) for the Q tile rows row0..row0+R of head h."""
        b.store(ir.Constant(v8i16, [0] * 8), anyp)                # any row sees any key here?
        with for_range(b, 0, R, name="ar") as r:                   # (explicit vectors: LLVM would
            moff = b.add(b.mul(b.add(row0, r), e.n_kv), ic)         # otherwise vectorise over rows)
            seen = b.load(anyp)
            for a in range(0, kc, 8):
                lanes = min(8, kc - a)
                bits = b.load(b.bitcast(b.gep(e.mask16, [b.add(moff, i64(a))]), v8i16.as_pointer()), align=2) \
                    if lanes == 8 else _partial_i16(b, e.mask16, b.add(moff, i64(a)), lanes)
                ne = b.icmp_unsigned("!=", bits, ir.Constant(v8i16, [NEG_INF_F16_BITS] * 8))
                seen = b.or_(seen, b.sext(ne, v8i16))
            b.store(seen, anyp)
        active = b.icmp_unsigned("!=", b.bitcast(b.load(anyp), ir.IntType(128)), ir.IntType(128)(0))
        with b.if_then(active):
            kc8 = kc // 8 * 8
            with for_range(b, 0, kc8, step=8, name="kg") as j0:    # K -> f32, transposed: kt[d][j],
                for d in range(0, D, 8):                           # 8 keys x 8 d at a time
                    x = [e.hload(e.k, e.kv_off(b.add(ic, b.add(j0, i64(l))), hk, d)) for l in range(8)]
                    for l, y in enumerate(_transpose8(b, x)):
                        e.vstore(y, kt, b.add(i64((d + l) * T), j0), 32)
            if kc8 < kc:
                with for_range(b, kc8, kc, name="kj") as j:
                    base = e.kv_off(b.add(ic, j), hk)
                    for d in range(0, D, 8):
                        x = e.hload(e.k, b.add(base, i64(d)))
                        for l in range(8):
                            at = b.add(b.mul(i64(d + l), i64(T)), j)
                            b.store(b.extract_element(x, i32(l)), b.gep(kt, [at]))
            with for_range(b, 0, kc, name="vj") as j:
                base = e.kv_off(b.add(ic, j), hk)
                for d in range(0, DV, 8):                          # V -> f32: vt[j][d]
                    e.vstore(e.hload(e.v, b.add(base, i64(d))), vt, b.add(b.mul(j, i64(DV)), i64(d)), 32)
            if kc < T:                                             # pad keys: zeros
                with for_range(b, kc, T, name="pj") as j:
                    with for_range(b, 0, D, name="pd") as d:
                        b.store(f32(0.0), b.gep(kt, [b.add(b.mul(d, i64(T)), j)]))
                    with for_range(b, 0, DV // 8, name="pv") as d:
                        e.vstore(splat(0.0), vt, b.add(b.mul(j, i64(DV)), b.mul(d, i64(8))), 32)
            q0 = b.gep(e.q, [b.mul(b.add(b.mul(row0, i64(e.H)), h), i64(D))])
            _simd_gemm(b, accp, KQ, T, q0, e.H * D, kt, D, T, R, zero=True)      # KQ = Q K^T, all rows
            with for_range(b, 0, R, name="sr") as r:
                tile_softmax(b.add(row0, r), r, ic, kc)
            _simd_gemm(b, accp, vkq, DV, KQ, T, vt, T, DV, R, zero=False)     # VKQ += P V, all rows

    def tile_softmax(mrow, r, ic, kc: int):
        """Row r's online softmax step: KQ = r(r(dot*scale) + mask) (pad keys -inf), M, S and the
        VKQ rescale, and P in place of KQ[r]."""
        prow = b.gep(KQ, [b.mul(r, i64(T))])
        kq = []
        for a in range(8):
            sc = b.fmul(e.vload(prow, i64(8 * a), 32), broadcast(b, e.scale))
            lanes = [8 * a + l < kc for l in range(8)]
            if all(lanes):
                mk = e.hload(e.mask, b.add(b.mul(mrow, e.n_kv), b.add(ic, i64(8 * a))))
            else:
                valid = ir.Constant(ir.VectorType(i1, 8), [int(x) for x in lanes])
                sc = b.select(valid, sc, splat(NEG_INF))
                mk = splat(NEG_INF)
                for l in range(8):
                    if lanes[l]:
                        mk = b.insert_element(mk, e.mask32(mrow, b.add(ic, i64(8 * a + l))), i32(l))
            kq.append(b.fadd(sc, mk))
        vm = kq[0]
        for a in range(1, 8):
            vm = b.call(vmaxnum, [vm, kq[a]])
        tmax = b.extract_element(vm, i32(0))
        for l in range(1, 8):
            tmax = b.call(maxnum, [tmax, b.extract_element(vm, i32(l))])
        vrow = b.mul(r, i64(DV))
        with b.if_else(b.fcmp_unordered("!=", tmax, f32(NEG_INF))) as (live, dead):
            with live:
                mp, sp = b.gep(Mx, [r]), b.gep(Sx, [r])
                m_old = b.load(mp)
                m_new = b.call(maxnum, [m_old, tmax])
                with b.if_then(b.fcmp_ordered(">", m_new, m_old)):
                    ms = b.call(e.expf, [b.fsub(m_old, m_new)])
                    msb = broadcast(b, ms)
                    for i in range(0, DV, 8):
                        at = b.add(vrow, i64(i))
                        e.vstore(b.fmul(e.vload(vkq, at, 32), msb), vkq, at, 32)
                    b.store(b.fmul(b.load(sp), ms), sp)
                b.store(m_new, mp)
                mb = broadcast(b, m_new)
                _tile_expf(b, [b.fsub(kq[a], mb) for a in range(8)], prow)    # ggml_vec_soft_max_f32
                psum = f64(0.0)
                for a in range(8):
                    psum = b.fadd(psum, b.fpext(_hsum8(b, e.vload(prow, i64(8 * a), 32)), f64))
                b.store(b.fptrunc(b.fadd(b.fpext(b.load(sp), f64), psum), f32), sp)
            with dead:
                for a in range(8):
                    e.vstore(splat(0.0), prow, i64(8 * a), 32)

    def q_tile(ir0, R):
        h, row0 = b.sdiv(ir0, e.M), b.srem(ir0, e.M)
        hk = b.sdiv(h, i64(e.grp))
        with for_range(b, 0, R, name="ir") as r:
            e.reset(b.gep(vkq, [b.mul(r, i64(DV))]), None, None)
            b.store(f32(NEG_INF), b.gep(Mx, [r]))
            b.store(f32(0.0), b.gep(Sx, [r]))
        with for_range(b, 0, n_full, name="kvt") as kvt:
            kv_tile(row0, R, h, hk, b.mul(kvt, i64(T)), T)
        if last:
            kv_tile(row0, R, h, hk, i64(e.kv_static - last), last)
        with for_range(b, 0, R, name="or") as r:
            out_off = b.mul(b.add(b.mul(b.add(row0, r), i64(e.H)), h), i64(DV))
            e.store_normalised(b.gep(vkq, [b.mul(r, i64(DV))]), b.load(b.gep(Sx, [r])), out_off)

    _q_tiles(e, q_tile)


def _q_tiles(e: _Emit, q_tile) -> None:
    """q_tile(first row ir = h*M + m, rows) for this thread's Q tiles: the cut of
    backends/reference/attention.py:q_tiles at run time (M rows, llama_threads), tiles handed
    to threads round-robin in the order it lists them."""
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
                with b.if_then(b.icmp_signed("==", b.srem(t, e.nth), e.ith)):
                    q_tile(at, rows)
                b.store(b.add(t, i64(1)), tile_no)
                b.store(b.add(at, rows), irp)


@kernel(Op.FLASH_ATTN)
def define_flash_attn(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order in FA_QUANT_CACHE:                  # a quantized K/V cache: kernels_attention_quant.py
        from bankml.backends.llvm.kernels_attention_quant import define_flash_attn_quant
        return define_flash_attn_quant(m, g, n)
    if n.order not in (FA_REFERENCE, FA_SPLIT, FA_TILED):
        raise LoweringError(f"llvm backend: no flash_attn kernel for "
                            f"{n.order.describe() if n.order else None!r} ({n.name or n.id})")
    name = kernel_name(n)
    fn, b = new_function(m, name, kernel_type(n))
    e = _Emit(g, n, fn, b)
    if n.order == FA_REFERENCE:
        _define_one_chunk(e)
    elif n.order == FA_SPLIT:
        _define_split(e)
    else:
        _define_tiled(e)
    b.ret_void()
    return fn
