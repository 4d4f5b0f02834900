"""The portable profile's GET_ROWS of a weight on llvm, and MUL_MAT for the formats matmul.py
does not read: Q4_0, Q5_0, Q5_1 and the K-quants Q4_K and Q6_K, as coded rows
(profiles/portable/coded.py: every weight a·coef + b·offs of its segment, a and b f16 scales
held exactly).

Per 32-element sub-block j of a row (sub_block): the coefficients coef (<32 x i32>) and the
first scale a; for two-scale formats the second scale b and the offsets' sum with the codes
(Q5_1: Σcode; Q4_K: -m_j·Σcode):
    Q4_0  coef = nibble - 8, a = d                 Q5_0  coef = code - 16, a = d
    Q5_1  coef = code, a = d; b = m, offs 1        Q6_K  coef = sc_16·(code - 32), a = d
    Q4_K  coef = sc_j·nibble, a = d; b = dmin, offs = -m_j
MUL_MAT (coded.dot_sub32), per weight row (threads split the rows), column and group of 256
(8 sub-blocks; a last group of fewer): each sub-block's exact integer dot Σ coef·code (|.| <
2^25), its terms am·a_sig·dot at ae + a_exp and am·b_sig·Σ offs·code at ae + b_exp, the group's
terms summed exactly and rounded once (portable.exact.round_terms: up to 16 terms); NaN where an
activation block of the group is bad; the groups added in order from -0.0, the one NaN stored.
GET_ROWS (coded.get_rows), every weight type: each weight's exact value rounded once, by
rows.sub_values (F16, Q8_0, Q4_1, Q1_0, Q2_0) or here (a_sig·coef at a_exp, plus b_sig·offs
at b_exp); NaN in a 32-block with a bad scale (F16: holding an inf or NaN); threads split the
rows. A weight with an infinite or NaN scale never gets here: load()
refuses it (coded.check_readable).
"""
from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, for_range, i8, i16, i32, i64, size, thread_range, typed
from bankml.backends.llvm.emit.simd import at, nibbles, v32i8
from bankml.backends.llvm.portable.exact import round_i64, round_terms
from bankml.backends.llvm.portable import rows
from bankml.backends.llvm.portable.rows import (BLOCK_BYTES, QNAN, add_f32, canon_nan, f16_parts, pq8_bytes, reduce,
                                                splat_v, start, v32f32, v32i32, v32i64, vconst)
from bankml.backends.llvm.registry import kernel
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.quants import Q4_0, Q4_K, Q5_0, Q5_1, Q6_K, WEIGHT_TYPES

TYPES = (Q4_0, Q5_0, Q5_1, Q4_K, Q6_K)
v16i64 = ir.VectorType(i64, 16)


class SubBlock(NamedTuple):
    """Sub-block j of a row as coded.CodedRow holds it: coef <32 x i32>, a = (sig, exp) i32; b and
    offs (<32 x i32>) None for one-scale formats."""
    coef: ir.Value
    a: tuple
    b: tuple | None
    offs: ir.Value | None


def _scale(b: ir.IRBuilder, row, off):
    sig, exp, _ = f16_parts(b, b.zext(b.load(at(b, row, off, i16), align=1), i32))
    return sig, exp


def _byte(b: ir.IRBuilder, row, off):
    return b.zext(b.load(at(b, row, off, i8), align=1), i32)


def _fifth_bits(b: ir.IRBuilder, row, off):
    """<32 x i32>: bit j of the 4 bytes at off, times 16 (a Q5 code's fifth bit)."""
    bits = b.bitcast(b.load(at(b, row, off, i32), align=1), ir.VectorType(ir.IntType(1), 32))
    return b.select(bits, vconst(v32i32, 16), vconst(v32i32, 0))


