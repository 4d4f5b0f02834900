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
  zigzag (0, 1, .., 1, 0: balanced causal work); K/V tiles of 64 keys converted to f32 on the
  stack (K transposed, so 8 keys share a vector and each lane is simd_gemm's serial fma chain
  over d). A KV tile is skipped for a Q tile when every row's mask there is -inf. In a computed
  tile, Q.K for all rows, then their softmax steps, then P.V for all rows (so the K tile, then
  the V tile, stays in L1), both products as ggml's simd_gemm in register tiles of 6 rows x 16
  columns (_simd_gemm). Per row:
      KQ = r(dot*scale); pad keys -inf; KQ = r(KQ + mask); tmax = max(KQ)
      tmax != -inf: Mn = fmaxf(M, tmax); Mn > M: ms = expf(M - Mn), VKQ = r(VKQ*ms), S = r(S*ms)
                    M = Mn; P = ggml_v_expf(r(KQ - Mn)); S = (float)((double)S + sum_c (double)hsum8(P_c))
      else P = 0;   VKQ = serial fma chain over the 64 keys of V[k]*P[k]
  out = r(VKQ * (S == 0 ? 0 : r(1/S))).
  ggml_v_expf's slow path (|n| > 126 in some lane) is computed only for a row whose scores need it.

