"""The portable profile's QUANTIZE, MUL_MAT and GET_ROWS on the llvm backend (bits of
bankml/profiles/portable/quant.py: quantize_act, mul_mat, get_rows).

pq8, the activation buffer (orders.ACT_TYPE; QUANTIZE's output), one row after another, per
block of 32 values 36 bytes:
    bytes 0..31  the codes (int8, -127..127)
    bytes 32..33 e (int16): the block scale is m * 2^e
    byte  34     m (uint8, 8..15; 0 for an all-zero or bad block)
    byte  35     bad (uint8, 1 where the block holds a NaN or an infinity)

QUANTIZE, per block: x canonical (denormals read as zero); bad = any non-finite; absmax as the
largest |x| bits; (m, e) from its significand C and exponent p as act_scale; codes =
rint(x * 2^-e / m) in f64 (x * 2^-e exact, one correctly rounded vdivpd, then roundeven: the
spec's steps), clamped to +-127, all 0 where m = 0 or bad.

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
  portable_exact.room (|term| < 2^TERM_BITS), else through the i512 (round_shifted).
- one column (decode), int8 weights: four weight rows at a time (group4), each group's terms
  as f64 products (weight scale * activation scale * dot, exact) summed in f64 and rounded by
  one f64 -> f32 conversion, when portable_f64's conditions prove that exact and equal to the
  spec's rounding (exponent spreads within portable_f64.limit, no bad scale or block, no
  nonzero result below 2^-126); otherwise those four rows' group goes the exact way above.
  Q1_0 first sums each weight block's four dots, shifted to the group's least activation
  exponent, in i32 (q1_0_blocks4); a last group of one or two sub-blocks packs the four rows'
  sub-blocks into one vector (tail4). Q1_0 and Q2_0 sub-block dots are i16 pair sums added by
  vphaddw (lane_sums16).
- F16: per sub-block the products weight * code exact in f32, summed exactly in f64 (the dot
  of weights * 2^24 as an i64), the terms by portable_exact.round_terms.
Q2_0 codes are unpacked in a permuted order (byte 8p+i is element 4i+p) and the activation
permuted to match once per column (an integer dot is the same in any order).
Threads split weight rows; with several columns a thread's rows run in chunks of CHUNK_BYTES
(kept in L2 while every column passes), the columns in tiles of up to 4 (the weight unpacked
once per tile).

GET_ROWS of a weight: every weight's exact value rounded once (round_i64), NaN in a 32-block
with a bad scale (F16: a 32-block holding an inf or NaN); of an f32 node: the ggml row copy.
"""
from __future__ import annotations

from typing import NamedTuple

from llvmlite import ir

from bankml.backends.llvm import kernels_rows
from bankml.backends.llvm.common import f32, f64, for_range, i8, i16, i32, i64, intrinsic, new_function, size, \
    smin, thread_range, typed
from bankml.backends.llvm.kernels_matmul import CHUNK_BYTES, at, maddubs, psign, scratch, sums_us8, v32i8
from bankml.backends.llvm.kernels_matmul_q import ONES, q1_0_neg_signs, q1_0_sums
from bankml.backends.llvm import portable_f64 as pf
from bankml.backends.llvm.portable_exact import room, round_i64, round_shifted, round_terms
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import prod_range
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES

BLOCK_BYTES = 36                 # pq8 bytes per 32 values
TYPES = (F16, Q8_0, Q4_1, Q1_0, Q2_0)
TILE = 4                         # columns per tile
_D = 127 << 13                   # quant._D

v8i32, v8i64 = ir.VectorType(i32, 8), ir.VectorType(i64, 8)
v32i32, v32i64, v32i16 = ir.VectorType(i32, 32), ir.VectorType(i64, 32), ir.VectorType(i16, 32)
v32f32, v32f64 = ir.VectorType(f32, 32), ir.VectorType(f64, 32)
_PERM = [4 * (j % 8) + j // 8 for j in range(32)]          # Q2_0 code order: byte 8p+i is element 4i+p
_UNPERM = [_PERM.index(k) for k in range(32)]
QNAN = 0x7FC00000


def pq8_bytes(k: int) -> int:
    """Bytes of one pq8 activation row of k values."""
    return k // 32 * BLOCK_BYTES


def vconst(t: ir.VectorType, v):
    return ir.Constant(t, [v] * t.count)


def splat_v(b: ir.IRBuilder, x, n: int):
    t = ir.VectorType(x.type, n)
    u = b.insert_element(ir.Constant(t, ir.Undefined), x, i32(0))
    return b.shuffle_vector(u, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))


def reduce(b: ir.IRBuilder, kind: str, v):
    e = v.type.element
    return b.call(intrinsic(b.module, f"llvm.vector.reduce.{kind}.v{v.type.count}i{e.width}", e, [v.type]), [v])


def _start(m, n):
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    return fn, b