def sub_block(b: ir.IRBuilder, wtype: int, row, g, j: int) -> SubBlock:
    """Sub-block j (0..7) of group g (an i64: 256 elements) of a row."""
    if wtype in (Q4_0, Q5_0, Q5_1):
        base = b.mul(b.add(b.mul(g, i64(8)), i64(j)), i64(WEIGHT_TYPES[wtype].block_bytes))
        a = _scale(b, row, base)
        if wtype == Q4_0:
            q = b.zext(nibbles(b, row, b.add(base, i64(2))), v32i32)
            return SubBlock(b.sub(q, vconst(v32i32, 8)), a, None, None)
        qh, qs = (2, 6) if wtype == Q5_0 else (4, 8)
        code = b.or_(b.zext(nibbles(b, row, b.add(base, i64(qs))), v32i32), _fifth_bits(b, row, b.add(base, i64(qh))))
        if wtype == Q5_0:
            return SubBlock(b.sub(code, vconst(v32i32, 16)), a, None, None)
        return SubBlock(code, a, _scale(b, row, b.add(base, i64(2))), vconst(v32i32, 1))
    base = b.mul(g, i64(WEIGHT_TYPES[wtype].block_bytes))
    if wtype == Q4_K:                                   # get_scale_min_k4(j) of scales[12] at 4
        s = lambda k: _byte(b, row, b.add(base, i64(4 + k)))     # noqa: E731
        if j < 4:
            sc, m = b.and_(s(j), i32(63)), b.and_(s(j + 4), i32(63))
        else:
            sc = b.or_(b.and_(s(j + 4), i32(0xF)), b.shl(b.lshr(s(j - 4), i32(6)), i32(4)))
            m = b.or_(b.lshr(s(j + 4), i32(4)), b.shl(b.lshr(s(j), i32(6)), i32(4)))
        qs = b.load(at(b, row, b.add(base, i64(16 + 32 * (j // 2))), v32i8), align=1)
        q = b.zext(b.and_(b.lshr(qs, vconst(v32i8, 4 * (j % 2))), vconst(v32i8, 15)), v32i32)
        return SubBlock(b.mul(q, splat_v(b, sc, 32)), _scale(b, row, base), _scale(b, row, b.add(base, i64(2))),
                        splat_v(b, b.sub(i32(0), m), 32))
    if wtype == Q6_K:
        h, k = divmod(j, 4)
        ql = b.load(at(b, row, b.add(base, i64(64 * h + 32 * (k & 1))), v32i8), align=1)
        qh = b.load(at(b, row, b.add(base, i64(128 + 32 * h)), v32i8), align=1)
        low = b.and_(b.lshr(ql, vconst(v32i8, 4 if k >= 2 else 0)), vconst(v32i8, 15))
        high = b.and_(b.lshr(qh, vconst(v32i8, 2 * k)), vconst(v32i8, 3))
        code = b.zext(b.or_(low, b.shl(high, vconst(v32i8, 4))), v32i32)
        sc = [b.sext(b.load(at(b, row, b.add(base, i64(192 + 2 * j + i)), i8), align=1), i32) for i in (0, 1)]
        scv = b.select(ir.Constant(ir.VectorType(ir.IntType(1), 32), [i >= 16 for i in range(32)]),
                       splat_v(b, sc[1], 32), splat_v(b, sc[0], 32))
        return SubBlock(b.mul(b.sub(code, vconst(v32i32, 32)), scv), _scale(b, row, b.add(base, i64(208))), None, None)
    raise LoweringError(f"portable llvm: no coded row for weight type {WEIGHT_TYPES[wtype].name}")


def check(n: Node, g: Graph) -> int:
    """The weight type of a MUL_MAT or GET_ROWS node this module lowers (shapes checked)."""
    w = g[n.inputs[0]]
    wtype = int(w.params["ggml_type"])
    if wtype not in TYPES or w.shape[1] % WEIGHT_TYPES[wtype].block:
        raise LoweringError(f"{n.op.value} {n.name or n.id}: portable llvm reads coded rows of Q4_0, Q5_0, Q5_1, "
                            f"Q4_K and Q6_K")
    return wtype


def define_mul_mat(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """coded.dot_sub32 on a thread's weight rows (called by matmul.define_mul_mat for TYPES)."""
    wtype = check(n, g)
    N, K = g[n.inputs[0]].shape
    wrb, xrb = WEIGHT_TYPES[wtype].row_bytes(K), pq8_bytes(K)
    fn, b = start(m, n)
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, N, ith, nth)
    with b.goto_entry_block():
        acc = b.alloca(f32)
    with for_range(b, lo, hi, name="r") as r:
        row = b.gep(wp, [b.mul(r, i64(wrb))])
        with for_range(b, 0, M, name="t") as t:
            col = b.gep(xp, [b.mul(t, i64(xrb))])
            b.store(f32(-0.0), acc)
            if K // 256:
                with for_range(b, 0, K // 256, name="g") as gi:
                    b.store(add_f32(b, b.load(acc), _group(b, wtype, row, col, gi, 8)), acc)
            if K % 256:
                b.store(add_f32(b, b.load(acc), _group(b, wtype, row, col, i64(K // 256), K % 256 // 32)), acc)
            b.store(canon_nan(b, b.load(acc)), b.gep(yp, [b.add(b.mul(t, i64(N)), r)]))
    b.ret_void()
    return fn


def _group(b: ir.IRBuilder, wtype: int, row, col, gi, nsub: int):
    """Group gi's nsub sub-blocks against the column's pq8 blocks: the exact sum of their terms
    rounded once, NaN where a block is bad."""
    ps, xs, bad = [], [], ir.Constant(ir.IntType(1), 0)
    for j in range(nsub):
        sb = sub_block(b, wtype, row, gi, j)
        ab = b.mul(b.add(b.mul(gi, i64(8)), i64(j)), i64(BLOCK_BYTES))
        codes = b.sext(b.load(at(b, col, ab, v32i8), align=1), v32i32)
        ae = b.sext(b.load(at(b, col, b.add(ab, i64(32)), i16), align=1), i32)
        am = b.zext(b.load(at(b, col, b.add(ab, i64(34)), i8), align=1), i64)
        bad = b.or_(bad, b.icmp_unsigned("!=", b.load(at(b, col, b.add(ab, i64(35)), i8), align=1), i8(0)))
        for scale, ints in ((sb.a, sb.coef), (sb.b, sb.offs)):
            if scale is None:
                continue
            dot = b.sext(reduce(b, "add", b.mul(ints, codes)), i64)          # |.| < 2^25
            ps.append(b.mul(b.mul(am, b.sext(scale[0], i64)), dot))
            xs.append(b.sext(b.add(ae, scale[1]), i64))
    y = round_terms(b, _vector(b, ps, 16), _vector(b, xs, 16))
    return b.select(bad, b.bitcast(i32(QNAN), f32), y)


def _vector(b: ir.IRBuilder, xs: list, n: int):
    """<n x i64> of xs, zeros after them (a zero term is no term)."""
    v = ir.Constant(ir.VectorType(i64, n), [0] * n)
    for lane, x in enumerate(xs):
        v = b.insert_element(v, x, i32(lane))
    return v


@kernel(Op.GET_ROWS, order=po.GET_ROWS, profile="portable")
def define_get_rows(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    src = g[n.inputs[0]]
    if src.op is not Op.WEIGHT:          # rows of an f32 node carry no order: ggml/rows.py copies them
        raise LoweringError(f"get_rows {n.name or n.id}: {po.GET_ROWS.kernel} reads rows of a weight")
    wtype = int(src.params["ggml_type"])
    K = n.shape[-1]
    if n.order != po.GET_ROWS or wtype not in rows.TYPES + TYPES or K % WEIGHT_TYPES[wtype].block or K % 32:
        raise LoweringError(f"get_rows {n.name or n.id}: portable llvm reads {po.GET_ROWS.kernel} rows of "
                            f"F16, Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K")
    rb = WEIGHT_TYPES[wtype].row_bytes(K)
    fn, b = start(m, n)
    out, sp, ids, ith, nth, dims = fn.args
    R = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, R, ith, nth)
    values = sub_values if wtype in TYPES else rows.sub_values
    with for_range(b, lo, hi, name="r") as r:
        row = b.gep(sp, [b.mul(b.sext(b.load(b.gep(typed(b, ids, i32), [r])), i64), i64(rb))])
        with for_range(b, 0, K // 32, name="s") as s:
            off = b.mul(b.add(b.mul(r, i64(K)), b.mul(s, i64(32))), i64(4))
            b.store(values(b, wtype, row, s), at(b, out, off, v32f32), align=4)
    b.ret_void()
    return fn


def sub_values(b: ir.IRBuilder, wtype: int, row, s):
    """The 32 weights of sub-block s (an i64) of a row as f32, each exact value rounded once."""
    g, j = b.udiv(s, i64(8)), b.urem(s, i64(8))
    done = b.append_basic_block("sv.done")
    with b.goto_entry_block():
        slot = b.alloca(v32f32)
    sw = b.switch(j, done)
    for k in range(8):                                  # j constant in each case (the K-quants' scales)
        case = b.append_basic_block(f"sv.{k}")
        sw.add_case(i64(k), case)
        b.position_at_end(case)
        b.store(_values(b, sub_block(b, wtype, row, g, k)), slot)
        b.branch(done)
    b.position_at_end(done)
    return b.load(slot)


def _values(b: ir.IRBuilder, sb: SubBlock):
    p = b.sext(b.mul(sb.coef, splat_v(b, sb.a[0], 32)), v32i64)          # |.| < 2^23
    wx = sb.a[1]
    if sb.b is None:
        return round_i64(b, p, splat_v(b, wx, 32))
    (ms, mx), offs = sb.b, sb.offs
    xm = b.select(b.icmp_signed("<", wx, mx), wx, mx)
    q = b.sext(b.mul(offs, splat_v(b, ms, 32)), v32i64)                   # |.| < 2^17
    s = b.add(b.shl(p, splat_v(b, b.zext(b.sub(wx, xm), i64), 32)),
              b.shl(q, splat_v(b, b.zext(b.sub(mx, xm), i64), 32)))
    return round_i64(b, s, splat_v(b, xm, 32))
