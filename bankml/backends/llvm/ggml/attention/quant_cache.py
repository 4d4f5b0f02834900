"""A quantized K/V cache in the llvm backend, with the bits of backends/reference/attention_quant.py:
HADAMARD (ggml_compute_forward_fwht), SET_ROWS into a q8_0/q4_0 cache and FLASH_ATTN's one_chunk
kernel over q8_0/q4_0 rows (FA_REFERENCE_QK, _QKV, _QV). Each registers under those orders, so
the registry sends a quantized cache's nodes here (an f16 cache's go to rows.py and one_chunk.py).

- HADAMARD, per row of n values (threads split rows): y = r(x * r(1/sqrtf(n))); butterflies of
  len 1, 2, 4, ...: (u, v) -> (r(u+v), r(u-v)).
- SET_ROWS, per cell row of n_head_kv*head_dim values (threads split rows), per 32-block:
    q8_0 (quantize_row_q8_0, AVX2): amax = max|x|; d = r(amax/127); id = amax != 0 ? r(127/amax) : 0
                                    q = clamp(roundeven(r(x*id)), -128, 127); block = f16(d), q
    q4_0 (quantize_row_q4_0_ref):   max = first x of largest |x|; d = r(max/-8); id = d != 0 ? r(1/d) : 0
                                    nib = min(15, (int8)r(r(x*id) + 8.5)); block = f16(d), lo | hi << 4
- FLASH_ATTN one_chunk (ggml_compute_forward_flash_attn_ext_f16_one_chunk), per (query row,
  head), threads split rows (define_flash_attn_quant):
    1. _setup: the node checked, the function, the scratch on the stack;
    2. _q_row: K q8_0/q4_0: Q quantized as q8_0 (the q8_0 block above); K f16: Q rounded to f16;
    3. _reset_row: VKQ = 0, M = -inf, S = 0;
    per key whose mask is not -inf, in order (_key):
    4. _dot, K q8_0/q4_0: per 32-block acc = fma(r(f32(K.d)*f32(Q.d)), float(lane sums of 4 int
                 products), acc); s = hsum8(acc)
          K f16: s = ggml_vec_dot_f16 (4x8 fma accumulators, GGML_F32x8_REDUCE);
       s = r(r(s*scale) + mask)
    5. _online_step: glibc expf for ms and vs; on a new max M = s and
          V f16: VKQ = f16(VKQ*ms);   V q8_0/q4_0: VKQ = r(VKQ*ms)
    6. _add_v, V f16: VKQ = f16(fma(V, vs, VKQ));   V q8_0/q4_0: VKQ = fma(r(q*d), vs, VKQ);
       S = fma(S, ms, vs)
    7. _store_row: out = r(VKQ * (S == 0 ? 0 : r(1/S)))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.emit.core import (dim, f16, f32, fma, for_range, i8, i16, i32, i64, intrinsic,
    new_function, size, thread_range, typed, v8f32)
from bankml.backends.llvm.emit.simd import broadcast, const_vec
from bankml.backends.llvm.emit.simd import at, f32x8_reduce, hsum8, load_h, scratch, sums_i8, v16i8, v32i8, v8i32
from bankml.backends.llvm.ggml.quantize import q8_block
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FA_REFERENCE_QK, FA_REFERENCE_QKV, FA_REFERENCE_QV, FWHT, SET_ROWS_Q4_0, SET_ROWS_Q8_0

BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}
v16f32, v32f32, v16i32, v32i32 = (ir.VectorType(t, k) for t, k in ((f32, 16), (f32, 32), (i32, 16), (i32, 32)))
v8f16 = ir.VectorType(f16, 8)
NEG_INF_F16_BITS = 0xFC00


def _start(m: ir.Module, n: Node):
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    return fn, b


def _vconst(t: ir.VectorType, x) -> ir.Constant:
    return ir.Constant(t, [x] * t.count)


# ---- HADAMARD -----------------------------------------------------------------------------

@kernel(Op.HADAMARD, order=FWHT)
def define_hadamard(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    x, N = g[n.inputs[0]], int(n.params["n"])
    if n.order != FWHT or x.dtype != "f32" or N & (N - 1) or N % 8 or n.shape[-1] % N:
        raise LoweringError(f"hadamard {n.name or n.id}: no llvm kernel for rows of {N} ({x.dtype}, "
                            f"{n.order.describe() if n.order else None})")
    fn, b = _start(m, n)
    out, xp, ith, nth, dims = fn.args
    xs, ys = typed(b, xp, f32), typed(b, out, f32)
    rows = b.sdiv(size(b, dims, n.shape), i64(N))
    scale = float(np.float32(1) / np.sqrt(np.float32(N)))
    sb = broadcast(b, f32(scale))
    lo, hi = thread_range(b, rows, ith, nth)
    with for_range(b, lo, hi, name="r") as r:
        base = b.mul(r, i64(N))
        vals = []
        for i in range(0, N, 8):
            v = b.load(b.bitcast(b.gep(xs, [b.add(base, i64(i))]), v8f32.as_pointer()), align=4)
            v = b.fmul(v, sb)
            vals += [b.extract_element(v, i32(k)) for k in range(8)]
        step = 1
        while step < N:
            for i in range(0, N, 2 * step):
                for j in range(i, i + step):
                    u, w = vals[j], vals[j + step]
                    vals[j], vals[j + step] = b.fadd(u, w), b.fsub(u, w)
            step *= 2
        for i in range(0, N, 8):
            v = ir.Constant(v8f32, ir.Undefined)
            for k in range(8):
                v = b.insert_element(v, vals[i + k], i32(k))
            b.store(v, b.bitcast(b.gep(ys, [b.add(base, i64(i))]), v8f32.as_pointer()), align=4)
    b.ret_void()
    return fn


# ---- quantizing one block of 32 ------------------------------------------------------------

def quantize_q8_0_block(b: ir.IRBuilder, src, dst) -> None:
    """quantize_row_q8_0 (AVX2) of the 32 floats at src (f32*) into the 34 bytes at dst (i8*)."""
    d, _, q = q8_block(b, b.load(b.bitcast(src, v32f32.as_pointer()), align=4))
    b.store(b.fptrunc(d, f16), at(b, dst, 0, f16), align=1)
    b.store(q, at(b, dst, 2, v32i8), align=1)


def quantize_q4_0_block(b: ir.IRBuilder, src, dst) -> None:
    """quantize_row_q4_0_ref of the 32 floats at src (f32*) into the 18 bytes at dst (i8*)."""
    fabs = intrinsic(b.module, "llvm.fabs.f32", f32, [f32])
    amax, mx = f32(0.0), f32(0.0)
    for j in range(32):                        # the first x of largest |x| (amax < |x|, strictly)
        x = b.load(b.gep(src, [i64(j)]))
        a = b.call(fabs, [x])
        bigger = b.fcmp_ordered("<", amax, a)
        amax, mx = b.select(bigger, a, amax), b.select(bigger, x, mx)
    d = b.fdiv(mx, f32(-8.0))
    idv = b.select(b.fcmp_unordered("!=", d, f32(0.0)), b.fdiv(f32(1.0), d), f32(0.0))
    nib = []
    for half in (0, 16):
        x = b.load(b.bitcast(b.gep(src, [i64(half)]), v16f32.as_pointer()), align=4)
        y = b.fadd(b.fmul(x, _splat(b, idv, 16)), _vconst(v16f32, 8.5))
        q = b.trunc(b.fptosi(y, v16i32), v16i8)                        # (int8_t): truncation, low byte
        nib.append(b.select(b.icmp_signed("<", _vconst(v16i8, 15), q), _vconst(v16i8, 15), q))
    byte = b.or_(nib[0], b.shl(nib[1], _vconst(v16i8, 4)))
    b.store(b.fptrunc(d, f16), at(b, dst, 0, f16), align=1)
    b.store(byte, at(b, dst, 2, v16i8), align=1)


def _splat(b, x, count):
    t = ir.VectorType(x.type, count)
    v = b.insert_element(ir.Constant(t, ir.Undefined), x, i32(0))
    return b.shuffle_vector(v, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, count), [0] * count))


_QUANTIZE_BLOCK = {"q8_0": quantize_q8_0_block, "q4_0": quantize_q4_0_block}
_SET_ROWS_ORDER = {"q8_0": SET_ROWS_Q8_0, "q4_0": SET_ROWS_Q4_0}


@kernel(Op.SET_ROWS, order=(SET_ROWS_Q8_0, SET_ROWS_Q4_0))
def define_set_rows_quant(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """SET_ROWS of f32 rows into a q8_0/q4_0 cache (uint8 [kv_size, row_bytes])."""
    cache, vals, pos = (g[i] for i in n.inputs)
    row = math.prod(cache.shape[1:])
    if (n.dtype not in _QUANTIZE_BLOCK or n.order != _SET_ROWS_ORDER[n.dtype] or vals.dtype != "f32"
            or math.prod(vals.shape[1:]) != row or row % 32):
        raise LoweringError(f"set_rows {n.name or n.id}: no llvm kernel for {vals.dtype} rows into a {n.dtype} cache")
    rb = row // 32 * BLOCK_BYTES[n.dtype]
    fn, b = _start(m, n)
    out, _cache_in, vp, pp, ith, nth, dims = fn.args        # out is the cache (aliased by the runner)
    xs, ps = typed(b, vp, f32), typed(b, pp, i32)
    lo, hi = thread_range(b, dim(b, dims, vals.shape[0]), ith, nth)
    with for_range(b, lo, hi, name="t") as t:
        dst = b.gep(out, [b.mul(b.sext(b.load(b.gep(ps, [t])), i64), i64(rb))])
        with for_range(b, 0, row // 32, name="blk") as k:
            src = b.gep(xs, [b.add(b.mul(t, i64(row)), b.mul(k, i64(32)))])
            _QUANTIZE_BLOCK[n.dtype](b, src, b.gep(dst, [b.mul(k, i64(BLOCK_BYTES[n.dtype]))]))
    b.ret_void()
    return fn


# ---- FLASH_ATTN one_chunk over a quantized cache ---------------------------------------------

def _q4_0_values(b, p):
    """The 32 signed values (nibble - 8) of a q4_0 block's 16 bytes at p, as v32i8."""
    qs = b.load(typed(b, p, v16i8), align=1)
    lo = b.and_(qs, _vconst(v16i8, 15))
    hi = b.lshr(qs, _vconst(v16i8, 4))
    both = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(i32, 32), list(range(32))))
    return b.sub(both, _vconst(v32i8, 8))


