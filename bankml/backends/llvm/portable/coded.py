"""The portable profile's GET_ROWS of a weight on llvm, and MUL_MAT for the formats matmul.py
does not read: Q4_0, Q5_0, Q5_1 and the K-quants Q4_K and Q6_K, as coded rows
(profiles/portable/coded.py: every weight a·coef + b·offs of its segment, a and b f16 scales
held exactly).

Per 32-element sub-block j of a row (sub_block, a SubBlock): the coefficients coef as int8
codes q times an optional multiplier (a K-quant's sub-block scales) and the first scale a; for
two-scale formats the second scale b and the offsets' sum with the codes (Q5_1: Σcode; Q4_K:
-m_j·Σcode):
    Q4_0  coef = nibble - 8, a = d                 Q5_0  coef = code - 16, a = d
    Q5_1  coef = code, a = d; b = m, offs 1        Q6_K  coef = sc_16·(code - 32), a = d
    Q4_K  coef = sc_j·nibble, a = d; b = dmin, offs = -m_j
MUL_MAT (coded.dot_sub32), eight weight rows at a time in a vector's lanes (threads split the
rows; a thread's last ones one by one), per column and group of 256 (8 sub-blocks; a last group
of fewer): each sub-block's exact integer dot Σ coef·code (vpmaddubsw lanes, |.| < 2^25), its
terms am·a_sig·dot at ae + a_exp and am·b_sig·Σ offs·code at ae + b_exp, each row's group terms
summed exactly and rounded once (portable.exact.round_lanes: up to 16 terms a lane); NaN where
an activation block of the group is bad; the groups added in order from -0.0, the one NaN stored.
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
from bankml.backends.llvm.emit.simd import at, nibbles, sums_i8, sums_us8, v32i8
from bankml.backends.llvm.ggml.matmul.quant import ONES
from bankml.backends.llvm.portable.exact import round_i64, round_lanes
from bankml.backends.llvm.portable import rows
from bankml.backends.llvm.portable.rows import (BLOCK_BYTES, QNAN, add_f32, canon_nan, f16_parts, lane_sums, pq8_bytes,
                                                reduce, splat_v, start, v32f32, v32i32, v32i64, vconst)
from bankml.backends.llvm.registry import kernel
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.quants import Q4_0, Q4_K, Q5_0, Q5_1, Q6_K, WEIGHT_TYPES

TYPES = (Q4_0, Q5_0, Q5_1, Q4_K, Q6_K)


class SubBlock(NamedTuple):
    """Sub-block j of a row as coded.CodedRow holds it, in int8 form: its coefficients are
    mult·q (q <32 x i8>; mult None for 1, or the i32 multipliers of elements 0..15 and 16..31:
    a K-quant's sub-block scales), a = (sig, exp) i32; for two-scale formats b and the offsets'
    one value `offs` (i32: 1 for a min, -m_j for Q4_K), else None."""
    q: ir.Value
    mult: tuple | None
    a: tuple
    b: tuple | None
    offs: ir.Value | None

    def coef(self, b: ir.IRBuilder) -> ir.Value:
        """<32 x i32> the coefficients."""
        q = b.sext(self.q, v32i32)
        if self.mult is None:
            return q
        lo, hi = (splat_v(b, x, 32) for x in self.mult)
        return b.mul(q, b.select(ir.Constant(ir.VectorType(ir.IntType(1), 32), [i >= 16 for i in range(32)]), hi, lo))


def code_sum(b: ir.IRBuilder, codes):
    """Σ of 32 activation codes (<32 x i8>), i32."""
    return reduce(b, "add", sums_us8(b, ONES, codes))


def dot_lanes(b: ir.IRBuilder, sb: SubBlock, codes):
    """<8 x i32>: lane l the exact Σ q·code over elements 4l..4l+3 (vpsignb, vpmaddubsw, vpmaddwd:
    pairs below 2^15 for |q| <= 128, |code| <= 127)."""
    return sums_i8(b, sb.q, codes)


def dot_of_lanes(b: ir.IRBuilder, sb: SubBlock, lanes):
    """Σ coef·code (i32, |.| < 2^25) from dot_lanes: the lanes' sum, or a K-quant's multipliers
    times its halves' sums."""
    if sb.mult is None:
        return reduce(b, "add", lanes)
    half = [reduce(b, "add", b.shuffle_vector(lanes, lanes, ir.Constant(ir.VectorType(i32, 4), list(r))))
            for r in (range(0, 4), range(4, 8))]
    return b.add(b.mul(half[0], sb.mult[0]), b.mul(half[1], sb.mult[1]))


def _scale(b: ir.IRBuilder, row, off):
    sig, exp, _ = f16_parts(b, b.zext(b.load(at(b, row, off, i16), align=1), i32))
    return sig, exp


def _byte(b: ir.IRBuilder, row, off):
    return b.zext(b.load(at(b, row, off, i8), align=1), i32)


def _fifth_bits(b: ir.IRBuilder, row, off):
    """<32 x i8>: bit j of the 4 bytes at off, times 16 (a Q5 code's fifth bit)."""
    bits = b.bitcast(b.load(at(b, row, off, i32), align=1), ir.VectorType(ir.IntType(1), 32))
    return b.select(bits, vconst(v32i8, 16), vconst(v32i8, 0))


def sub_block(b: ir.IRBuilder, wtype: int, row, g, j: int) -> SubBlock:
    """Sub-block j (0..7) of group g (an i64: 256 elements) of a row, any block format."""
    if wtype in rows.TYPES:                            # Q8_0, Q4_1, Q1_0, Q2_0 (rows.sub_codes)
        coef, base = rows.sub_codes(b, wtype, row, b.add(b.mul(g, i64(8)), i64(j)))
        do, mo, _ = rows.sub_layout(wtype, 0)
        a, q = _scale(b, row, b.add(base, i64(do))), b.trunc(coef, v32i8)
        return SubBlock(q, None, a, None, None) if mo is None else \
            SubBlock(q, None, a, _scale(b, row, b.add(base, i64(mo))), i32(1))
    if wtype in (Q4_0, Q5_0, Q5_1):
        base = b.mul(b.add(b.mul(g, i64(8)), i64(j)), i64(WEIGHT_TYPES[wtype].block_bytes))
        a = _scale(b, row, base)
        if wtype == Q4_0:
            return SubBlock(b.sub(nibbles(b, row, b.add(base, i64(2))), vconst(v32i8, 8)), None, a, None, None)
        qh, qs = (2, 6) if wtype == Q5_0 else (4, 8)
        code = b.or_(nibbles(b, row, b.add(base, i64(qs))), _fifth_bits(b, row, b.add(base, i64(qh))))
        if wtype == Q5_0:
            return SubBlock(b.sub(code, vconst(v32i8, 16)), None, a, None, None)
        return SubBlock(code, None, a, _scale(b, row, b.add(base, i64(2))), i32(1))
    base = b.mul(g, i64(WEIGHT_TYPES[wtype].block_bytes))
    if wtype == Q4_K:                                   # get_scale_min_k4(j) of scales[12] at 4
        s = lambda k: _byte(b, row, b.add(base, i64(4 + k)))     # noqa: E731
        if j < 4:
            sc, m = b.and_(s(j), i32(63)), b.and_(s(j + 4), i32(63))
        else:
            sc = b.or_(b.and_(s(j + 4), i32(0xF)), b.shl(b.lshr(s(j - 4), i32(6)), i32(4)))
            m = b.or_(b.lshr(s(j + 4), i32(4)), b.shl(b.lshr(s(j), i32(6)), i32(4)))
        qs = b.load(at(b, row, b.add(base, i64(16 + 32 * (j // 2))), v32i8), align=1)
        q = b.and_(b.lshr(qs, vconst(v32i8, 4 * (j % 2))), vconst(v32i8, 15))
        return SubBlock(q, (sc, sc), _scale(b, row, base), _scale(b, row, b.add(base, i64(2))), b.sub(i32(0), m))
    if wtype == Q6_K:
        h, k = divmod(j, 4)
        ql = b.load(at(b, row, b.add(base, i64(64 * h + 32 * (k & 1))), v32i8), align=1)
        qh = b.load(at(b, row, b.add(base, i64(128 + 32 * h)), v32i8), align=1)
        low = b.and_(b.lshr(ql, vconst(v32i8, 4 if k >= 2 else 0)), vconst(v32i8, 15))
        high = b.and_(b.lshr(qh, vconst(v32i8, 2 * k)), vconst(v32i8, 3))
        q = b.sub(b.or_(low, b.shl(high, vconst(v32i8, 4))), vconst(v32i8, 32))
        sc = tuple(b.sext(b.load(at(b, row, b.add(base, i64(192 + 2 * j + i)), i8), align=1), i32) for i in (0, 1))
        return SubBlock(q, sc, _scale(b, row, b.add(base, i64(208))), None, None)
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
    """coded.dot_sub32 on a thread's weight rows, eight at a time in a vector's lanes (called by
    matmul.define_mul_mat for TYPES)."""
    wtype = check(n, g)
    N, K = g[n.inputs[0]].shape

    def add_groups(b, wrows, col, gi, nsub, acc):
        b.store(add_f32(b, b.load(acc), _group(b, wtype, wrows, col, gi, nsub)), acc)
    return mul_mat_kernel(m, n, (N, K), (WEIGHT_TYPES[wtype].row_bytes(K), pq8_bytes(K)), add_groups)


def mul_mat_kernel(m: ir.Module, n: Node, NK: tuple, row_bytes: tuple, add_groups) -> ir.Function:
    """A mul_mat kernel of N x K weights (rows of row_bytes[0] bytes; activation rows of
    row_bytes[1]): a thread's rows eight at a time in a vector's lanes (then one by one), each
    against every column, an <L x f32> accumulator from -0.0 through add_groups(b, wrows, col,
    gi, nsub, acc) for each group of 256 elements (then a shorter last), the one NaN stored."""
    (N, K), (wrb, xrb) = NK, row_bytes
    fn, b = start(m, n)
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, N, ith, nth)

    def rows(r0, L: int) -> None:
        with b.goto_entry_block():
            acc = b.alloca(ir.VectorType(f32, L))
        wrows = [b.gep(wp, [b.mul(b.add(r0, i64(i)), i64(wrb))]) for i in range(L)]
        with for_range(b, 0, M, name="t") as t:
            col = b.gep(xp, [b.mul(t, i64(xrb))])
            b.store(splat(b, f32(-0.0), L), acc)
            if K // 256:
                with for_range(b, 0, K // 256, name="g") as gi:
                    add_groups(b, wrows, col, gi, 8, acc)
            if K % 256:
                add_groups(b, wrows, col, i64(K // 256), K % 256 // 32, acc)
            store_lanes(b, canon_nan(b, b.load(acc)), b.gep(yp, [b.add(b.mul(t, i64(N)), r0)]))

    rows_by_eight(b, lo, hi, rows)
    b.ret_void()
    return fn


def rows_by_eight(b: ir.IRBuilder, lo, hi, body) -> None:
    """body(r0, 8) for rows lo, lo + 8, .. while eight are left, then body(r, 1) for each row left."""
    n8 = b.udiv(b.sub(hi, lo), i64(8))
    with for_range(b, 0, n8, name="r8") as i8:
        body(b.add(lo, b.mul(i8, i64(8))), 8)
    with for_range(b, b.add(lo, b.mul(n8, i64(8))), hi, name="r") as r:
        body(r, 1)


def store_lanes(b: ir.IRBuilder, v, p) -> None:
    """The lanes of v at the floats from p."""
    b.store(v, b.bitcast(p, v.type.as_pointer()), align=4)


def row_dots(b: ir.IRBuilder, sbs: list, codes):
    """<L x i32>: each row's Σ coef·code of its sub-block (sbs: one per row) against codes;
    eight rows' lane sums at once (vphaddd) where no multipliers."""
    lanes = [dot_lanes(b, sb, codes) for sb in sbs]
    if len(sbs) == 8 and sbs[0].mult is None:
        return lane_sums(b, lanes)
    return vector(b, [dot_of_lanes(b, sb, ln) for sb, ln in zip(sbs, lanes)])


def term(b: ir.IRBuilder, am, ae, scales: list, dot):
    """(p, x) <L x i64>: am·sig·dot at ae + exp per lane (scales: (sig, exp) per row; am, ae i64)."""
    L = len(scales)
    sig, ex = (vector(b, [b.sext(sc[f], i64) for sc in scales]) for f in (0, 1))
    return b.mul(b.mul(splat(b, am, L), sig), b.sext(dot, ir.VectorType(i64, L))), b.add(splat(b, ae, L), ex)


def _group(b: ir.IRBuilder, wtype: int, wrows: list, col, gi, nsub: int):
    """Group gi's nsub sub-blocks of each row (lane i: row i) against the column's pq8 blocks: the
    exact sum of each row's terms rounded once (exact.round_lanes), NaN where a block is bad."""
    terms, bad, L = [], ir.Constant(ir.IntType(1), 0), len(wrows)
    for j in range(nsub):
        ab = b.mul(b.add(b.mul(gi, i64(8)), i64(j)), i64(BLOCK_BYTES))
        ae = b.sext(b.load(at(b, col, b.add(ab, i64(32)), i16), align=1), i64)
        am = b.zext(b.load(at(b, col, b.add(ab, i64(34)), i8), align=1), i64)
        bad = b.or_(bad, b.icmp_unsigned("!=", b.load(at(b, col, b.add(ab, i64(35)), i8), align=1), i8(0)))
        codes = b.load(at(b, col, ab, v32i8), align=1)
        sbs = [sub_block(b, wtype, row, gi, j) for row in wrows]
        terms.append(term(b, am, ae, [sb.a for sb in sbs], row_dots(b, sbs, codes)))
        if sbs[0].b is not None:                          # b·Σ offs·code, offs one value per sub-block
            csum = code_sum(b, codes)
            terms.append(term(b, am, ae, [sb.b for sb in sbs], vector(b, [b.mul(csum, sb.offs) for sb in sbs])))
    y = round_lanes(b, terms)
    return b.select(bad, splat(b, b.bitcast(i32(QNAN), f32), L), y)


def vector(b: ir.IRBuilder, xs: list):
    """<len(xs) x T> of the scalars xs."""
    v = ir.Constant(ir.VectorType(xs[0].type, len(xs)), ir.Undefined)
    for lane, x in enumerate(xs):
        v = b.insert_element(v, x, i32(lane))
    return v


def splat(b: ir.IRBuilder, x, n: int):
    return vector(b, [x] * n)


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
    p = b.sext(b.mul(sb.coef(b), splat_v(b, sb.a[0], 32)), v32i64)       # |.| < 2^23
    wx = sb.a[1]
    if sb.b is None:
        return round_i64(b, p, splat_v(b, wx, 32))
    (ms, mx), offs = sb.b, sb.offs
    xm = b.select(b.icmp_signed("<", wx, mx), wx, mx)
    q = b.sext(splat_v(b, b.mul(offs, ms), 32), v32i64)                   # |.| < 2^17
    s = b.add(b.shl(p, splat_v(b, b.zext(b.sub(wx, xm), i64), 32)),
              b.shl(q, splat_v(b, b.zext(b.sub(mx, xm), i64), 32)))
    return round_i64(b, s, splat_v(b, xm, 32))
