"""ActScaling PerBlock on the llvm backend (load(profile="portable", act_scaling="PerBlock")):
QUANTIZE in order portable.quantize_blocks and MUL_MAT in order portable.dot_blocks, the bits of
quant.quantize_blocks and coded.dot_blocks.

The activation buffer is pq8 in blocks of the weight's own block B (32, 64, 128 or 256): per block B
codes, then e (int16), m (uint8) and bad (uint8), as rows.py's blocks of 32.

QUANTIZE, per block: x canonical; bad = any non-finite; amax the largest |x| bits; (m, e) by
quant.wide_scale (m in 128..255: m1 = ceil(C / (127·2^9)) at e = p - 14, or past 255 half of it
rounded up at e = p - 13; (0, 0) for 0); each code rint(x·2^-e / m) by the spec's own steps, an
exact f64 product and one f64 division (IEEE, correctly rounded), clamped to +-127; all 0 where
m = 0 or bad. Threads split the blocks.

MUL_MAT, every block format, eight weight rows at a time in the lanes of a vector (threads split
the rows; a thread's last ones one by one; coded.mul_mat_kernel), per column and weight block: the
block's exact integer dots Σ coef·code and Σ offs·code over its 32-element sub-blocks
(coded.sub_block; i32: |.| < 2^28), the terms m·a_sig·Σ coef·code at e + a_exp and, for two-
scale formats (Q4_1, Q5_1, Q4_K), m·b_sig·Σ offs·code at e + b_exp, summed exactly and rounded
once (portable.exact: round_i64, or round_lanes for two terms); NaN where the activation block
is bad; the blocks added in order from -0.0 (arith.add), the one NaN stored.
A weight with an infinite or NaN scale never gets here: load() refuses it (coded.check_readable).
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, f64, for_range, i8, i16, i32, i64, intrinsic, size, thread_range
from bankml.backends.llvm.emit.simd import at, v32i8
from bankml.backends.llvm.portable import coded
from bankml.backends.llvm.portable.exact import round_i64, round_lanes
from bankml.backends.llvm.portable.rows import (QNAN, add_f32, least_scale, pq8_bytes, reduce, splat_v, start, v32f32,
                                                v32f64, v32i32, vconst)
from bankml.backends.llvm.registry import kernel
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.profiles.portable.quant import WIDE_BITS
from bankml.quants import Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES

TYPES = (Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K)      # every block format (coded.sub_block)


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
        ms, e, zero = least_scale(b, b.select(bad, i32(0), amax), WIDE_BITS)
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
        raise LoweringError(f"mul_mat {n.name or n.id}: portable llvm wants {po.MUL_MAT_BLOCKS.kernel} of a "
                            f"block-format weight and a quantize per its block")
    N, K = w.shape
    B = WEIGHT_TYPES[wtype].block

    def add_blocks(b, wrows, col, gi, nsub, acc):
        _blocks(b, wtype, wrows, col, gi, nsub, acc)
    return coded.mul_mat_kernel(m, n, (N, K), (WEIGHT_TYPES[wtype].row_bytes(K), pq8_bytes(K, B)), add_blocks)


def _blocks(b: ir.IRBuilder, wtype: int, wrows: list, col, gi, nsub: int, acc) -> None:
    """The weight blocks in group gi's nsub sub-blocks (a block is B / 32 of them) of each row of
    wrows (lane i: row i), in order: each block's terms, a·Σ coef·code and b·Σ offs·code under
    its activation block's scale, summed exactly and rounded once (exact.round_lanes), added
    into acc; NaN for a bad activation block."""
    B = WEIGHT_TYPES[wtype].block
    per, L = B // 32, len(wrows)
    for j0 in range(0, nsub, per):
        ab = b.mul(b.add(b.mul(gi, i64(256 // B)), i64(j0 // per)), i64(B + 4))
        ae = b.sext(b.load(at(b, col, b.add(ab, i64(B)), i16), align=1), i64)
        am = b.zext(b.load(at(b, col, b.add(ab, i64(B + 2)), i8), align=1), i64)
        abad = b.icmp_unsigned("!=", b.load(at(b, col, b.add(ab, i64(B + 3)), i8), align=1), i8(0))
        codes = [b.load(at(b, col, b.add(ab, i64(32 * k)), v32i8), align=1) for k in range(per)]
        sbs = [[coded.sub_block(b, wtype, row, gi, j0 + k) for row in wrows] for k in range(per)]
        dot_a = coded.row_dots(b, sbs[0], codes[0])
        for k in range(1, per):                          # Σ coef·code per row, |.| < 2^28
            dot_a = b.add(dot_a, coded.row_dots(b, sbs[k], codes[k]))
        terms = [coded.term(b, am, ae, [sb.a for sb in sbs[0]], dot_a)]     # the block's scales
        if sbs[0][0].b is not None:                      # b·Σ offs·code: offs one value per sub-block
            csums = [coded.code_sum(b, c) for c in codes]
            dot_b = coded.vector(b, [_sum(b, [b.mul(c, sbs[k][i].offs) for k, c in enumerate(csums)])
                                     for i in range(L)])
            terms.append(coded.term(b, am, ae, [sb.b for sb in sbs[0]], dot_b))
        if len(terms) == 1:
            y = round_i64(b, terms[0][0], b.trunc(terms[0][1], ir.VectorType(i32, L)))
        else:
            y = round_lanes(b, terms)
        y = b.select(abad, coded.splat(b, b.bitcast(i32(QNAN), f32), L), y)
        b.store(add_f32(b, b.load(acc), y), acc)


def _sum(b: ir.IRBuilder, xs: list):
    out = xs[0]
    for x in xs[1:]:
        out = b.add(out, x)
    return out