# ---- QUANTIZE --------------------------------------------------------------------------------

@kernel(Op.QUANTIZE, profile="portable")
def define_quantize(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    x = g[n.inputs[0]]
    K = x.shape[-1]
    if n.order != po.QUANTIZE or n.params.get("type") != po.ACT_TYPE or x.dtype != "f32" or K % 32:
        raise LoweringError(f"quantize {n.name or n.id}: portable llvm quantizes f32 rows of 32k into {po.ACT_TYPE}")
    fn, b = _start(m, n)
    out, src, ith, nth, dims = fn.args
    nblk = b.mul(size(b, dims, x.shape[:-1]), i64(K // 32))
    lo, hi = thread_range(b, nblk, ith, nth)
    with for_range(b, lo, hi, name="blk") as ib:
        xb = b.load(at(b, src, b.mul(ib, i64(128)), v32i32), align=4)
        field = b.and_(xb, vconst(v32i32, 0x7F800000))
        nonfinite = b.icmp_unsigned("==", field, vconst(v32i32, 0x7F800000))
        keep = b.and_(b.icmp_unsigned("!=", field, vconst(v32i32, 0)), b.not_(nonfinite))
        xc = b.select(keep, xb, vconst(v32i32, 0))                       # canon; non-finite read as 0
        bad = b.icmp_unsigned("!=", reduce(b, "or", b.zext(nonfinite, ir.VectorType(i8, 32))), i8(0))
        amax = reduce(b, "umax", b.and_(xc, vconst(v32i32, 0x7FFFFFFF)))  # |x| bits order as |x|
        amax = b.select(bad, i32(0), amax)
        c = b.or_(b.and_(amax, i32(0x7FFFFF)), i32(0x800000))
        p = b.sub(b.lshr(amax, i32(23)), i32(127))
        m1 = b.udiv(b.add(c, i32(_D - 1)), i32(_D))
        m2 = b.udiv(b.add(c, i32(2 * _D - 1)), i32(2 * _D))
        small = b.icmp_unsigned("<=", m1, i32(15))
        zero = b.icmp_unsigned("==", amax, i32(0))
        ms = b.select(zero, i32(0), b.select(small, m1, m2))
        e = b.select(zero, i32(0), b.select(small, b.sub(p, i32(10)), b.sub(p, i32(9))))
        # rint(x * 2^-e / m): 2^-e as f64 bits, one division, roundeven, clamp
        pow2 = b.bitcast(b.shl(b.zext(b.sub(i32(1023), e), i64), i64(52)), f64)
        y = b.fmul(b.fpext(b.bitcast(xc, v32f32), v32f64), splat_v(b, pow2, 32))
        y = b.fdiv(y, splat_v(b, b.uitofp(b.select(zero, i32(1), ms), f64), 32))
        rne = intrinsic(b.module, "llvm.roundeven.v32f64", v32f64, [v32f64])
        y = b.call(rne, [y])
        y = b.select(b.fcmp_ordered(">", y, vconst(v32f64, 127.0)), vconst(v32f64, 127.0), y)
        y = b.select(b.fcmp_ordered("<", y, vconst(v32f64, -127.0)), vconst(v32f64, -127.0), y)
        q = b.fptosi(y, v32i8)
        q = b.select(b.or_(zero, bad), vconst(v32i8, 0), q)
        ob = b.mul(ib, i64(BLOCK_BYTES))
        b.store(q, at(b, out, ob, v32i8), align=1)
        b.store(b.trunc(e, i16), at(b, out, b.add(ob, i64(32)), i16), align=1)
        b.store(b.trunc(ms, i8), at(b, out, b.add(ob, i64(34)), i8), align=1)
        b.store(b.zext(bad, i8), at(b, out, b.add(ob, i64(35)), i8), align=1)
    b.ret_void()
    return fn


# ---- weights ---------------------------------------------------------------------------------

def f16_parts(b: ir.IRBuilder, h):
    """(signed significand, exponent, bad) of f16 bits h (i32 or <n x i32>), as quant.f16_parts."""
    t = h.type
    c = (lambda v: vconst(t, v)) if isinstance(t, ir.VectorType) else (lambda v: ir.Constant(t, v))
    e5 = b.and_(b.lshr(h, c(10)), c(31))
    m10 = b.and_(h, c(1023))
    den = b.icmp_unsigned("==", e5, c(0))
    sig = b.select(den, m10, b.or_(m10, c(1024)))
    exp = b.select(den, c(-24), b.sub(e5, c(25)))
    neg = b.icmp_unsigned("!=", b.and_(h, c(0x8000)), c(0))
    return b.select(neg, b.sub(c(0), sig), sig), exp, b.icmp_unsigned("==", e5, c(31))


def sub_layout(wtype: int, j: int) -> tuple[int, int | None, int]:
    """(offset of d, of min or None, of the quants) of sub-block j (0..7) of a 256-group."""
    if wtype == Q8_0:
        return 34 * j, None, 34 * j + 2
    if wtype == Q4_1:
        return 20 * j, 20 * j + 2, 20 * j + 4
    if wtype == Q1_0:
        return 18 * (j // 4), None, 18 * (j // 4) + 2 + 4 * (j % 4)
    if wtype == Q2_0:
        return 18 * (j // 2), None, 18 * (j // 2) + 2 + 8 * (j % 2)
    return 0, None, 64 * j                                      # F16: no scale


def group_bytes(wtype: int) -> int:
    return 512 if wtype == F16 else WEIGHT_TYPES[wtype].row_bytes(256)


def q4_1_nibbles(b, w, off):
    qs = b.load(at(b, w, off, ir.VectorType(i8, 16)), align=1)
    lo = b.and_(qs, vconst(ir.VectorType(i8, 16), 15))
    hi = b.lshr(qs, vconst(ir.VectorType(i8, 16), 4))
    return b.shuffle_vector(lo, hi, ir.Constant(v32i32, list(range(32))))


def q2_0_codes(b, w, off):
    """The 32 codes (0..3) of 8 bytes of Q2_0 quants in the permuted order (byte 8p+i: plane p of byte i)."""
    word = b.load(at(b, w, off, i64), align=1)
    v = splat_v(b, word, 4)
    planes = b.lshr(v, ir.Constant(ir.VectorType(i64, 4), [0, 2, 4, 6]))
    return b.bitcast(b.and_(planes, vconst(ir.VectorType(i64, 4), 0x0303030303030303)), v32i8)


def f16_weights(b, w, off):
    """(signed significand <32 x i32>, left shift <32 x i64>, any inf/NaN) of 32 f16 weights:
    weight * 2^24 = sig << shift."""
    h = b.zext(b.load(at(b, w, off, v32i16), align=1), v32i32)
    sig, exp, bad = f16_parts(b, h)
    shift = b.zext(b.add(exp, vconst(v32i32, 24)), v32i64)
    return sig, shift, reduce(b, "or", b.zext(bad, ir.VectorType(i8, 32)))


# ---- MUL_MAT ---------------------------------------------------------------------------------

class Cols:
    """Per column of a tile, per sub-block s: am, ae, bad, sum of codes, sa (i32 scratch
    [C][npad]); per group g: aemin, aspread, gbad (i32 scratch [C][ngroups]); and the codes in
    Q2_0's permuted order ([C][K] bytes). Over the blocks of a group with am != 0, aemin is the
    least ae, aspread the largest ae - aemin, sa = ae - aemin (0 where am = 0); gbad: any bad."""

    def __init__(self, b, K: int, C: int, wtype: int):
        self.ng = -(-K // 256)
        self.npad = self.ng * 8
        n = C * self.npad
        self.am, self.ae, self.bad, self.sa = (scratch(b, i32, n, name) for name in ("act.m", "act.e", "act.bad", "act.sa"))
        self.aemin, self.aspread, self.gbad = (scratch(b, i32, C * self.ng, name)
                                               for name in ("act.emin", "act.spread", "act.gbad"))
        self.csum = scratch(b, i32, n, "act.sum") if wtype in (Q4_1, Q2_0, Q1_0) else None
        self.af = scratch(b, f64, n, "act.f64")                      # am * 2^ae (portable_f64)
        self.caf = scratch(b, f64, n, "act.sumf64") if wtype == Q4_1 else None   # csum * am * 2^ae
        self.cmul = scratch(b, i32, n, "act.mul") if wtype == Q1_0 else None      # am << (ae - aemin)
        self.perm = scratch(b, i8, C * K, "act.perm") if wtype == Q2_0 else None
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
                af = pf.act_scales(b, am, ae)
                b.store(af, self.vec(b, self.af, c, s0, pf.v8f64, load=False), align=8)
                if self.caf is not None:
                    caf = b.fmul(b.sitofp(self.vec(b, self.csum, c, s0), pf.v8f64), af)
                    b.store(caf, self.vec(b, self.caf, c, s0, pf.v8f64, load=False), align=8)
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


def f16_dots(b, w, qoff, s, cols: Cols) -> tuple[list, ir.Value]:
    """F16 sub-block at w + qoff: per column its exact integer dot of weights * 2^24 and codes
    (i64), and whether the 32 weights hold an inf or NaN. Each product weight * code is exact
    in f32 (11 + 8 bits), and their sum in f64 in any order: every partial sum is a multiple
    of 2^-24 below 2^28 (|weight| <= 65504, 32 codes <= 127), 52 bits."""
    hb = b.load(at(b, w, qoff, v32i16), align=1)
    bad = any_lane(b, b.icmp_unsigned("==", b.and_(hb, vconst(v32i16, 0x7C00)), vconst(v32i16, 0x7C00)))
    wf = b.fpext(b.bitcast(hb, ir.VectorType(ir.HalfType(), 32)), v32f32)
    out = []
    for c in range(len(cols.x)):
        prod = b.fpext(b.fmul(wf, b.sitofp(cols.codes(b, c, s), v32f32)), v32f64)
        while prod.type.count > 1:
            n = prod.type.count // 2
            lo = b.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(i32, n), list(range(n))))
            hi = b.shuffle_vector(prod, prod, ir.Constant(ir.VectorType(i32, n), list(range(n, 2 * n))))
            prod = b.fadd(lo, hi)
        dot = b.select(bad, f64(0.0), b.fmul(b.extract_element(prod, i32(0)), f64(2.0 ** 24)))
        out.append(b.fptosi(dot, i64))
    return out, bad


def int8_lanes(b, wtype: int, w, qoff, s, cols: Cols) -> list:
    """Per column, lane l = the exact sum of weight * code over elements 4l..4l+3 of the
    sub-block (Q2_0: codes 0..3 against the permuted activation; the -1 comes with csum)."""
    C = len(cols.x)
    if wtype == Q8_0:
        wq = b.load(at(b, w, qoff, v32i8), align=1)
        wabs = psign(b, wq, wq)
        return [sums_us8(b, wabs, psign(b, cols.codes(b, c, s), wq)) for c in range(C)]
    if wtype == Q4_1:
        wq = q4_1_nibbles(b, w, qoff)
        return [sums_us8(b, wq, cols.codes(b, c, s)) for c in range(C)]
    if wtype == Q1_0:
        neg = q1_0_neg_signs(b, b.load(at(b, w, qoff, i32), align=1))
        return [q1_0_sums(b, cols.codes(b, c, s), neg) for c in range(C)]
    wq = q2_0_codes(b, w, qoff)
    return [sums_us8(b, wq, cols.codes(b, c, s, permuted=True)) for c in range(C)]


_BYTE_SHUF = ir.Constant(v32i8, [j // 8 for j in range(32)])          # byte j: bits byte j / 8
_BIT_MASKS = ir.Constant(v32i8, [1 << (j % 8) for j in range(32)])     # ... its bit j % 8


def pair_sums16(b, wtype: int, w, qoff, s, cols: Cols):
    """Q1_0, Q2_0 against one column: <16 x i16>, lane l the sum over elements 2l, 2l+1 of the
    sub-block of (Q1_0) the codes whose bit is set, (Q2_0) code (0..3) * activation: the bits
    spread to bytes (broadcast, vpshufb, vpand), made 0 / 1 (vpminub), one vpmaddubsw."""
    if wtype == Q2_0:
        return maddubs(b, q2_0_codes(b, w, qoff), cols.codes(b, 0, s, permuted=True))
    word = b.bitcast(splat_v(b, b.load(at(b, w, qoff, i32), align=1), 8), v32i8)
    pshufb = intrinsic(b.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
    t = b.and_(b.call(pshufb, [word, _BYTE_SHUF]), _BIT_MASKS)
    umin = intrinsic(b.module, "llvm.umin.v32i8", v32i8, [v32i8, v32i8])
    return maddubs(b, b.call(umin, [t, ONES]), cols.codes(b, 0, s))


def lane_sums16(b, vs: list):
    """<8 x i32> whose lane j is the sum of the 16 lanes of vs[j] (8 <16 x i16>, every partial
    sum within i16): three levels of vphaddw, then the two 128-bit halves added."""
    phadd = intrinsic(b.module, "llvm.x86.avx2.phadd.w", ir.VectorType(i16, 16), [ir.VectorType(i16, 16)] * 2)
    h = [b.call(phadd, [vs[i], vs[i + 1]]) for i in range(0, 8, 2)]
    r = b.call(phadd, [b.call(phadd, [h[0], h[1]]), b.call(phadd, [h[2], h[3]])])
    lo = b.shuffle_vector(r, r, ir.Constant(v8i32, list(range(8))))
    hi = b.shuffle_vector(r, r, ir.Constant(v8i32, list(range(8, 16))))
    return b.sext(b.add(lo, hi), v8i32)


def lane_sums(b, vs: list):
    """<8 x i32> whose lane j is the sum of the 8 lanes of vs[j] (8 vectors): two levels of
    vphaddd, then the two 128-bit halves added."""
    phadd = intrinsic(b.module, "llvm.x86.avx2.phadd.d", v8i32, [v8i32, v8i32])
    h = [b.call(phadd, [vs[i], vs[i + 1]]) for i in range(0, 8, 2)]
    q0, q1 = b.call(phadd, [h[0], h[1]]), b.call(phadd, [h[2], h[3]])
    lo = b.shuffle_vector(q0, q1, ir.Constant(v8i32, [0, 1, 2, 3, 8, 9, 10, 11]))
    hi = b.shuffle_vector(q0, q1, ir.Constant(v8i32, [4, 5, 6, 7, 12, 13, 14, 15]))
    return b.add(lo, hi)


# bits of |term| per type: |dot| * am * |ws| (dot < 2^19 Q8_0, 2^16 Q4_1, 2^12 Q1_0, 2^13 Q2_0;
# am <= 15, ws <= 2047), Q4_1's min term |am * csum * ms| < 2^27
TERM_BITS = {Q8_0: 34, Q4_1: 31, Q1_0: 27, Q2_0: 28}


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


def any_lane(b, v):
    return b.icmp_unsigned("!=", reduce(b, "or", b.zext(v, ir.VectorType(i8, v.type.count))), i8(0))


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


def scale_words(b, wtype: int, w, goff, nsub: int):
    """<8 x i16>: lane j the f16 bits of sub-block j's scale (Q4_1: <8 x i32>, d | min << 16),
    each distinct block's loaded once; lanes past nsub repeat lane 0."""
    per = WEIGHT_TYPES[wtype].block // 32
    nd = -(-nsub // per)
    t = i32 if wtype == Q4_1 else i16
    v = ir.Constant(ir.VectorType(t, nd), [0] * nd)
    for k in range(nd):
        v = b.insert_element(v, b.load(at(b, w, b.add(goff, i64(sub_layout(wtype, k * per)[0])), t), align=1), i32(k))
    return b.shuffle_vector(v, v, ir.Constant(v8i32, [j // per if j < nsub else 0 for j in range(8)]))


def group4(b, wtype: int, wrows: list, gi, nsub: int, cols: Cols):
    """The group gi of four weight rows against one column, summed in f64 (portable_f64):
    (<4 x f32> the rounded results, i1 whether they are the spec's; else the exact path's)."""
    if nsub <= 2 and wtype != Q1_0:
        return tail4(b, wtype, wrows, gi, nsub, cols)
    goff = b.mul(gi, i64(group_bytes(wtype)))
    s0 = b.mul(gi, i64(8))
    zero = ir.Constant(v8i32, [0] * 8)
    af = cols.vec(b, cols.af, 0, s0, pf.v8f64)
    caf = cols.vec(b, cols.caf, 0, s0, pf.v8f64) if wtype == Q4_1 else None
    terms, words = [], []
    small = wtype in (Q1_0, Q2_0)                    # sub-block dots within i16: pair sums summed as i16
    for w in wrows:
        lanes = [ir.Constant(ir.VectorType(i16, 16), [0] * 16) if small else zero] * 8
        for j in range(nsub):
            qoff = b.add(goff, i64(sub_layout(wtype, j)[2]))
            s = b.add(s0, i64(j))
            lanes[j] = pair_sums16(b, wtype, w, qoff, s, cols) if small else int8_lanes(b, wtype, w, qoff, s, cols)[0]
        dots = lane_sums16(b, lanes) if small else lane_sums(b, lanes)
        if wtype == Q1_0:                                                     # set - clear = 2 set - all
            dots = b.sub(b.shl(dots, vconst(v8i32, 1)), cols.vec(b, cols.csum, 0, s0))
        if wtype == Q2_0:
            dots = b.sub(dots, cols.vec(b, cols.csum, 0, s0))                 # codes - 1
        if wtype == Q1_0:
            terms.append(b.mul(dots, cols.vec(b, cols.cmul, 0, s0)))
            continue
        wd = scale_words(b, wtype, w, goff, nsub)
        t = b.fmul(b.sitofp(dots, pf.v8f64), b.fmul(pf.f16_values(b, wd), af))
        if wtype == Q4_1:
            t = b.fadd(t, b.fmul(pf.f16_values(b, wd, 16), caf))
        terms.append(t)
        words.append(wd)
    if wtype == Q1_0:
        return q1_0_blocks4(b, wrows, goff, nsub, terms, cols, gi)
    r, untiny = pf.round4(b, pf.sum4(b, terms))
    n = 16 if wtype == Q4_1 else 8
    ok = pf.spread_ok(b, words, wtype == Q4_1, cols.per_group(b, cols.aspread, 0, gi),
                      cols.per_group(b, cols.gbad, 0, gi), pf.limit(TERM_BITS[wtype], n))
    return r, b.and_(ok, untiny)


def tail4(b, wtype: int, wrows: list, gi, nsub: int, cols: Cols):
    """group4 for a last group of one or two sub-blocks (K = 576: 2): the eight lanes are
    (row r, sub-block j) at 2r + j, so the four rows share one f64 pass."""
    goff = b.mul(gi, i64(group_bytes(wtype)))
    s0 = b.mul(gi, i64(8))
    zero = ir.Constant(v8i32, [0] * 8)
    t = i32 if wtype == Q4_1 else i16                                        # scale_words' lanes
    lanes, words = [], ir.Constant(ir.VectorType(t, 8), [0] * 8)
    for r, w in enumerate(wrows):
        for j in range(2):
            qoff = b.add(goff, i64(sub_layout(wtype, j)[2]))
            lanes.append(int8_lanes(b, wtype, w, qoff, b.add(s0, i64(j)), cols)[0] if j < nsub else zero)
            do = sub_layout(wtype, j if j < nsub else 0)[0]        # past nsub: sub-block 0's scale (a 0 term)
            words = b.insert_element(words, b.load(at(b, w, b.add(goff, i64(do)), t), align=1), i32(2 * r + j))
    pairs = ir.Constant(v8i32, [0, 1] * 4)

    def per_lane(arr, t):
        v = cols.vec(b, arr, 0, s0, t)
        return b.shuffle_vector(v, v, pairs)

    dots = lane_sums(b, lanes)
    if wtype == Q2_0:
        dots = b.sub(dots, per_lane(cols.csum, v8i32))                      # codes - 1
    t = b.fmul(b.sitofp(dots, pf.v8f64), b.fmul(pf.f16_values(b, words), per_lane(cols.af, pf.v8f64)))
    if wtype == Q4_1:
        t = b.fadd(t, b.fmul(pf.f16_values(b, words, 16), per_lane(cols.caf, pf.v8f64)))
    v4 = ir.VectorType(i32, 4)
    r, untiny = pf.round4(b, b.fadd(b.shuffle_vector(t, t, ir.Constant(v4, [0, 2, 4, 6])),
                                    b.shuffle_vector(t, t, ir.Constant(v4, [1, 3, 5, 7]))))
    ok = pf.spread_ok(b, [words], wtype == Q4_1, cols.per_group(b, cols.aspread, 0, gi),
                      cols.per_group(b, cols.gbad, 0, gi), pf.limit(TERM_BITS[wtype], 16 if wtype == Q4_1 else 8))
    return r, b.and_(ok, untiny)


def q1_0_blocks4(b, wrows: list, goff, nsub: int, sums: list, cols: Cols, gi):
    """Q1_0's group of four rows from sums[r] (<8 x i32>: sub-block j's dot * am_j << (ae_j - aemin)):
    per row and weight block (two per group) the i32 sum of its four (|.| < 2^31 while the
    activation spread is at most I32_SPREAD), then f64 I * d * 2^aemin, exact (portable_f64)."""
    phadd = intrinsic(b.module, "llvm.x86.avx2.phadd.d", v8i32, [v8i32, v8i32])
    blocks = b.call(phadd, [b.call(phadd, [sums[0], sums[1]]), b.call(phadd, [sums[2], sums[3]])])
    words = ir.Constant(pf.v8i16, [0] * 8)                    # lanes: block 0 of rows 0..3, block 1 of rows 0..3
    for blk in range(2):
        for r, w in enumerate(wrows):
            off = b.add(goff, i64(18 * blk if blk * 4 < nsub else 0))    # past the row's end: block 0 again (I = 0)
            words = b.insert_element(words, b.load(at(b, w, off, i16), align=1), i32(4 * blk + r))
    aemin = cols.per_group(b, cols.aemin, 0, gi)
    t = b.fmul(b.sitofp(blocks, pf.v8f64), b.fmul(pf.f16_values(b, words), splat_v(b, pf.pow2(b, aemin), 8)))
    r, untiny = pf.round4(b, b.fadd(b.shuffle_vector(t, t, ir.Constant(ir.VectorType(i32, 4), [0, 1, 2, 3])),
                                    b.shuffle_vector(t, t, ir.Constant(ir.VectorType(i32, 4), [4, 5, 6, 7]))))
    aspread = cols.per_group(b, cols.aspread, 0, gi)
    ok = pf.spread_ok(b, [words], False, aspread, cols.per_group(b, cols.gbad, 0, gi), pf.limit(TERM_BITS[Q1_0], 8))
    return r, b.and_(b.and_(ok, untiny), b.icmp_signed("<=", aspread, i32(pf.I32_SPREAD)))


def add_f32(b, x, y):
    """arith.add of f32 values without NaN payloads to keep: one rounding, a denormal result to
    zero of its sign. A NaN stays a NaN (maybe x86's default one): canon_nan makes it the one."""
    ti = _ints(x.type)
    c = (lambda v: vconst(ti, v)) if isinstance(ti, ir.VectorType) else i32
    s = b.bitcast(b.fadd(x, y), ti)
    tiny = b.icmp_unsigned("==", b.and_(s, c(0x7F800000)), c(0))
    return b.bitcast(b.select(tiny, b.and_(s, c(0x80000000)), s), x.type)


def canon_nan(b, x):
    ti = _ints(x.type)
    c = (lambda v: vconst(ti, v)) if isinstance(ti, ir.VectorType) else i32
    s = b.bitcast(x, ti)
    nan = b.icmp_unsigned(">", b.and_(s, c(0x7FFFFFFF)), c(0x7F800000))
    return b.bitcast(b.select(nan, c(QNAN), s), x.type)


def _ints(t: ir.Type) -> ir.Type:
    return ir.VectorType(i32, t.count) if isinstance(t, ir.VectorType) else i32


@kernel(Op.MUL_MAT, profile="portable")
def define_mul_mat(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    if n.order != po.MUL_MAT or w.op is not Op.WEIGHT or xq.op is not Op.QUANTIZE or xq.params.get("type") != po.ACT_TYPE:
        raise LoweringError(f"mul_mat {n.name or n.id}: portable llvm wants {po.MUL_MAT.kernel} of a weight "
                            f"and a {po.ACT_TYPE} quantize")
    wtype = int(w.params["ggml_type"])
    N, K = w.shape
    if wtype not in TYPES:
        raise LoweringError(f"mul_mat {n.name or n.id}: the portable profile reads no weight type {wtype}")
    if n.shape[-1] != N or xq.shape[-1] != K or K % WEIGHT_TYPES[wtype].block or K % 32:
        raise LoweringError(f"mul_mat {n.name or n.id}: shapes do not fit the weight")
    wrb, xrb = WEIGHT_TYPES[wtype].row_bytes(K), pq8_bytes(K)
    nfull, tail = K // 256, K % 256 // 32
    _, M_hi = prod_range(n.shape[:-1])
    fn, b = _start(m, n)
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, N, ith, nth)
    C = max(1, min(TILE, M_hi))
    tiles = [Cols(b, K, C, wtype)] + ([Cols(b, K, 1, wtype)] if C > 1 else [])

    def row(cols: Cols, m0, r):
        """Weight row r against the tile's columns: groups added in order per column."""
        C = len(cols.x)
        wrow = b.gep(wp, [b.mul(r, i64(wrb))])
        slots = []
        for _ in range(C):
            with b.goto_entry_block():
                slots.append(b.alloca(f32, name="acc"))
            b.store(f32(-0.0), slots[-1])

        def add_group(gi, nsub):
            for slot, v in zip(slots, group(b, wtype, wrow, gi, nsub, cols)):
                b.store(add_f32(b, b.load(slot), v), slot)

        with for_range(b, 0, nfull, name="grp") as gi:
            add_group(gi, 8)
        if tail:
            add_group(i64(nfull), tail)
        for c, slot in enumerate(slots):
            b.store(canon_nan(b, b.load(slot)), b.gep(yp, [b.add(b.mul(b.add(m0, i64(c)), i64(N)), r)]))

    def rows4(cols: Cols, m0, r):
        """Weight rows r..r+3 against one column: groups by group4, else the exact path."""
        wrows = [b.gep(wp, [b.mul(b.add(r, i64(k)), i64(wrb))]) for k in range(4)]
        with b.goto_entry_block():
            acc = b.alloca(pf.v4f32, name="acc4")
            exact = b.alloca(ir.ArrayType(f32, 4), name="exact4")
        b.store(vconst(pf.v4f32, -0.0), acc)

        def add_group(gi, nsub):
            r4, ok = group4(b, wtype, wrows, gi, nsub, cols)
            with b.if_then(b.not_(ok), likely=False):
                with for_range(b, 0, 4, name="exact") as k:
                    wk = b.gep(wp, [b.mul(b.add(r, k), i64(wrb))])
                    b.store(group(b, wtype, wk, gi, nsub, cols)[0], b.gep(exact, [i64(0), k]))
            v = b.select(ok, r4, b.load(typed(b, exact, pf.v4f32), align=4))
            b.store(add_f32(b, b.load(acc), v), acc)

        with for_range(b, 0, nfull, name="grp4") as gi:
            add_group(gi, 8)
        if tail:
            add_group(i64(nfull), tail)
        b.store(canon_nan(b, b.load(acc)), typed(b, b.gep(yp, [b.add(b.mul(m0, i64(N)), r)]), pf.v4f32), align=4)

    def rows(cols: Cols, m0, rlo, rhi):
        if len(cols.x) == 1 and wtype != F16:                # one column: four rows at a time
            n4 = b.add(rlo, b.mul(b.sdiv(b.sub(rhi, rlo), i64(4)), i64(4)))
            with for_range(b, rlo, n4, step=4, name="row4") as r:
                rows4(cols, m0, r)
            rlo = n4
        with for_range(b, rlo, rhi, name="row") as r:
            row(cols, m0, r)

    def column_tiles(rlo, rhi):
        full = b.sdiv(M, i64(C))
        with for_range(b, 0, full, name="ct") as t:
            m0 = b.mul(t, i64(C))
            cols = tiles[0].prep(b, [b.gep(xp, [b.mul(b.add(m0, i64(c)), i64(xrb))]) for c in range(C)])
            rows(cols, m0, rlo, rhi)
        if C > 1:
            with for_range(b, b.mul(full, i64(C)), M, name="c1") as m0:
                cols = tiles[1].prep(b, [b.gep(xp, [b.mul(m0, i64(xrb))])])
                rows(cols, m0, rlo, rhi)

    if M_hi == 1:
        column_tiles(lo, hi)
    else:                            # rows in chunks that stay in L2 while every column passes
        chunk = max(1, CHUNK_BYTES // wrb)
        with for_range(b, lo, hi, step=chunk, name="chunk") as r0:
            column_tiles(r0, smin(b, b.add(r0, i64(chunk)), hi))
    b.ret_void()
    return fn


# ---- GET_ROWS --------------------------------------------------------------------------------

def sub_values(b, wtype: int, row, s):
    """The 32 weights of sub-block s of a row as f32, each its exact value rounded once; NaN
    where the block's scale (F16: any of the 32) is inf or NaN."""
    if wtype == F16:
        sig, shift, bad = f16_weights(b, row, b.mul(s, i64(64)))
        vals = round_i64(b, b.shl(b.sext(sig, v32i64), shift), vconst(v32i32, -24))
        isbad = b.icmp_unsigned("!=", bad, i8(0))
    else:
        per = WEIGHT_TYPES[wtype].block // 32                          # sub-blocks per weight block
        do, mo, qo = sub_layout(wtype, 0)
        base = b.mul(b.udiv(s, i64(per)), i64(WEIGHT_TYPES[wtype].block_bytes))
        qoff = b.add(base, b.add(i64(qo), b.mul(b.urem(s, i64(per)), i64(4 if wtype == Q1_0 else 8))))
        if wtype == Q8_0:
            q = b.sext(b.load(at(b, row, qoff, v32i8), align=1), v32i32)
        elif wtype == Q4_1:
            q = b.zext(q4_1_nibbles(b, row, qoff), v32i32)
        elif wtype == Q1_0:
            bits = b.bitcast(b.load(at(b, row, qoff, i32), align=1), ir.VectorType(ir.IntType(1), 32))
            q = b.select(bits, vconst(v32i32, 1), vconst(v32i32, -1))
        else:
            codes = b.zext(q2_0_codes(b, row, qoff), v32i32)
            q = b.sub(b.shuffle_vector(codes, ir.Constant(v32i32, ir.Undefined), ir.Constant(v32i32, _UNPERM)),
                      vconst(v32i32, 1))
        ws, wx, isbad = f16_parts(b, b.zext(b.load(at(b, row, b.add(base, i64(do)), i16), align=1), i32))
        p = b.sext(b.mul(q, splat_v(b, ws, 32)), v32i64)                  # |.| < 2^15
        if mo is None:
            vals = round_i64(b, p, splat_v(b, wx, 32))
        else:
            ms, mx, mbad = f16_parts(b, b.zext(b.load(at(b, row, b.add(base, i64(mo)), i16), align=1), i32))
            isbad = b.or_(isbad, mbad)
            xm = b.select(b.icmp_signed("<", wx, mx), wx, mx)
            s_ = b.add(b.shl(p, splat_v(b, b.zext(b.sub(wx, xm), i64), 32)),
                       splat_v(b, b.shl(b.sext(ms, i64), b.zext(b.sub(mx, xm), i64)), 32))
            vals = round_i64(b, s_, splat_v(b, xm, 32))
    return b.select(isbad, b.bitcast(vconst(v32i32, QNAN), v32f32), vals)


@kernel(Op.GET_ROWS, profile="portable")
def define_get_rows(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    src = g[n.inputs[0]]
    if src.op is not Op.WEIGHT:
        return kernels_rows.define_get_rows(m, g, n)             # rows of an f32 node: a copy
    wtype = int(src.params["ggml_type"])
    K = n.shape[-1]
    if n.order != po.GET_ROWS or wtype not in TYPES or K % 32:
        raise LoweringError(f"get_rows {n.name or n.id}: portable llvm reads {po.GET_ROWS.kernel} rows of "
                            f"F16, Q8_0, Q4_1, Q1_0, Q2_0")
    rb = WEIGHT_TYPES[wtype].row_bytes(K)
    fn, b = _start(m, n)
    out, sp, ids, ith, nth, dims = fn.args
    R = size(b, dims, n.shape[:-1])
    lo, hi = thread_range(b, R, ith, nth)
    with for_range(b, lo, hi, name="r") as r:
        row = b.gep(sp, [b.mul(b.sext(b.load(b.gep(typed(b, ids, i32), [r])), i64), i64(rb))])
        with for_range(b, 0, K // 32, name="s") as s:
            off = b.mul(b.add(b.mul(r, i64(K)), b.mul(s, i64(32))), i64(4))
            b.store(sub_values(b, wtype, row, s), at(b, out, off, v32f32), align=4)
    b.ret_void()
    return fn
