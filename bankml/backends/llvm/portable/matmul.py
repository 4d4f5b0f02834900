"""The portable profile's MUL_MAT on the llvm backend (bits of
bankml/profiles/portable/quant.py: mul_mat). The pq8 activation layout, QUANTIZE, GET_ROWS and
the weight decoding: backends/llvm/portable/rows.py; the four-row f64 group sums: backends/llvm/portable/f64.py.

MUL_MAT, per (weight row, column) and group of 256 elements (8 sub-blocks of 32): each
sub-block's exact integer dot, its term dot * am * ws at exponent ae + wx (Q4_1 a second term
am * ms * sum(codes) at ae + mx), the group's terms summed exactly and rounded once, NaN where a
weight scale is inf or NaN or an activation block is bad; the groups added in order with the
profile's f32 add (a NaN made the one NaN once, at the end). Any exact sum gives the spec's bits:
- int8 weights (Q8_0, Q4_1, Q1_0 +-1, Q2_0 code - 1): vpmaddubsw / vpmaddwd lanes, the 8 sub-
  blocks' lane sums by vphaddd; per column, once per call, each group's least activation
  exponent aemin over blocks with m != 0 and the spread above it (Cols); per weight row each
  distinct block scale decoded once, its exponents' least wref and spread. The terms aligned
  at aemin + wref sum in i64 lanes when the two spreads add up to at most
  portable.exact.room (|term| < 2^TERM_BITS), else through the i512 (round_shifted).
- one column (decode), int8 weights: four weight rows at a time (group4), each group's terms
  as f64 products (weight scale * activation scale relative to the group's least, in f32,
  times the dot; exact) summed in f64, scaled by 2^aemin and rounded by one f64 -> f32
  conversion (portable.f64.group4), when portable.f64's conditions prove that exact and equal
  to the spec's rounding (exponent spreads within portable.f64.limit, no bad scale or block, no
  nonzero result below 2^-126); otherwise those four rows' group goes the exact way above.
  Q4_1 reads two sub-blocks' nibbles per 256-bit vector against the column's codes arranged
  by pairs once per call (portable.f64.q4_1_dots).
  Q1_0 first sums each weight block's four dots, shifted to the group's least activation
  exponent, in i32 (q1_0_blocks4); a last group of one or two sub-blocks packs the four rows'
  sub-blocks into one vector (tail4). Q1_0 and Q2_0 sub-block dots are i16 pair sums added by
  vphaddw (lane_sums16).
- the decode (one column known at compile time), Q1_0: sixteen weight rows at a time (rows16),
  the sub-block dots by table lookups over the column's codes (backends/llvm/portable/q1_lut.py;
  tables built once per call in Cols.prep), the same i32 block sums and f64 group sums, row by
  row proved exact or sent the exact way; a thread's last rows (fewer than 16) as above.
- F16: per sub-block the products weight * code exact in f32, summed exactly in f64 (the dot
  of weights * 2^24 as an i64), the terms by portable.exact.round_terms.
Q2_0 codes are unpacked in a permuted order (byte 8p+i is element 4i+p) and the activation
permuted to match once per column (an integer dot is the same in any order).
Threads split weight rows. The kernel (define_mul_mat), step by step:
  1. _setup: the node checked; the function; the column tiles' scratch (Cols);
  2. with several columns, a thread's rows in chunks of CHUNK_BYTES (kept in L2 while every
     column passes);
  3. _column_tiles: the columns in tiles of up to 4 (the weight unpacked once per tile), each
     tile's activation scales and exponents read once (Cols.prep);
  4. _rows: a Q1_0 decode's weight rows sixteen at a time, one column's int8 rows four at a
     time, the rest one by one;
  5. _rows16, _rows4, _row: per row the groups in order, each group's rounded result
     (q1lut.group16, f64.group4, or group: the exact way) added by add_f32 (arith.add), the
     one NaN stored (canon_nan).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, f64, for_range, i8, i16, i32, i64, size, smin, typed, thread_range
from bankml.backends.llvm.ggml.matmul.tiling import CHUNK_BYTES
from bankml.backends.llvm.emit.simd import at, scratch, v32i8
from bankml.backends.llvm.portable import coded, q1_lut as q1lut, f64 as pf
from bankml.backends.llvm.portable.rows import (BLOCK_BYTES, QNAN, TERM_BITS, _PERM, any_lane, f16_dots, f16_parts,
    add_f32, canon_nan, group_bytes, int8_lanes, lane_sums, pq8_bytes, reduce, splat_v, start, sub_layout, v32i32,
    vconst)
from bankml.backends.llvm.portable.exact import room, round_shifted, round_terms
from bankml.errors import LoweringError
from bankml.ir.dims import prod_range
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.backends.llvm.registry import kernel
from bankml.profiles.portable import orders as po
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES

TYPES = (F16, Q8_0, Q4_1, Q1_0, Q2_0)
TILE = 4                         # columns per tile
v8i32, v8i64 = ir.VectorType(i32, 8), ir.VectorType(i64, 8)


# ---- MUL_MAT ---------------------------------------------------------------------------------

class Cols:
    """Per column of a tile, per sub-block s: am, ae, bad, sum of codes, sa (i32 scratch
    [C][npad]), arel = am * 2^sa (f32) and csf = the sum of codes (f64, Q4_1) for
    portable.f64; per group g: aemin, aspread, gbad (i32 scratch [C][ngroups]); the codes in
    Q2_0's permuted order ([C][K] bytes); lut: a Q1_0 decode column's lookup tables; pairs: a
    Q4_1 one-column tile's codes by pairs of sub-blocks (portable.f64.pair_codes). Over the
    blocks of a group with am != 0, aemin is the least ae, aspread the largest ae - aemin,
    sa = ae - aemin (0 where am = 0); gbad: any bad."""

    def __init__(self, b, K: int, C: int, wtype: int, lut: bool = False):
        self.ng = -(-K // 256)
        self.npad = self.ng * 8
        n = C * self.npad
        self.am, self.ae, self.bad, self.sa = (scratch(b, i32, n, name) for name in ("act.m", "act.e", "act.bad", "act.sa"))
        self.aemin, self.aspread, self.gbad = (scratch(b, i32, C * self.ng, name)
                                               for name in ("act.emin", "act.spread", "act.gbad"))
        self.csum = scratch(b, i32, n, "act.sum") if wtype in (Q4_1, Q2_0, Q1_0) else None
        self.arel = scratch(b, f32, n, "act.rel") if wtype in (Q8_0, Q4_1, Q2_0) else None  # pf.rel_scales
        self.csf = scratch(b, f64, n, "act.csumf64") if wtype == Q4_1 else None  # csum
        self.cmul = scratch(b, i32, n, "act.mul") if wtype == Q1_0 else None      # am << (ae - aemin)
        self.perm = scratch(b, i8, C * K, "act.perm") if wtype == Q2_0 else None
        self.pairs = scratch(b, i8, self.npad * 32, "act.pairs") if wtype == Q4_1 and C == 1 else None  # pf.pair_codes
        self.lut = scratch(b, i8, K // 32 * q1lut.TABLE_BYTES_PER_32, "act.lut") if lut else None  # one Q1_0 column
        self.K = K
        self.x = []

    def prep(self, b, xrows):
        K, npad = self.K, self.npad
        self.x = xrows
        for c, x in enumerate(xrows):
            with for_range(b, 0, K // 32, name="prep") as s:
                ob = b.mul(s, i64(BLOCK_BYTES))
                slot = b.add(s, i64(c * npad))
                b.store(b.sext(b.load(at(b, x, b.add(ob, i64(32)), i16), align=1), i32), b.gep(self.ae, [slot]))
                b.store(b.zext(b.load(at(b, x, b.add(ob, i64(34)), i8)), i32), b.gep(self.am, [slot]))
                b.store(b.zext(b.load(at(b, x, b.add(ob, i64(35)), i8)), i32), b.gep(self.bad, [slot]))
                if self.csum is not None or self.perm is not None:
                    q = b.load(at(b, x, ob, v32i8), align=1)
                    b.store(reduce(b, "add", b.sext(q, v32i32)), b.gep(self.csum, [slot]))
                if self.perm is not None:
                    qp = b.shuffle_vector(q, ir.Constant(v32i8, ir.Undefined), ir.Constant(v32i32, _PERM))
                    b.store(qp, typed(b, b.gep(self.perm, [b.add(b.mul(s, i64(32)), i64(c * K))]), v32i8), align=1)
            for s in range(K // 32, npad):                     # padding: am = 0 makes the terms 0
                for arr in (self.am, self.ae, self.bad, self.csum):
                    if arr is not None:
                        b.store(i32(0), b.gep(arr, [i64(c * npad + s)]))
            with for_range(b, 0, self.ng, name="prepg") as gi:
                s0 = b.mul(gi, i64(8))
                am, ae = self.vec(b, self.am, c, s0), self.vec(b, self.ae, c, s0)
                nz = b.icmp_unsigned("!=", am, vconst(v8i32, 0))
                emin = reduce(b, "smin", b.select(nz, ae, vconst(v8i32, 1 << 20)))
                emax = reduce(b, "smax", b.select(nz, ae, vconst(v8i32, -(1 << 20))))
                none = b.icmp_signed("==", emin, i32(1 << 20))
                emin = b.select(none, i32(0), emin)
                slot = b.add(gi, i64(c * self.ng))
                b.store(emin, b.gep(self.aemin, [slot]))
                b.store(b.select(none, i32(0), b.sub(emax, emin)), b.gep(self.aspread, [slot]))
                b.store(reduce(b, "or", self.vec(b, self.bad, c, s0)), b.gep(self.gbad, [slot]))
                sa = b.select(nz, b.sub(ae, splat_v(b, emin, 8)), vconst(v8i32, 0))
                b.store(sa, typed(b, b.gep(self.sa, [b.add(s0, i64(c * npad))]), v8i32), align=4)
                if self.cmul is not None:                    # 0 where the shift passes I32_SPREAD
                    fits = b.icmp_unsigned("<=", sa, vconst(v8i32, pf.I32_SPREAD))
                    cm = b.select(fits, b.shl(am, b.select(fits, sa, vconst(v8i32, 0))), vconst(v8i32, 0))
                    b.store(cm, typed(b, b.gep(self.cmul, [b.add(s0, i64(c * npad))]), v8i32), align=4)
                if self.arel is not None:
                    b.store(pf.rel_scales(b, am, sa), self.vec(b, self.arel, c, s0, pf.v8f32, load=False), align=4)
                if self.csf is not None:
                    b.store(b.sitofp(self.vec(b, self.csum, c, s0), pf.v8f64),
                            self.vec(b, self.csf, c, s0, pf.v8f64, load=False), align=8)
        if self.lut is not None:
            q1lut.tables(b, K, xrows[0], self.lut)
        if self.pairs is not None:
            pf.pair_codes(b, K, xrows[0], self.pairs)
        return self

    def per_group(self, b, arr, c: int, gi):
        return b.load(b.gep(arr, [b.add(gi, i64(c * self.ng))]))

    def vec(self, b, arr, c: int, s0, t: ir.VectorType = v8i32, load: bool = True):
        """<8 x i32> (or t) of arr for column c, sub-blocks s0..s0+7 (load=False: its pointer)."""
        p = typed(b, b.gep(arr, [b.add(s0, i64(c * self.npad))]), t)
        return b.load(p, align=4) if load else p

    def codes(self, b, c: int, s, permuted: bool = False):
        if permuted:
            return b.load(typed(b, b.gep(self.perm, [b.add(b.mul(s, i64(32)), i64(c * self.K))]), v32i8), align=1)
        return b.load(at(b, self.x[c], b.mul(s, i64(BLOCK_BYTES)), v32i8), align=1)



class Scales(NamedTuple):
    """A group's weight scales on 8 lanes (sub-blocks; 0 past the group's end): ws the signed
    significands, wsh = wx - wref; for Q4_1 ms, msh = mx - wref of the mins. wref is the least
    exponent, spread the largest less wref, bad: a scale is inf or NaN."""
    ws: ir.Value
    wsh: ir.Value
    ms: ir.Value | None
    msh: ir.Value | None
    wref: ir.Value
    spread: ir.Value
    bad: ir.Value


def weight_scales(b, wtype: int, w, goff, nsub: int) -> Scales:
    """Each distinct block's f16 scale loaded and decoded once (Q1_0: 2 per group, Q2_0: 4),
    then spread over the sub-blocks' lanes."""
    per = WEIGHT_TYPES[wtype].block // 32
    nd = -(-nsub // per)
    t = ir.VectorType(i32, nd)
    v = ir.Constant(t, [0] * nd)
    for k in range(nd):
        do, mo, _ = sub_layout(wtype, k * per)
        word = b.zext(b.load(at(b, w, b.add(goff, i64(do)), i16), align=1), i32) if mo is None else \
            b.load(at(b, w, b.add(goff, i64(do)), i32), align=1)            # Q4_1: d and min in one word
        v = b.insert_element(v, word, i32(k))
    if wtype == Q4_1:                                                         # [d..., min...]
        v = b.shuffle_vector(b.and_(v, vconst(t, 0xFFFF)), b.lshr(v, vconst(t, 16)),
                             ir.Constant(ir.VectorType(i32, 2 * nd), list(range(2 * nd))))
    sig, exp, bad = f16_parts(b, v)
    wref, wmax = reduce(b, "smin", exp), reduce(b, "smax", exp)
    sh = b.sub(exp, splat_v(b, wref, exp.type.count))

    def lanes(x, first):
        idx = [first + j // per if j < nsub else first for j in range(8)]
        return b.shuffle_vector(x, ir.Constant(x.type, [0] * x.type.count), ir.Constant(v8i32, idx))

    pad = ir.Constant(v8i32, [-1 if j < nsub else 0 for j in range(8)])
    ws = b.and_(lanes(sig, 0), pad)                                          # 0 past nsub: no term
    if wtype == Q4_1:
        return Scales(ws, lanes(sh, 0), b.and_(lanes(sig, nd), pad), lanes(sh, nd), wref, b.sub(wmax, wref),
                      any_lane(b, bad))
    return Scales(ws, lanes(sh, 0), None, None, wref, b.sub(wmax, wref), any_lane(b, bad))



def group(b, wtype: int, w, gi, nsub: int, cols: Cols) -> list:
    """The rounded results (f32, one per column) of the group gi of a weight row: nsub sub-blocks."""
    goff = b.mul(gi, i64(group_bytes(wtype)))
    s0 = b.mul(gi, i64(8))
    C = len(cols.x)
    out = []
    if wtype == F16:
        dots = [ir.Constant(v8i64, [0] * 8)] * C
        wbad = ir.Constant(ir.IntType(1), 0)
        for j in range(nsub):
            ds, bad = f16_dots(b, w, b.add(goff, i64(64 * j)), b.add(s0, i64(j)), cols)
            dots = [b.insert_element(v, d, i32(j)) for v, d in zip(dots, ds)]
            wbad = b.or_(wbad, bad)
        for c in range(C):
            am, ae = cols.vec(b, cols.am, c, s0), cols.vec(b, cols.ae, c, s0)
            p = b.mul(dots[c], b.sext(am, v8i64))                             # |.| < 2^57
            r = round_terms(b, p, b.sext(b.add(ae, vconst(v8i32, -24)), v8i64))
            isbad = b.or_(wbad, b.icmp_unsigned("!=", reduce(b, "or", cols.vec(b, cols.bad, c, s0)), i32(0)))
            out.append(b.select(isbad, b.bitcast(i32(QNAN), f32), r))
        return out
    zero = ir.Constant(v8i32, [0] * 8)
    lanes = [[zero] * 8 for _ in range(C)]
    for j in range(nsub):
        qoff = b.add(goff, i64(sub_layout(wtype, j)[2]))
        for c, v in enumerate(int8_lanes(b, wtype, w, qoff, b.add(s0, i64(j)), cols)):
            lanes[c][j] = v
    sc = weight_scales(b, wtype, w, goff, nsub)
    n = 16 if wtype == Q4_1 else 8
    for c in range(C):
        dots = lane_sums(b, lanes[c])
        am, sa = cols.vec(b, cols.am, c, s0), cols.vec(b, cols.sa, c, s0)
        if wtype == Q2_0:
            dots = b.sub(dots, cols.vec(b, cols.csum, c, s0))                 # codes - 1
        p = b.mul(b.sext(dots, v8i64), b.sext(b.mul(am, sc.ws), v8i64))
        sh = b.add(sa, sc.wsh)
        if wtype == Q4_1:
            p2 = b.sext(b.mul(b.mul(cols.vec(b, cols.csum, c, s0), am), sc.ms), v8i64)
            both = ir.Constant(ir.VectorType(i32, 16), list(range(16)))
            p, sh = b.shuffle_vector(p, p2, both), b.shuffle_vector(sh, b.add(sa, sc.msh), both)
        aemin = cols.per_group(b, cols.aemin, c, gi)
        fits = b.icmp_signed("<=", b.add(cols.per_group(b, cols.aspread, c, gi), sc.spread),
                             i32(room(TERM_BITS[wtype], n)))
        x = b.add(sh, splat_v(b, b.add(aemin, sc.wref), n))
        r = round_shifted(b, p, sh, b.add(aemin, sc.wref), fits, x)
        isbad = b.or_(sc.bad, b.icmp_unsigned("!=", cols.per_group(b, cols.gbad, c, gi), i32(0)))
        out.append(b.select(isbad, b.bitcast(i32(QNAN), f32), r))
    return out


@dataclass
class _MulMat:
    """A portable mul_mat kernel's values: its builder, weight type and sizes, pointers and column tiles."""
    fn: ir.Function
    b: ir.IRBuilder
    wtype: int
    N: int                         # weight rows
    K: int
    wrb: int                       # bytes of a weight row, an activation (pq8) row
    xrb: int
    nfull: int                     # whole groups of 256 per row
    tail: int                      # sub-blocks of 32 in a last group
    M_hi: int                      # columns at most
    C: int                         # columns per tile
    wp: ir.Value
    xp: ir.Value
    yp: ir.Value
    M: ir.Value                    # columns of this call
    tiles: list                    # Cols of C columns, and of 1 where C > 1


@kernel(Op.MUL_MAT, order=po.MUL_MAT, profile="portable")
def define_mul_mat(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """quant.mul_mat on a thread's weight rows, in the steps of the module's docstring (the
    coded rows of Q4_0, Q5_0, Q5_1, Q4_K and Q6_K: backends/llvm/portable/coded.py)."""
    if g[n.inputs[0]].op is Op.WEIGHT and int(g[n.inputs[0]].params["ggml_type"]) in coded.TYPES:
        _check_inputs(g, n)
        return coded.define_mul_mat(m, g, n)
    k, lo, hi = _setup(m, g, n)                                    # 1.
    b = k.b
    if k.M_hi == 1:
        _column_tiles(k, lo, hi)                                   # 3.
    else:                            # 2. rows in chunks that stay in L2 while every column passes
        chunk = max(1, CHUNK_BYTES // k.wrb)
        with for_range(b, lo, hi, step=chunk, name="chunk") as r0:
            _column_tiles(k, r0, smin(b, b.add(r0, i64(chunk)), hi))
    b.ret_void()
    return k.fn


def _setup(m: ir.Module, g: Graph, n: Node) -> tuple[_MulMat, ir.Value, ir.Value]:
    """1. The node checked; the function, the column tiles' scratch (Cols) and this thread's rows [lo, hi)."""
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    _check_inputs(g, n)
    wtype = int(w.params["ggml_type"])
    N, K = w.shape
    if wtype not in TYPES:
        raise LoweringError(f"mul_mat {n.name or n.id}: the portable profile reads no weight type {wtype}")
    if n.shape[-1] != N or xq.shape[-1] != K or K % WEIGHT_TYPES[wtype].block or K % 32:
        raise LoweringError(f"mul_mat {n.name or n.id}: shapes do not fit the weight")
    _, M_hi = prod_range(n.shape[:-1])
    fn, b = start(m, n)
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, N, ith, nth)
    C = max(1, min(TILE, M_hi))
    lut = wtype == Q1_0 and M_hi == 1 and K % 128 == 0          # the decode: 16 rows by table lookups
    tiles = [Cols(b, K, C, wtype, lut)] + ([Cols(b, K, 1, wtype)] if C > 1 else [])
    k = _MulMat(fn, b, wtype, N, K, WEIGHT_TYPES[wtype].row_bytes(K), pq8_bytes(K), K // 256, K % 256 // 32,
                M_hi, C, wp, xp, yp, M, tiles)
    return k, lo, hi


def _check_inputs(g: Graph, n: Node) -> None:
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    if n.order != po.MUL_MAT or w.op is not Op.WEIGHT or xq.op is not Op.QUANTIZE or xq.order != po.QUANTIZE \
            or xq.params.get("type") != po.ACT_TYPE:
        raise LoweringError(f"mul_mat {n.name or n.id}: portable llvm wants {po.MUL_MAT.kernel} of a weight "
                            f"and a {po.ACT_TYPE} quantize")


def _column_tiles(k: _MulMat, rlo, rhi) -> None:
    """3. The columns in tiles of C (then one by one), each tile's activation blocks read once (Cols.prep)."""
    b, C = k.b, k.C
    full = b.sdiv(k.M, i64(C))
    with for_range(b, 0, full, name="ct") as t:
        m0 = b.mul(t, i64(C))
        cols = k.tiles[0].prep(b, [b.gep(k.xp, [b.mul(b.add(m0, i64(c)), i64(k.xrb))]) for c in range(C)])
        _rows(k, cols, m0, rlo, rhi)
    if C > 1:
        with for_range(b, b.mul(full, i64(C)), k.M, name="c1") as m0:
            cols = k.tiles[1].prep(b, [b.gep(k.xp, [b.mul(m0, i64(k.xrb))])])
            _rows(k, cols, m0, rlo, rhi)


def _rows(k: _MulMat, cols: Cols, m0, rlo, rhi) -> None:
    """4. Weight rows [rlo, rhi) against a tile: sixteen (Q1_0 decode), four (one column) or one at a time."""
    b = k.b
    if cols.lut is not None:                             # one Q1_0 column: 16 rows at a time
        n16 = b.add(rlo, b.mul(b.sdiv(b.sub(rhi, rlo), i64(q1lut.ROWS)), i64(q1lut.ROWS)))
        with for_range(b, rlo, n16, step=q1lut.ROWS, name="row16") as r:
            _rows16(k, cols, m0, r)
        rlo = n16
    if len(cols.x) == 1 and k.wtype != F16:              # one column: four rows at a time
        n4 = b.add(rlo, b.mul(b.sdiv(b.sub(rhi, rlo), i64(4)), i64(4)))
        with for_range(b, rlo, n4, step=4, name="row4") as r:
            _rows4(k, cols, m0, r)
        rlo = n4
    with for_range(b, rlo, rhi, name="row") as r:
        _row(k, cols, m0, r)


def _row(k: _MulMat, cols: Cols, m0, r) -> None:
    """5. Weight row r against the tile's columns: groups (group) added in order per column (add_f32)."""
    b = k.b
    C = len(cols.x)
    wrow = b.gep(k.wp, [b.mul(r, i64(k.wrb))])
    slots = []
    for _ in range(C):
        with b.goto_entry_block():
            slots.append(b.alloca(f32, name="acc"))
        b.store(f32(-0.0), slots[-1])

    def add_group(gi, nsub):
        for slot, v in zip(slots, group(b, k.wtype, wrow, gi, nsub, cols)):
            b.store(add_f32(b, b.load(slot), v), slot)

    with for_range(b, 0, k.nfull, name="grp") as gi:
        add_group(gi, 8)
    if k.tail:
        add_group(i64(k.nfull), k.tail)
    for c, slot in enumerate(slots):
        b.store(canon_nan(b, b.load(slot)), b.gep(k.yp, [b.add(b.mul(b.add(m0, i64(c)), i64(k.N)), r)]))


def _rows4(k: _MulMat, cols: Cols, m0, r) -> None:
    """5. Weight rows r..r+3 against one column: groups by f64.group4, else the exact path (group)."""
    b, wp, wrb = k.b, k.wp, k.wrb
    wrows = [b.gep(wp, [b.mul(b.add(r, i64(j)), i64(wrb))]) for j in range(4)]
    with b.goto_entry_block():
        acc = b.alloca(pf.v4f32, name="acc4")
        exact = b.alloca(ir.ArrayType(f32, 4), name="exact4")
    b.store(vconst(pf.v4f32, -0.0), acc)

    def add_group(gi, nsub):
        r4, ok = pf.group4(b, k.wtype, wrows, gi, nsub, cols)
        with b.if_then(b.not_(ok), likely=False):
            with for_range(b, 0, 4, name="exact") as j:
                wk = b.gep(wp, [b.mul(b.add(r, j), i64(wrb))])
                b.store(group(b, k.wtype, wk, gi, nsub, cols)[0], b.gep(exact, [i64(0), j]))
        v = b.select(ok, r4, b.load(typed(b, exact, pf.v4f32), align=4))
        b.store(add_f32(b, b.load(acc), v), acc)

    with for_range(b, 0, k.nfull, name="grp4") as gi:
        add_group(gi, 8)
    if k.tail:
        add_group(i64(k.nfull), k.tail)
    b.store(canon_nan(b, b.load(acc)), typed(b, b.gep(k.yp, [b.add(b.mul(m0, i64(k.N)), r)]), pf.v4f32), align=4)


def _rows16(k: _MulMat, cols: Cols, m0, r) -> None:
    """5. Weight rows r..r+15 against one Q1_0 column: groups by q1lut.group16, else the exact path (group)."""
    b, wp, wrb = k.b, k.wp, k.wrb
    wrows = [b.gep(wp, [b.mul(b.add(r, i64(j)), i64(wrb))]) for j in range(q1lut.ROWS)]
    with b.goto_entry_block():
        acc = b.alloca(q1lut.v16f32, name="acc16")
        exact = b.alloca(ir.ArrayType(f32, q1lut.ROWS), name="exact16")
    b.store(vconst(q1lut.v16f32, -0.0), acc)

    def add_group(gi, nblk):
        r16, ok = q1lut.group16(b, k.K, wrows, gi, nblk, cols)
        fast = q1lut.all_lanes(b, ok)
        with b.if_then(b.not_(fast), likely=False):
            b.store(r16, typed(b, exact, q1lut.v16f32), align=4)
            with for_range(b, 0, q1lut.ROWS, name="exact16") as j:
                with b.if_then(b.not_(b.extract_element(ok, b.trunc(j, i32)))):
                    wk = b.gep(wp, [b.mul(b.add(r, j), i64(wrb))])
                    b.store(group(b, k.wtype, wk, gi, 4 * nblk, cols)[0], b.gep(exact, [i64(0), j]))
        v = b.select(fast, r16, b.load(typed(b, exact, q1lut.v16f32), align=4))
        b.store(add_f32(b, b.load(acc), v), acc)

    with for_range(b, 0, k.nfull, name="grp16") as gi:
        add_group(gi, 2)
    if k.tail:
        add_group(i64(k.nfull), k.tail // 4)
    b.store(canon_nan(b, b.load(acc)), typed(b, b.gep(k.yp, [b.add(b.mul(m0, i64(k.N)), r)]), q1lut.v16f32),
            align=4)
