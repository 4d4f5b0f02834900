"""mul_mat kernels of the llvm backend: ggml_compute_forward_mul_mat, bit for bit.

Same orders as backends/reference/matmul.py (read its docstrings):
- F16_VEC_DOT (ggml_vec_dot_f16): 4 accumulators of 8 lanes over K & ~31, GGML_F32x8_REDUCE,
  leftovers added in f64.  F16_TINYBLAS: one 8-lane accumulator, zero-filled tail, hsum8.
- Q8_0 / Q4_1: per 32-block acc = fma(r(wd*ad), float(lane sums), acc), hsum8; Q4_1 adds the
  scalar chain summs = fma(wm, as, summs) and returns r(hsum8(acc) + summs).
- Q1_0: per 128-block blk = r(a0.d*s0), blk = fma(aK.d, sK, blk), acc = fma(wd, blk, acc); hsum8.
- Q2_0 (scalar generic): sumi = fma(float(is), ad, sumi) over its 2 q8 blocks, sumf = fma(wd, sumi, sumf).
Lane l of a quantized block holds the exact int32 sum of elements 4l..4l+3, made as ggml makes
it: vpmaddubsw (u8 x s8 -> i16 pairs, never saturating for q8 activations in [-127, 127])
then vpmaddwd with ones.

The activation (src1) is always the QUANTIZE node's bytes (passes/share_quantized_activations).
Threads split the weight rows; each thread computes every column of its rows, in tiles of
columns that share the unpacked weight block. The bits never depend on nth.
"""
from __future__ import annotations

import math

from llvmlite import ir

from bankml.backends.llvm.common import f16, f32, f64, fma, for_range, i1, i8, i16, i32, i64, intrinsic, \
    new_function, thread_range, typed, v8f32
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir import order as fo
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, Q8_1, WEIGHT_TYPES

v8i8, v16i8, v32i8 = (ir.VectorType(i8, k) for k in (8, 16, 32))
v16i16, v8i32 = ir.VectorType(i16, 16), ir.VectorType(i32, 8)
v8f16 = ir.VectorType(f16, 8)
ACT_BLOCK_BYTES = {Q8_0: 34, Q8_1: 36}
_VEC_DOT = {Q8_0: fo.Q8_0_DOT, Q4_1: fo.Q4_1_DOT, Q1_0: fo.Q1_0_DOT, Q2_0: fo.Q2_0_DOT}


# ---- small vector helpers (shared by the other kernels of this backend) -------------------

def splat(b: ir.IRBuilder, x, n: int = 8):
    t = ir.VectorType(x.type, n)
    v = b.insert_element(ir.Constant(t, ir.Undefined), x, i32(0))
    return b.shuffle_vector(v, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))


def lanes(b: ir.IRBuilder, v, idx: list[int]):
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(i32, len(idx)), idx))


def hsum8(b: ir.IRBuilder, v):
    """hsum_float_8: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), each add in f32."""
    e = [b.extract_element(v, i32(i)) for i in range(8)]
    return b.fadd(b.fadd(b.fadd(e[0], e[4]), b.fadd(e[2], e[6])), b.fadd(b.fadd(e[1], e[5]), b.fadd(e[3], e[7])))


def f32x8_reduce(b: ir.IRBuilder, accs):
    """GGML_F32x8_REDUCE of four 8-lane accumulators: s = (a0+a2)+(a1+a3) lanewise, t = s[0:4]+s[4:8],
    result (t0+t1)+(t2+t3)."""
    s = b.fadd(b.fadd(accs[0], accs[2]), b.fadd(accs[1], accs[3]))
    t = b.fadd(lanes(b, s, [0, 1, 2, 3]), lanes(b, s, [4, 5, 6, 7]))
    e = [b.extract_element(t, i32(i)) for i in range(4)]
    return b.fadd(b.fadd(e[0], e[1]), b.fadd(e[2], e[3]))


def alloca(b: ir.IRBuilder, t: ir.Type, init, name: str):
    """A stack slot in the entry block (SROA makes it a register), stored with init here."""
    with b.goto_entry_block():
        p = b.alloca(t, name=name)
    b.store(init, p)
    return p