- FA_ROWS (a batch of sequences, passes/choose_attention_kernel.py): k and v are tables of the rows'
  own caches (one pointer per row, the runner binds them) and a fifth input holds each row's own
  cell count; per (row, head), split over threads, the row's decode alone: FA_SPLIT's loop from
  SPLIT_MIN_KV of its cells, else one_chunk over them (mask row stride: the widest row's n_kv).

The tiled kernel is in backends/llvm/ggml/attention/tiled.py. Scratch lives on the stack (allocas in the entry block): a few KiB for one_chunk/split, about
(64*D + 2*64*DV + 64*64 + 200) floats for tiled (112 KiB at D = 128).
"""
from __future__ import annotations

from typing import Callable


import numpy as np
from llvmlite import ir

from bankml.backends.llvm.emit.core import (ceil_div, dim, f16, f32, f64, fma, for_range, i8, i16, i32, i64,
    intrinsic, llama_threads, new_function, smin, thread_range, typed, v8f32)
from bankml.backends.llvm.emit.simd import broadcast, const_vec
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import Dim, upper
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FA_REFERENCE, FA_ROWS, FA_SPLIT
from bankml.passes.choose_attention_kernel import SPLIT_MIN_KV

v8f16 = ir.VectorType(f16, 8)
NEG_INF_F16_BITS = 0xFC00
BLOCK_KV = 64                          # keys per block of our one_chunk loop (its two passes)
NEG_INF = float("-inf")


class Emit:
    """Pointers, dimensions and small emit helpers of one flash_attn kernel."""

    def __init__(self, g: Graph, n: Node, fn: ir.Function, b: ir.IRBuilder):
        self.b, self.m = b, b.module
        out, q, k, v, mask, *cells, self.ith, self.nth, self.dims = fn.args
        M, self.H, self.DV = n.shape
        qn, kn, vn, mn = (g[i] for i in n.inputs[:4])
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
        self.tables = (typed(b, k, i64), typed(b, v, i64), typed(b, cells[0], i32)) if cells else None  # FA_ROWS
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
        accs = [const_vec(0.0)] * 4
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
            self.vstore(const_vec(0.0), vkq, i64(i), 32)
        if Mp is not None:
            b.store(f32(NEG_INF), Mp)
            b.store(f32(0.0), Sp)


def _define_one_chunk(e: Emit) -> None:
    """A thread's share of the (row, head) items, row by row; two heads of a row at a time where
    the share has both (one_chunk's chains side by side: they share the row's mask and visible
    keys, and each head's values keep their own order)."""
    b = e.b
    state = [(e.alloca(f32, e.D, "q16"), e.alloca(f32, e.DV, "vkq"), e.alloca(f32, 1, "M"), e.alloca(f32, 1, "S"))
             for _ in range(2)]
    lo, hi = thread_range(b, b.mul(e.M, i64(e.H)), e.ith, e.nth)

    def heads(mrow, hs):
        rs = [b.add(b.mul(mrow, i64(e.H)), h) for h in hs]                # r = mrow*H + h
        for r, (qbuf, vkq, Mp, Sp) in zip(rs, state):
            e.q16(qbuf, b.mul(r, i64(e.D)))
            e.reset(vkq, Mp, Sp)
        e.one_chunk(mrow, [(b.sdiv(h, i64(e.grp)), *st) for h, st in zip(hs, state)], i64(0), e.n_kv)
        for r, (_, vkq, _, Sp) in zip(rs, state):
            e.store_normalised(vkq, b.load(Sp), b.mul(r, i64(e.DV)))

    with for_range(b, b.sdiv(lo, i64(e.H)), ceil_div(b, hi, i64(e.H)), name="mrow") as mrow:
        first = b.mul(mrow, i64(e.H))
        h_lo = b.select(b.icmp_signed("<", first, lo), b.sub(lo, first), i64(0))
        h_hi = smin(b, b.sub(hi, first), i64(e.H))
        with for_range(b, h_lo, h_hi, step=2, name="h") as h:
            h1 = b.add(h, i64(1))
            with b.if_else(b.icmp_signed("<", h1, h_hi)) as (two, one):
                with two:
                    heads(mrow, [h, h1])
                with one:
                    heads(mrow, [h])


def _split_heads(e: Emit, mrow, hs, n_kv) -> None:
    """Split-KV of query row mrow over its first n_kv cells for each head of hs (one or a pair):
    one_chunk over each chunk of ceil(n_kv / llama_threads) keys, then the reduction and the output."""
    b = e.b
    nt = llama_threads(b, e.dims)
    cs = ceil_div(b, n_kv, nt, name="chunk")
    n_chunks = ceil_div(b, n_kv, cs, name="n_chunks")
    maxnum = intrinsic(e.m, "llvm.maxnum.f32", f32, [f32, f32])
    # per head: r (the (row, head) item), its K/V head, Q16, the chunk's and the total VKQ, M and S
    state = [(b.add(b.mul(mrow, i64(e.H)), h), b.sdiv(h, i64(e.grp)), e.alloca(f32, e.D, "q16"),
              e.alloca(f32, e.DV, "vkq_c"), e.alloca(f32, e.DV, "vkq"),
              *(e.alloca(f32, 1, nm) for nm in ("M_c", "S_c", "M", "S"))) for h in hs]
    for r, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
        e.q16(qbuf, b.mul(r, i64(e.D)))
        e.reset(acc, Mt, St)
    with for_range(b, 0, n_chunks, name="c") as c:
        k0 = b.mul(c, cs)
        k1 = smin(b, b.add(k0, cs), n_kv)
        for r, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
            e.reset(vkq, Mp, Sp)
        e.one_chunk(mrow, [(hk, qbuf, vkq, Mp, Sp) for r, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state], k0, k1)
        for r, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
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
    for r, hk, qbuf, vkq, acc, Mp, Sp, Mt, St in state:
        S = b.load(St)
        sb = broadcast(b, b.fdiv(f32(1.0), S))
        keep = b.fcmp_unordered("!=", S, f32(0.0))
        out_off = b.mul(r, i64(e.DV))
        for i in range(0, e.DV, 8):
            x = e.vload(acc, i64(i), 32)
            e.vstore(b.select(keep, b.fmul(x, sb), x), e.out, b.add(out_off, i64(i)))


def _define_split(e: Emit) -> None:
    """One query row: per head, one_chunk over each key chunk, reduced as the partials are
    (_split_heads). The chunks are ceil(n_kv / llama_threads) keys, from this call's sizes. With
    DV 64 a thread takes its heads two at a time (one_chunk's VKQ chains side by side; 16 vectors
    of state)."""
    b = e.b
    if e.M_static != 1:
        raise LoweringError(f"llvm backend: split-KV attention takes 1 query row, not {e.M_static or 'T'}")
    lo, hi = thread_range(b, e.H, e.ith, e.nth)

    def heads(hs):
        _split_heads(e, i64(0), hs, e.n_kv)

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


def flash_attn_kernel(body: Callable[[Emit], None]) -> Callable[[ir.Module, Graph, Node], ir.Function]:
    """The emitter of a flash_attn kernel whose loops `body` writes over an Emit of its node."""
    def define(m: ir.Module, g: Graph, n: Node) -> ir.Function:
        fn, b = new_function(m, kernel_name(n), kernel_type(n))
        body(Emit(g, n, fn, b))
        b.ret_void()
        return fn
    return define


def _define_rows(e: Emit) -> None:
    """A batch of sequences: a thread's share of the (row, head) items, each its row's decode alone
    over the row's own caches and cells: split-KV from SPLIT_MIN_KV cells, else one_chunk."""
    b = e.b
    k_rows, v_rows, cells = e.tables
    qbuf, vkq = e.alloca(f32, e.D, "q16"), e.alloca(f32, e.DV, "vkq")
    Mp, Sp = e.alloca(f32, 1, "M"), e.alloca(f32, 1, "S")
    lo, hi = thread_range(b, b.mul(e.M, i64(e.H)), e.ith, e.nth)
    with for_range(b, lo, hi, name="item") as r:
        mrow, h = b.sdiv(r, i64(e.H)), b.srem(r, i64(e.H))
        e.k = b.inttoptr(b.load(b.gep(k_rows, [mrow])), f16.as_pointer())      # the row's own caches
        e.v = b.inttoptr(b.load(b.gep(v_rows, [mrow])), f16.as_pointer())
        n_kv = b.sext(b.load(b.gep(cells, [mrow])), i64)
        with b.if_else(b.icmp_signed(">=", n_kv, i64(SPLIT_MIN_KV))) as (split, one):
            with split:
                _split_heads(e, mrow, [h], n_kv)
            with one:
                e.q16(qbuf, b.mul(r, i64(e.D)))
                e.reset(vkq, Mp, Sp)
                e.one_chunk(mrow, [(b.sdiv(h, i64(e.grp)), qbuf, vkq, Mp, Sp)], i64(0), n_kv)
                e.store_normalised(vkq, b.load(Sp), b.mul(r, i64(e.DV)))


define_one_chunk = kernel(Op.FLASH_ATTN, order=FA_REFERENCE)(flash_attn_kernel(_define_one_chunk))
define_split = kernel(Op.FLASH_ATTN, order=FA_SPLIT)(flash_attn_kernel(_define_split))
define_rows = kernel(Op.FLASH_ATTN, order=FA_ROWS)(flash_attn_kernel(_define_rows))