def _block_values(b, t: str, blk):
    """The 32 int8 values of a q8_0/q4_0 block (pointer to its first byte)."""
    return b.load(at(b, blk, 2, v32i8), align=1) if t == "q8_0" else _q4_0_values(b, b.gep(blk, [i64(2)]))


@dataclass
class _Attn:
    """A flash_attn kernel over a quantized cache: its builder, cache types, sizes, pointers and scratch."""
    fn: ir.Function
    b: ir.IRBuilder
    kt: str                        # the K and V cache types: f16, q8_0, q4_0
    vt: str
    H: int
    D: int
    Hkv: int
    nb: int                        # blocks of 32 per head
    n_kv: ir.Value
    kp: ir.Value
    vp: ir.Value
    outs: ir.Value
    qs: ir.Value
    mask16: ir.Value
    mask: ir.Value
    scale: ir.Constant
    expf: ir.Function
    qf: ir.Value                   # Q rounded to f16 (an f16 K)
    qq: ir.Value                   # Q as q8_0 (a quantized K): values, a block, f32(f16(d))
    qblk: ir.Value
    qd: ir.Value
    vkq: ir.Value
    Mp: ir.Value
    Sp: ir.Value

    def row_bytes(self, t: str) -> int:
        return self.Hkv * self.D * 2 if t == "f16" else self.Hkv * self.nb * BLOCK_BYTES[t]

    def head_bytes(self, t: str) -> int:
        return self.D * 2 if t == "f16" else self.nb * BLOCK_BYTES[t]

    def vload(self, p, off):
        return self.b.load(self.b.bitcast(self.b.gep(p, [off]), v8f32.as_pointer()), align=4)

    def vstore(self, x, p, off):
        self.b.store(x, self.b.bitcast(self.b.gep(p, [off]), v8f32.as_pointer()), align=4)

    def round16(self, x):
        return self.b.fpext(self.b.fptrunc(x, v8f16), v8f32)

    def hload(self, base, off):
        return self.b.fpext(self.b.load(at(self.b, base, off, v8f16), align=1), v8f32)