def at(b: ir.IRBuilder, base, offset, t: ir.Type):
    """Typed pointer to base (i8*) + offset bytes."""
    return typed(b, b.gep(base, [offset if isinstance(offset, ir.Value) else i64(offset)]), t)


def load_h(b: ir.IRBuilder, base, offset):
    return b.fpext(b.load(at(b, base, offset, f16), align=1), f32)


def _maddubs(b, u, s):
    return b.call(intrinsic(b.module, "llvm.x86.avx2.pmadd.ub.sw", v16i16, [v32i8, v32i8]), [u, s])


def _madd_ones(b, p):
    ones = ir.Constant(v16i16, [1] * 16)
    return b.call(intrinsic(b.module, "llvm.x86.avx2.pmadd.wd", v8i32, [v16i16, v16i16]), [p, ones])


def sums_us8(b, u, s):
    """Lane l = sum over 4l..4l+3 of u (0..255) * s (-127..127): ggml's mul_sum_us8_pairs."""
    return _madd_ones(b, _maddubs(b, u, s))


def sums_i8(b, x, y):
    """Lane l = sum over 4l..4l+3 of x*y, both signed: ggml's mul_sum_i8_pairs (psign trick)."""
    psign = intrinsic(b.module, "llvm.x86.avx2.psign.b", v32i8, [v32i8, v32i8])
    return sums_us8(b, b.call(psign, [x, x]), b.call(psign, [y, x]))


# ---- the kernel ---------------------------------------------------------------------------

