"""ActScaling PerBlock on the llvm backend (load(profile="portable", act_scaling="PerBlock")):
QUANTIZE in order portable.quantize_blocks and MUL_MAT in order portable.dot_blocks, the bits of
quant.quantize_blocks and coded.dot_blocks.

The activation buffer is pq8 in blocks of the weight's own block B (32, 64 or 128): per block B
codes, then e (int16), m (uint8) and bad (uint8), as rows.py's blocks of 32.

QUANTIZE, per block: x canonical; bad = any non-finite; amax the largest |x| bits; (m, e) by
quant.wide_scale (m in 128..255: m1 = ceil(C / (127·2^9)) at e = p - 14, or past 255 half of it
rounded up at e = p - 13; (0, 0) for 0); each code rint(x·2^-e / m) by the spec's own steps, an
exact f64 product and one f64 division (IEEE, correctly rounded), clamped to +-127; all 0 where
m = 0 or bad. Threads split the blocks.

MUL_MAT, per weight row (threads split the rows), column and weight block j: the block's exact
integer dot Σ coef·code over its 32-element sub-blocks (i32: |.| <= 128·127), the term
m·d_sig·dot at e + d_exp, and Q4_1's a·min_sig·Σcode at e + min_exp beside it, summed exactly
and rounded once (portable.exact: round_i64, or round_terms for two terms); NaN where the
activation block is bad; the blocks added in order from -0.0 (arith.add), the one NaN stored.
A weight with an infinite or NaN scale never gets here: load() refuses it (quant.check_readable).
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, f64, for_range, i8, i16, i32, i64, intrinsic, size, thread_range, typed
from bankml.backends.llvm.emit.simd import at, v32i8
from bankml.backends.llvm.portable.exact import round_i64, round_terms
from bankml.backends.llvm.portable.rows import (QNAN, add_f32, block_scale, canon_nan, pq8_bytes, reduce, splat_v,
                                                start, sub_codes, sub_layout, v32f32, v32f64, v32i32, vconst)
from bankml.backends.llvm.registry import kernel
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.quants import Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES

TYPES = (Q8_0, Q4_1, Q1_0, Q2_0)
_D = 127 << 9                    # quant._least_scale's 127·2^(17 - WIDE_BITS)


@kernel(Op.QUANTIZE, order=po.QUANTIZE_BLOCKS, profile="portable")
def define_quantize_blocks(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    x = g[n.inputs[0]]
    K, B = x.shape[-1], n.params.get("block")
    if n.order != po.QUANTIZE_BLOCKS or n.params.get("type") != po.ACT_TYPE or x.dtype != "f32" \
            or B not in (32, 64, 128, 256) or K % B:
        raise LoweringError(f"quantize {n.name or n.id}: portable llvm quantizes f32 rows of whole blocks "
                            f"(32, 64, 128 or 256) into {po.ACT_TYPE}")
    fn, b = start(m, n)
    out, src, ith, nth, dims = fn.args
    nblk = b.mul(size(b, dims, x.shape[:-1]), i64(K // B))
    lo, hi = thread_range(b, nblk, ith, nth)
    with for_range(b, lo, hi, name="blk") as ib:
        xs, bad, amax = [], i8(0), i32(0)
        for c in range(B // 32):                                   # 32 values at a time
            xb = b.load(at(b, src, b.add(b.mul(ib, i64(4 * B)), i64(128 * c)), v32i32), align=4)
            field = b.and_(xb, vconst(v32i32, 0x7F800000))
            nonfinite = b.icmp_unsigned("==", field, vconst(v32i32, 0x7F800000))
            keep = b.and_(b.icmp_unsigned("!=", field, vconst(v32i32, 0)), b.not_(nonfinite))
            xc = b.select(keep, xb, vconst(v32i32, 0))               # canon; non-finite read as 0
            xs.append(xc)
            bad = b.or_(bad, reduce(b, "or", b.zext(nonfinite, ir.VectorType(i8, 32))))
            big = reduce(b, "umax", b.and_(xc, vconst(v32i32, 0x7FFFFFFF)))   # |x| bits order as |x|
            amax = b.select(b.icmp_unsigned(">", big, amax), big, amax)
        bad = b.icmp_unsigned("!=", bad, i8(0))
        amax = b.select(bad, i32(0), amax)
        c = b.or_(b.and_(amax, i32(0x7FFFFF)), i32(0x800000))
        p = b.sub(b.lshr(amax, i32(23)), i32(127))
        m1 = b.udiv(b.add(c, i32(_D - 1)), i32(_D))
        m2 = b.udiv(b.add(c, i32(2 * _D - 1)), i32(2 * _D))
        small = b.icmp_unsigned("<=", m1, i32(255))
        zero = b.icmp_unsigned("==", amax, i32(0))
        ms = b.select(zero, i32(0), b.select(small, m1, m2))
        e = b.select(zero, i32(0), b.select(small, b.sub(p, i32(14)), b.sub(p, i32(13))))
        pow2 = splat_v(b, b.bitcast(b.shl(b.zext(b.sub(i32(1023), e), i64), i64(52)), f64), 32)
        div = splat_v(b, b.uitofp(b.select(zero, i32(1), ms), f64), 32)
        ob = b.mul(ib, i64(B + 4))
        for c, xc in enumerate(xs):                                # rint(x·2^-e / m), as the spec
            y = b.fdiv(b.fmul(b.fpext(b.bitcast(xc, v32f32), v32f64), pow2), div)
            y = b.call(_roundeven(b.module), [y])
            y = b.select(b.fcmp_ordered(">", y, vconst(v32f64, 127.0)), vconst(v32f64, 127.0), y)
            y = b.select(b.fcmp_ordered("<", y, vconst(v32f64, -127.0)), vconst(v32f64, -127.0), y)
            q = b.select(b.or_(zero, bad), vconst(v32i8, 0), b.fptosi(y, v32i8))
            b.store(q, at(b, out, b.add(ob, i64(32 * c)), v32i8), align=1)
        b.store(b.trunc(e, i16), at(b, out, b.add(ob, i64(B)), i16), align=1)
        b.store(b.trunc(ms, i8), at(b, out, b.add(ob, i64(B + 2)), i8), align=1)
        b.store(b.zext(bad, i8), at(b, out, b.add(ob, i64(B + 3)), i8), align=1)
    b.ret_void()
    return fn


def _roundeven(m: ir.Module) -> ir.Function:
    return intrinsic(m, "llvm.roundeven.v32f64", v32f64, [v32f64])


@kernel(Op.MUL_MAT, order=po.MUL_MAT_BLOCKS, profile="portable")
def define_mul_mat_blocks(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    wtype = int(w.params["ggml_type"]) if w.op is Op.WEIGHT else None
    if n.order != po.MUL_MAT_BLOCKS or wtype not in TYPES or xq.op is not Op.QUANTIZE \
            or xq.order != po.QUANTIZE_BLOCKS or xq.params.get("block") != WEIGHT_TYPES[wtype].block:
        raise LoweringError(f"mul_mat {n.name or n.id}: portable llvm wants {po.MUL_MAT_BLOCKS.kernel} of a Q8_0, "
                            f"Q4_1, Q1_0 or Q2_0 weight and a quantize per its block")
    N, K = w.shape
    B = WEIGHT_TYPES[wtype].block
    wrb, xrb = WEIGHT_TYPES[wtype].row_bytes(K), pq8_bytes(K, B)
    do, mo, _ = sub_layout(wtype, 0)
    fn, b = start(m, n)
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, N, ith, nth)
    acc = _slot(b, f32)
    with for_range(b, lo, hi, name="r") as r:
        row = b.gep(wp, [b.mul(r, i64(wrb))])
        with for_range(b, 0, M, name="t") as t:
            col = b.gep(xp, [b.mul(t, i64(xrb))])
            b.store(f32(-0.0), acc)
            with for_range(b, 0, K // B, name="j") as j:
                ab = b.mul(j, i64(B + 4))
                dot, csum, base = i32(0), i32(0), None
                for s in range(B // 32):                           # the block's sub-blocks of 32
                    coef, base_s = sub_codes(b, wtype, row, b.add(b.mul(j, i64(B // 32)), i64(s)))
                    base = base if base is not None else base_s
                    codes = b.sext(b.load(at(b, col, b.add(ab, i64(32 * s)), v32i8), align=1), v32i32)
                    dot = b.add(dot, reduce(b, "add", b.mul(coef, codes)))
                    if mo is not None:
                        csum = b.add(csum, reduce(b, "add", codes))
                ae = b.sext(b.load(at(b, col, b.add(ab, i64(B)), i16), align=1), i32)
                am = b.zext(b.load(at(b, col, b.add(ab, i64(B + 2)), i8), align=1), i64)
                abad = b.icmp_unsigned("!=", b.load(at(b, col, b.add(ab, i64(B + 3)), i8), align=1), i8(0))
                ws, wx, _ = block_scale(b, row, base, do)
                p1 = b.mul(b.mul(am, b.sext(ws, i64)), b.sext(dot, i64))
                if mo is None:
                    y = round_i64(b, p1, b.add(ae, wx))
                else:
                    ms, mx, _ = block_scale(b, row, base, mo)
                    p2 = b.mul(b.mul(am, b.sext(ms, i64)), b.sext(csum, i64))
                    x1, x2 = (b.sext(b.add(ae, x), i64) for x in (wx, mx))
                    y = round_terms(b, _pair(b, p1, p2), _pair(b, x1, x2))
                y = b.select(abad, b.bitcast(i32(QNAN), f32), y)
                b.store(add_f32(b, b.load(acc), y), acc)
            b.store(canon_nan(b, b.load(acc)), b.gep(yp, [b.add(b.mul(t, i64(N)), r)]))
    b.ret_void()
    return fn


def _pair(b: ir.IRBuilder, x, y):
    """<x, y> (i64 lanes)."""
    v = ir.Constant(ir.VectorType(i64, 2), ir.Undefined)
    return b.insert_element(b.insert_element(v, x, i32(0)), y, i32(1))


def _slot(b: ir.IRBuilder, t: ir.Type) -> ir.Value:
    with b.goto_entry_block():
        return b.alloca(t)