@kernel(Op.FLASH_ATTN, order=(FA_REFERENCE_QK, FA_REFERENCE_QKV, FA_REFERENCE_QV))
def define_flash_attn_quant(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """one_chunk over a quantized cache per (query row, head), in the steps of the module's docstring."""
    a, lo, hi = _setup(m, g, n)                                       # 1.
    b = a.b
    with for_range(b, lo, hi, name="row") as r:                       # r = mrow*H + h
        mrow, h = b.sdiv(r, i64(a.H)), b.srem(r, i64(a.H))
        hk = b.sdiv(h, i64(a.H // a.Hkv))
        _q_row(a, b.gep(a.qs, [b.mul(r, i64(a.D))]))                  # 2.
        _reset_row(a)                                                 # 3.
        kbase = b.mul(hk, i64(a.head_bytes(a.kt)))
        vbase = b.mul(hk, i64(a.head_bytes(a.vt)))
        with for_range(b, 0, a.n_kv, name="j") as j:
            mi = b.add(b.mul(mrow, a.n_kv), j)
            with b.if_then(b.icmp_unsigned("!=", b.load(b.gep(a.mask16, [mi])), i16(NEG_INF_F16_BITS))):
                _key(a, j, mi, kbase, vbase)                          # 4. to 6.
        _store_row(a, r)                                              # 7.
    b.ret_void()
    return a.fn


def _setup(m: ir.Module, g: Graph, n: Node) -> tuple[_Attn, ir.Value, ir.Value]:
    """1. The node checked, the function, its scratch and this thread's (row, head) items [lo, hi)."""
    qn, kn, vn, mn = (g[i] for i in n.inputs)
    kt, vt = kn.dtype, vn.dtype
    want = FA_REFERENCE_QV if kt == "f16" else FA_REFERENCE_QK if vt == "f16" else FA_REFERENCE_QKV
    M, H, DV = n.shape
    D, Hkv = qn.shape[2], kn.shape[1]
    if (n.order != want or any(t not in ("f16", *BLOCK_BYTES) for t in (kt, vt)) or D % 32 or DV != D
            or H % Hkv or vn.shape[1:] != (Hkv, DV)):
        raise LoweringError(f"llvm backend: no flash_attn kernel for a {kt}/{vt} cache with "
                            f"{n.order.describe() if n.order else None!r} ({n.name or n.id})")
    nb = D // 32
    fn, b = _start(m, n)
    out, qp, kp, vp, maskp, ith, nth, dims = fn.args
    Mv, n_kv = dim(b, dims, M), dim(b, dims, mn.shape[1])
    outs, qs = typed(b, out, f32), typed(b, qp, f32)
    mask16, mask = typed(b, maskp, i16), typed(b, maskp, f16)
    scale = f32(float(np.float32(n.params["scale"])))
    expf = intrinsic(m, "expf", f32, [f32])
    qf = scratch(b, f32, D, "q16")
    qq = scratch(b, i8, D, "q8.qs")
    qblk = scratch(b, i8, BLOCK_BYTES["q8_0"], "q8.blk")
    qd = scratch(b, f32, nb, "q8.d")
    vkq = scratch(b, f32, DV, "vkq")
    Mp, Sp = scratch(b, f32, 1, "M"), scratch(b, f32, 1, "S")
    a = _Attn(fn, b, kt, vt, H, D, Hkv, nb, n_kv, kp, vp, outs, qs, mask16, mask, scale, expf,
              qf, qq, qblk, qd, vkq, Mp, Sp)
    lo, hi = thread_range(b, b.mul(Mv, i64(H)), ith, nth)
    return a, lo, hi


def _q_row(a: _Attn, qrow) -> None:
    """2. The Q row as K's vec_dot wants it: rounded to f16 (an f16 K), else quantize_row_q8_0."""
    b = a.b
    if a.kt == "f16":
        for i in range(0, a.D, 8):
            a.vstore(a.round16(a.vload(qrow, i64(i))), a.qf, i64(i))
        return
    for k in range(a.nb):
        quantize_q8_0_block(b, b.gep(qrow, [i64(32 * k)]), a.qblk)
        b.store(load_h(b, a.qblk, i64(0)), b.gep(a.qd, [i64(k)]))
        b.store(b.load(at(b, a.qblk, 2, v32i8), align=1), at(b, a.qq, 32 * k, v32i8), align=1)


def _reset_row(a: _Attn) -> None:
    """3. VKQ = 0, M = -inf, S = 0."""
    for i in range(0, a.D, 8):
        a.vstore(const_vec(0.0), a.vkq, i64(i))
    a.b.store(f32(float("-inf")), a.Mp)
    a.b.store(f32(0.0), a.Sp)


def _key(a: _Attn, j, mi, kbase, vbase) -> None:
    """4. to 6. One key j whose mask mi is not -inf: its score, the online softmax step, VKQ and S (one_chunk's)."""
    b = a.b
    krow = b.gep(a.kp, [b.add(b.mul(j, i64(a.row_bytes(a.kt))), kbase)])
    s = b.fadd(b.fmul(_dot(a, krow), a.scale), b.fpext(b.load(b.gep(a.mask, [mi])), f32), name="s")
    ms, vs = _online_step(a, s)
    _add_v(a, b.gep(a.vp, [b.add(b.mul(j, i64(a.row_bytes(a.vt))), vbase)]), vs)
    b.store(fma(b, b.load(a.Sp), ms, vs), a.Sp)


def _dot(a: _Attn, krow):
    """4. K.Q of one key (krow: its head's bytes): ggml_vec_dot_f16, or ggml_vec_dot_q8_0_q8_0 / _q4_0_q8_0."""
    b = a.b
    if a.kt == "f16":
        accs = [const_vec(0.0)] * 4
        for i in range(0, a.D, 32):
            for k in range(4):
                accs[k] = fma(b, a.hload(krow, i64(2 * (i + 8 * k))), a.vload(a.qf, i64(i + 8 * k)), accs[k])
        return f32x8_reduce(b, accs)
    acc = const_vec(0.0)
    for k in range(a.nb):
        blk = b.gep(krow, [i64(k * BLOCK_BYTES[a.kt])])
        sums = sums_i8(b, _block_values(b, a.kt, blk), b.load(at(b, a.qq, 32 * k, v32i8), align=1))
        d = b.fmul(load_h(b, blk, i64(0)), b.load(b.gep(a.qd, [i64(k)])))
        acc = fma(b, broadcast(b, d), b.sitofp(sums, v8f32), acc)
    return hsum8(b, acc)


def _online_step(a: _Attn, s) -> tuple:
    """5. The online softmax of score s: ms, vs by expf; on a new max M = s, VKQ *= ms (ggml_vec_scale_f16 / _f32)."""
    b = a.b
    m_old = b.load(a.Mp)
    new = b.fcmp_ordered(">", s, m_old, name="new")
    e = b.call(a.expf, [b.select(new, b.fsub(m_old, s), b.fsub(s, m_old))])
    ms, vs = b.select(new, e, f32(1.0)), b.select(new, f32(1.0), e)
    with b.if_then(new):
        msb = broadcast(b, ms)
        for i in range(0, a.D, 8):
            x = b.fmul(a.vload(a.vkq, i64(i)), msb)
            a.vstore(a.round16(x) if a.vt == "f16" else x, a.vkq, i64(i))
        b.store(s, a.Mp)
    return ms, vs


def _add_v(a: _Attn, vrow, vs) -> None:
    """6. VKQ += V * vs (ggml_vec_mad_f16, or ggml_vec_mad_f32 after V's to_float)."""
    b = a.b
    vsb = broadcast(b, vs)
    if a.vt == "f16":
        for i in range(0, a.D, 8):
            a.vstore(a.round16(fma(b, a.hload(vrow, i64(2 * i)), vsb, a.vload(a.vkq, i64(i)))), a.vkq, i64(i))
        return
    for k in range(a.nb):
        blk = b.gep(vrow, [i64(k * BLOCK_BYTES[a.vt])])
        d = broadcast(b, load_h(b, blk, i64(0)))
        vals = _block_values(b, a.vt, blk)
        for c in range(4):
            q8 = b.shuffle_vector(vals, ir.Constant(v32i8, ir.Undefined),
                                  ir.Constant(v8i32, list(range(8 * c, 8 * c + 8))))
            x = b.fmul(b.sitofp(q8, v8f32), d)
            off = i64(32 * k + 8 * c)
            a.vstore(fma(b, x, vsb, a.vload(a.vkq, off)), a.vkq, off)


def _store_row(a: _Attn, r) -> None:
    """7. out = r(VKQ * (S == 0 ? 0 : r(1/S)))."""
    b = a.b
    S = b.load(a.Sp)
    s_inv = broadcast(b, b.select(b.fcmp_ordered("==", S, f32(0.0)), f32(0.0), b.fdiv(f32(1.0), S)))
    out_off = b.mul(r, i64(a.D))
    for i in range(0, a.D, 8):
        a.vstore(b.fmul(a.vload(a.vkq, i64(i)), s_inv), a.outs, b.add(out_off, i64(i)))