@kernel(Op.MUL_MAT)
def define_mul_mat(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    if w.op is not Op.WEIGHT or xq.op is not Op.QUANTIZE:
        raise LoweringError(f"mul_mat {n.name}: llvm wants a weight and a quantize node, got {w.op.value}, {xq.op.value}")
    wtype = int(w.params["ggml_type"])
    if wtype not in WEIGHT_TYPES:
        raise LoweringError(f"mul_mat {n.name}: weight type {wtype} has no llvm kernel")
    wt = WEIGHT_TYPES[wtype]
    N, K = w.shape
    M = math.prod(n.shape[:-1])
    if n.shape[-1] != N or xq.shape[-1] != K or int(xq.params["type"]) != wt.act_type:
        raise LoweringError(f"mul_mat {n.name}: shapes or activation type do not fit the weight")
    o = n.order
    if wtype == F16:
        if o == fo.F16_TINYBLAS:
            body, cols = _tinyblas_f16, 4
        elif o == fo.F16_VEC_DOT:
            body, cols = _vec_dot_f16, 1
        else:
            raise LoweringError(f"mul_mat {n.name}: F16 order {o.describe() if o else None} is not lowered")
        xrb = 2 * K
    else:
        if o != _VEC_DOT[wtype]:
            raise LoweringError(f"mul_mat {n.name}: {wt.name} order {o.describe() if o else None} is not lowered")
        body, cols = {Q8_0: _q8_0, Q4_1: _q4_1, Q1_0: _q1_0, Q2_0: _q2_0}[wtype], 4
        xrb = K // 32 * ACT_BLOCK_BYTES[wt.act_type]
        if K % wt.block:
            raise LoweringError(f"mul_mat {n.name}: K = {K} is not a multiple of {wt.name} blocks")
    wrb = wt.row_bytes(K)

    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    out, wp, xp, ith, nth = fn.args
    yp = typed(b, out, f32)
    lo, hi = thread_range(b, N, ith, nth)
    full = M // cols
    with for_range(b, lo, hi, name="row") as r:
        wrow = b.gep(wp, [b.mul(r, i64(wrb))])

        def tile(m0, c):
            xrows = [b.gep(xp, [b.mul(b.add(m0, i64(j)), i64(xrb))]) for j in range(c)]
            res = body(b, K, wrow, xrows)
            for j, v in enumerate(res):
                b.store(v, b.gep(yp, [b.add(b.mul(b.add(m0, i64(j)), i64(N)), r)]))

        if full:
            with for_range(b, 0, full, name="ct") as t:
                tile(b.mul(t, i64(cols)), cols)
        for j in range(full * cols, M):
            tile(i64(j), 1)
    b.ret_void()
    return fn


def _block_loop(b, n_blocks, accs, step):
    """for ib in [0, n_blocks): accs = step(ib, accs) with accumulators kept in stack slots."""
    slots = [alloca(b, a.type, a, "acc") for a in accs]
    with for_range(b, 0, n_blocks, name="blk") as ib:
        new = step(ib, [b.load(s) for s in slots])
        for s, v in zip(slots, new):
            b.store(v, s)
    return [b.load(s) for s in slots]


def _zero8():
    return ir.Constant(v8f32, [0.0] * 8)


def _q8_0(b, K, wrow, xrows):
    c = len(xrows)

    def step(ib, accs):
        wb = b.mul(ib, i64(34))
        wd = load_h(b, wrow, wb)
        wq = b.load(at(b, wrow, b.add(wb, i64(2)), v32i8), align=1)
        out = []
        for j in range(c):
            ad = load_h(b, xrows[j], wb)
            aq = b.load(at(b, xrows[j], b.add(wb, i64(2)), v32i8), align=1)
            s = b.sitofp(sums_i8(b, wq, aq), v8f32)
            out.append(fma(b, splat(b, b.fmul(wd, ad)), s, accs[j]))
        return out

    return [hsum8(b, a) for a in _block_loop(b, K // 32, [_zero8()] * c, step)]


def _q4_1(b, K, wrow, xrows):
    c = len(xrows)
    lo4 = ir.Constant(v16i8, [15] * 16)

    def step(ib, st):
        accs, summs = st[:c], st[c:]
        wb, xb = b.mul(ib, i64(20)), b.mul(ib, i64(36))
        wd, wm = load_h(b, wrow, wb), load_h(b, wrow, b.add(wb, i64(2)))
        qs = b.load(at(b, wrow, b.add(wb, i64(4)), v16i8), align=1)
        wq = b.shuffle_vector(b.and_(qs, lo4), b.lshr(qs, ir.Constant(v16i8, [4] * 16)),
                              ir.Constant(ir.VectorType(i32, 32), list(range(32))))
        na, ns = [], []
        for j in range(c):
            ad, as_ = load_h(b, xrows[j], xb), load_h(b, xrows[j], b.add(xb, i64(2)))
            aq = b.load(at(b, xrows[j], b.add(xb, i64(4)), v32i8), align=1)
            s = b.sitofp(sums_us8(b, wq, aq), v8f32)
            na.append(fma(b, splat(b, b.fmul(wd, ad)), s, accs[j]))
            ns.append(fma(b, wm, as_, summs[j]))
        return na + ns

    st = _block_loop(b, K // 32, [_zero8()] * c + [f32(0.0)] * c, step)
    return [b.fadd(hsum8(b, st[j]), st[c + j]) for j in range(c)]


def _q1_0(b, K, wrow, xrows):
    c = len(xrows)
    ones = ir.Constant(v32i8, [1] * 32)
    zero = ir.Constant(v32i8, [0] * 32)

    def step(ib, accs):
        wb, xb = b.mul(ib, i64(18)), b.mul(ib, i64(4 * 34))
        wd = load_h(b, wrow, wb)
        blks = [None] * c
        for k in range(4):
            bits = b.bitcast(b.load(at(b, wrow, b.add(wb, i64(2 + 4 * k)), i32), align=1), ir.VectorType(i1, 32))
            for j in range(c):
                xo = b.add(xb, i64(34 * k))
                ad = load_h(b, xrows[j], xo)
                aq = b.load(at(b, xrows[j], b.add(xo, i64(2)), v32i8), align=1)
                sq = b.select(bits, aq, b.sub(zero, aq))
                s = b.sitofp(sums_us8(b, ones, sq), v8f32)
                blks[j] = b.fmul(splat(b, ad), s) if k == 0 else fma(b, splat(b, ad), s, blks[j])
        return [fma(b, splat(b, wd), blks[j], accs[j]) for j in range(c)]

    return [hsum8(b, a) for a in _block_loop(b, K // 128, [_zero8()] * c, step)]


def _q2_0(b, K, wrow, xrows):
    c = len(xrows)
    ones = ir.Constant(v32i8, [1] * 32)
    three = ir.Constant(v8i8, [3] * 8)
    inter8 = ir.Constant(ir.VectorType(i32, 16), [x for i in range(8) for x in (i, 8 + i)])
    inter16 = ir.Constant(ir.VectorType(i32, 32), [x for i in range(8) for x in (2 * i, 2 * i + 1, 16 + 2 * i, 17 + 2 * i)])
    reduce_add = intrinsic(b.module, "llvm.vector.reduce.add.v8i32", i32, [v8i32])

    def step(ib, sumf):
        wb, xb = b.mul(ib, i64(18)), b.mul(ib, i64(2 * 34))
        wd = load_h(b, wrow, wb)
        sumi = [f32(0.0)] * c
        for k in range(2):
            q = b.load(at(b, wrow, b.add(wb, i64(2 + 8 * k)), v8i8), align=1)
            v = [b.and_(b.lshr(q, ir.Constant(v8i8, [2 * p] * 8)) if p else q, three) for p in range(4)]
            codes = b.shuffle_vector(b.shuffle_vector(v[0], v[1], inter8), b.shuffle_vector(v[2], v[3], inter8), inter16)
            for j in range(c):
                xo = b.add(xb, i64(34 * k))
                ad = load_h(b, xrows[j], xo)
                aq = b.load(at(b, xrows[j], b.add(xo, i64(2)), v32i8), align=1)
                t = b.sub(sums_us8(b, codes, aq), sums_us8(b, ones, aq))     # sum (q-1)*a = sum q*a - sum a
                sumi[j] = fma(b, b.sitofp(b.call(reduce_add, [t]), f32), ad, sumi[j])
        return [fma(b, wd, sumi[j], sumf[j]) for j in range(c)]

    return _block_loop(b, K // 64, [f32(0.0)] * c, step)


def _load_f16x8(b, row, elem):
    return b.fpext(b.load(at(b, row, b.mul(elem, i64(2)), v8f16), align=1), v8f32)


def _f16_tail8(b, row, start, K):
    """8 lanes from element start with the ones at K or past it zero (tinyBLAS's masked load)."""
    v = ir.Constant(v8f32, [0.0] * 8)
    for i in range(K - start):
        v = b.insert_element(v, load_h(b, row, i64(2 * (start + i))), i32(i))
    return v


def _tinyblas_f16(b, K, wrow, xrows):
    c = len(xrows)

    def step(ib, accs):
        e = b.mul(ib, i64(8))
        wv = _load_f16x8(b, wrow, e)
        return [fma(b, wv, _load_f16x8(b, x, e), a) for x, a in zip(xrows, accs)]

    accs = _block_loop(b, K // 8, [_zero8()] * c, step)
    if K % 8:
        wv = _f16_tail8(b, wrow, K - K % 8, K)
        accs = [fma(b, wv, _f16_tail8(b, x, K - K % 8, K), a) for x, a in zip(xrows, accs)]
    return [hsum8(b, a) for a in accs]


def _vec_dot_f16(b, K, wrow, xrows):
    res = []
    for x in xrows:
        def step(ib, accs):
            e = b.mul(ib, i64(32))
            return [fma(b, _load_f16x8(b, x, b.add(e, i64(8 * j))), _load_f16x8(b, wrow, b.add(e, i64(8 * j))), accs[j])
                    for j in range(4)]

        s = f32x8_reduce(b, _block_loop(b, K // 32, [_zero8()] * 4, step))
        if K % 32:
            tot = b.fpext(s, f64)
            for k in range(K - K % 32, K):
                p = b.fmul(load_h(b, x, i64(2 * k)), load_h(b, wrow, i64(2 * k)))
                tot = b.fadd(tot, b.fpext(p, f64))
            s = b.fptrunc(tot, f32)
        res.append(s)
    return res
