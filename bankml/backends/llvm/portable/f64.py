"""The portable mul_mat's group sum in f64, four weight rows at once (the fast path of
portable.matmul; the exact i64 / i512 path stays the definition's other way). The Q1_0
decode's sixteen-row lookup tiles (backends/llvm/portable/q1_lut.py) make the same argument row by row.

A group's terms dot_j * ws_j * am_j * 2^(wx_j + ae_j) are each exact in f64: the weight scale
(an f16 value) times the activation scale (m * 2^e, 4 bits) has at most 15 significant bits,
times the integer dot (TERM_BITS in all) at most 34. Their f64 sum is exact when every partial
sum is: the terms are integers P_k < 2^pbits at exponents x_k within a spread S of the least,
so n terms aligned sum below 2^(pbits + S + bitlen(n - 1)); at most 2^53 (`limit`) the sum,
in any order, is exact. S is bounded by the activation scales' exponent spread in the group
(once per column, Cols.aspread) plus the weight scales' spread over the group's scales of all
four rows (here, from the f16 exponent fields; a denormal's lsb exponent is the least normal's).
The kernel computes each term at 2^-aemin (aemin: the group's least activation exponent) and
scales the sum by 2^aemin, the same exact value: the weight scale times the relative activation
scale am * 2^(ae - aemin) is exact in f32 (15 significant bits, at least 2^-21 where nonzero,
below 2^40 within the limit; rel_scales), widened to f64 and multiplied by the dot (Q4_1: plus,
by one fma, min scale * relative scale * sum of codes, 28 bits). Q4_1's dots take two
sub-blocks per vector (q4_1_dots) and come out in lane order PAIR_ORDER, the scales with them.
Then one f64 -> f32 conversion rounds the exact value once, to nearest even, +-inf past the
range: the spec's round_exact, except below 2^-126, where the spec rounds at an unbounded
exponent and flushes but the conversion rounds gradually: a nonzero sum there, a weight scale
that is inf or NaN or a bad activation block, or a spread past the limit sends the four rows
to the exact path. An exact zero is +0 (+0.0 added after the conversion).
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, f64, fma, for_range, i8, i16, i32, i64, intrinsic
from bankml.backends.llvm.emit.simd import at, madd, maddubs
from bankml.backends.llvm.portable.rows import (TERM_BITS, group_bytes, int8_lanes, lane_sums, lane_sums16,
    BLOCK_BYTES, pair_sums16, splat_v, sub_layout)
from bankml.quants import Q1_0, Q2_0, Q4_1, WEIGHT_TYPES

v4f64, v8f64, v4f32, v4i32 = ir.VectorType(f64, 4), ir.VectorType(f64, 8), ir.VectorType(f32, 4), ir.VectorType(i32, 4)
v8f32 = ir.VectorType(f32, 8)
v8i32, v8i16, v16i16 = ir.VectorType(i32, 8), ir.VectorType(i16, 8), ir.VectorType(i16, 16)
TINY = 2.0 ** -126
I32_SPREAD = 13    # Q1_0: four dots (< 2^12) * am (< 2^4) << spread sum below 2^31


def limit(pbits: int, n: int) -> int:
    """The largest exponent spread at which n terms below 2^pbits sum exactly in f64."""
    return 53 - pbits - (n - 1).bit_length()


def vconst(t: ir.VectorType, v):
    return ir.Constant(t, [v] * t.count)


def _reduce(b, kind: str, v):
    e = v.type.element
    return b.call(intrinsic(b.module, f"llvm.vector.reduce.{kind}.v{v.type.count}i{e.width}", e, [v.type]), [v])


def minmax(b, kind: str, x, y):
    """llvm.{kind} (umin, umax, smin, smax) of two integer vectors."""
    return b.call(intrinsic(b.module, f"llvm.{kind}.v{x.type.count}i{x.type.element.width}", x.type,
                            [x.type, x.type]), [x, y])


def pow2(b, e):
    """2^e as f64 for i32 (or <n x i32>) e in -1022..1023."""
    t = e.type
    if isinstance(t, ir.VectorType):
        vi64 = ir.VectorType(i64, t.count)
        bits = b.shl(b.add(b.sext(e, vi64), vconst(vi64, 1023)), vconst(vi64, 52))
        return b.bitcast(bits, ir.VectorType(f64, t.count))
    return b.bitcast(b.shl(b.add(b.sext(e, i64), i64(1023)), i64(52)), f64)


def f16_values(b, words, shift: int = 0):
    """<8 x f64> of the f16 bits in <8 x i16> words, or at bit `shift` of <8 x i32> words (exact)."""
    h = words if words.type == v8i16 else \
        b.trunc(b.lshr(words, vconst(v8i32, shift)) if shift else words, v8i16)
    return b.fpext(b.bitcast(h, ir.VectorType(ir.HalfType(), 8)), v8f64)


def f16_floats(b, words, shift: int = 0):
    """<8 x f32> of the f16 bits in <8 x i16> words, or at bit `shift` of <8 x i32> words (exact)."""
    h = words if words.type == v8i16 else \
        b.trunc(b.lshr(words, vconst(v8i32, shift)) if shift else words, v8i16)
    return b.fpext(b.bitcast(h, ir.VectorType(ir.HalfType(), 8)), v8f32)


def rel_scales(b, am, sa):
    """<8 x f32> am * 2^sa (am, sa <8 x i32>; sa = ae - aemin, clamped at 64): the activation
    scales relative to the group's least, exact; times an f16 weight scale still exact
    (15 bits, at least 2^-21 where nonzero, and below 2^40 while sa is within `limit`)."""
    e = minmax(b, "umin", sa, vconst(v8i32, 64))
    p = b.bitcast(b.shl(b.add(e, vconst(v8i32, 127)), vconst(v8i32, 23)), v8f32)
    return b.fmul(b.uitofp(am, v8f32), p)


def exponent_range(b, words: list, both: bool):
    """(least, largest) f16 exponent field (bits 10..14, 0 read as 1: a denormal's lsb exponent)
    over the scales in <8 x i16> words, or <8 x i32> words with both f16 halves (both), as i32
    of the field << 10; largest = 31 << 10 where a scale is inf or NaN."""
    if both:
        es = [b.bitcast(b.and_(w, vconst(v8i32, 0x7C007C00)), v16i16) for w in words]
        es = [minmax(b, "umax", e, vconst(v16i16, 0x0400)) for e in es]
    else:
        es = [minmax(b, "umax", b.and_(w, vconst(v8i16, 0x7C00)), vconst(v8i16, 0x0400)) for w in words]
    lo, hi = es[0], es[0]
    for e in es[1:]:
        lo, hi = minmax(b, "umin", lo, e), minmax(b, "umax", hi, e)
    return b.zext(_reduce(b, "umin", lo), i32), b.zext(_reduce(b, "umax", hi), i32)


def spread_ok(b, words: list, both: bool, aspread, gbad, lim: int):
    """i1: the four rows' f64 sums of this group are exact and none is bad (see the module)."""
    lo, hi = exponent_range(b, words, both)
    finite = b.icmp_unsigned("!=", hi, i32(0x7C00))
    spread = b.lshr(b.sub(hi, lo), i32(10))
    fits = b.icmp_signed("<=", b.add(spread, aspread), i32(lim))
    return b.and_(b.and_(finite, fits), b.icmp_unsigned("==", gbad, i32(0)))


def _half(b, v, first: int):
    return b.shuffle_vector(v, v, ir.Constant(v4i32, list(range(first, first + 4))))


def sum4(b, terms: list):
    """<4 x f64>: lane r the sum of the 8 lanes of terms[r] (four <8 x f64>); exact sums, any order."""
    h = [b.fadd(_half(b, t, 0), _half(b, t, 4)) for t in terms]
    s01 = b.fadd(b.shuffle_vector(h[0], h[1], ir.Constant(v4i32, [0, 4, 2, 6])),
                 b.shuffle_vector(h[0], h[1], ir.Constant(v4i32, [1, 5, 3, 7])))
    s23 = b.fadd(b.shuffle_vector(h[2], h[3], ir.Constant(v4i32, [0, 4, 2, 6])),
                 b.shuffle_vector(h[2], h[3], ir.Constant(v4i32, [1, 5, 3, 7])))
    return b.fadd(b.shuffle_vector(s01, s23, ir.Constant(v4i32, [0, 1, 4, 5])),
                  b.shuffle_vector(s01, s23, ir.Constant(v4i32, [2, 3, 6, 7])))


def round4(b, s):
    """(<4 x f32> s rounded once, +0 for an exact zero; i1: no lane is a nonzero below 2^-126)."""
    a = b.bitcast(b.and_(b.bitcast(s, ir.VectorType(i64, 4)), vconst(ir.VectorType(i64, 4), (1 << 63) - 1)), v4f64)
    tiny = b.and_(b.fcmp_ordered("<", a, vconst(v4f64, TINY)), b.fcmp_ordered("!=", a, vconst(v4f64, 0.0)))
    none = b.icmp_unsigned("==", _reduce(b, "or", b.zext(tiny, ir.VectorType(i8, 4))), i8(0))
    return b.fadd(b.fptrunc(s, v4f32), vconst(v4f32, 0.0)), none


# ---- four weight rows against one column (portable.matmul's rows4) ----------------------

def scale_words(b, wtype: int, w, goff, nsub: int, order=tuple(range(8))):
    """<8 x i16>: lane l the f16 bits of sub-block order[l]'s scale (Q4_1: <8 x i32>, d | min
    << 16), each distinct block's loaded once; lanes of sub-blocks past nsub repeat block 0's."""
    per = WEIGHT_TYPES[wtype].block // 32
    nd = -(-nsub // per)
    t = i32 if wtype == Q4_1 else i16
    v = ir.Constant(ir.VectorType(t, nd), [0] * nd)
    for k in range(nd):
        v = b.insert_element(v, b.load(at(b, w, b.add(goff, i64(sub_layout(wtype, k * per)[0])), t), align=1), i32(k))
    return b.shuffle_vector(v, v, ir.Constant(v8i32, [j // per if j < nsub else 0 for j in order]))


# Q4_1, one column: sub-blocks 2p, 2p+1 side by side in one 256-bit vector (one unaligned load,
# one insert), their low nibbles in one vpand, their high in a vpsrlw and a vpand; the activation
# codes arranged to match once per column (pair_codes). A row's 8 dots come out in lane order
# PAIR_ORDER (q4_1_dots); the scales are read in that order too.
PAIR_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pair_codes(b, K: int, x, out):
    """out (i8, 64 bytes per pair p of sub-blocks): the codes of elements 0..15 of sub-block 2p,
    then 0..15 of 2p + 1, then 16..31 of each; zero codes for a missing sub-block 2p + 1."""
    v32i8 = ir.VectorType(i8, 32)
    take_lo = ir.Constant(ir.VectorType(i32, 32), list(range(16)) + list(range(32, 48)))
    take_hi = ir.Constant(ir.VectorType(i32, 32), list(range(16, 32)) + list(range(48, 64)))

    def store(p, a, a2):
        for half, idx in enumerate((take_lo, take_hi)):
            dst = b.gep(out, [b.add(b.mul(p, i64(64)), i64(32 * half))])
            b.store(b.shuffle_vector(a, a2, idx), b.bitcast(dst, v32i8.as_pointer()), align=1)

    with for_range(b, 0, K // 64, name="pairs") as p:
        a = b.load(at(b, x, b.mul(p, i64(2 * BLOCK_BYTES)), v32i8), align=1)
        a2 = b.load(at(b, x, b.add(b.mul(p, i64(2 * BLOCK_BYTES)), i64(BLOCK_BYTES)), v32i8), align=1)
        store(p, a, a2)
    if K // 32 % 2:
        a = b.load(at(b, x, i64((K // 32 - 1) * BLOCK_BYTES), v32i8), align=1)
        store(i64(K // 64), a, ir.Constant(v32i8, [0] * 32))


def q4_1_dots(b, w, goff, s0, nsub: int, cols):
    """<8 x i32>: Q4_1 row w's sub-block dots of the group at goff against the one column, in
    lane order PAIR_ORDER (0 past nsub). Per pair, two vpmaddubsw added as i16 (4 products of
    codes 0..15 and activations within +-127: |.| <= 7620), then vphaddw (8 products, 15240),
    vpmaddwd by ones to i32, vphaddd: low half sub-blocks 0, 2, 4, 6, high half 1, 3, 5, 7."""
    return sums_of_pairs(b, [pair_sums(b, w, goff, s0, p, nsub, cols) for p in range(4)])


def pair_sums(b, w, goff, s0, p: int, nsub: int, cols):
    """<16 x i16>: Q4_1 row w's sub-blocks 2p (low half) and 2p + 1 (high half) of the group at
    goff against the column, each lane a sum of 4 products (0 for a sub-block past nsub)."""
    v16i8, v32i8 = ir.VectorType(i8, 16), ir.VectorType(i8, 32)
    if 2 * p >= nsub:
        return ir.Constant(v16i16, [0] * 16)
    q = [b.load(at(b, w, b.add(goff, i64(sub_layout(Q4_1, j)[2])), v16i8), align=1) if j < nsub
         else ir.Constant(v16i8, [0] * 16) for j in (2 * p, 2 * p + 1)]
    v = b.shuffle_vector(q[0], q[1], ir.Constant(ir.VectorType(i32, 32), list(range(32))))
    acts = b.mul(b.add(s0, i64(2 * p)), i64(32))                          # pair p's 64 bytes
    a_lo = b.load(b.bitcast(b.gep(cols.pairs, [acts]), v32i8.as_pointer()), align=32)
    a_hi = b.load(b.bitcast(b.gep(cols.pairs, [b.add(acts, i64(32))]), v32i8.as_pointer()), align=32)
    lo, hi = b.and_(v, vconst(v32i8, 15)), b.lshr(v, vconst(v32i8, 4))
    return b.add(maddubs(b, lo, a_lo), maddubs(b, hi, a_hi))


def sums_of_pairs(b, us: list):
    """<8 x i32> of four pair_sums u0..u3: low half the low halves' sums (u0..u3 in order),
    high half the high halves' (vphaddw, vpmaddwd by ones, vphaddd)."""
    phaddw = intrinsic(b.module, "llvm.x86.avx2.phadd.w", v16i16, [v16i16, v16i16])
    phaddd = intrinsic(b.module, "llvm.x86.avx2.phadd.d", v8i32, [v8i32, v8i32])
    y = [madd(b, b.call(phaddw, [us[i], us[i + 1]]), vconst(v16i16, 1)) for i in (0, 2)]
    return b.call(phaddd, y)


def in_pair_order(b, v):
    return b.shuffle_vector(v, v, ir.Constant(v8i32, PAIR_ORDER))


def group4(b, wtype: int, wrows: list, gi, nsub: int, cols):
    """The group gi of four weight rows against one column, summed in f64 (portable.f64):
    (<4 x f32> the rounded results, i1 whether they are the spec's; else the exact path's)."""
    if nsub <= 2 and wtype != Q1_0:
        return tail4(b, wtype, wrows, gi, nsub, cols)
    goff = b.mul(gi, i64(group_bytes(wtype)))
    s0 = b.mul(gi, i64(8))
    zero = ir.Constant(v8i32, [0] * 8)
    rel = cols.vec(b, cols.arel, 0, s0, v8f32) if wtype != Q1_0 else None
    csf = cols.vec(b, cols.csf, 0, s0, v8f64) if wtype == Q4_1 else None
    order = PAIR_ORDER if wtype == Q4_1 else list(range(8))                 # the dots' lane order
    if wtype == Q4_1:
        rel, csf = in_pair_order(b, rel), in_pair_order(b, csf)
    terms, words = [], []
    small = wtype in (Q1_0, Q2_0)                    # sub-block dots within i16: pair sums summed as i16
    for w in wrows:
        if wtype == Q4_1:
            dots = q4_1_dots(b, w, goff, s0, nsub, cols)
        else:
            lanes = [ir.Constant(v16i16, [0] * 16) if small else zero] * 8
            for j in range(nsub):
                qoff = b.add(goff, i64(sub_layout(wtype, j)[2]))
                s = b.add(s0, i64(j))
                lanes[j] = pair_sums16(b, wtype, w, qoff, s, cols) if small else \
                    int8_lanes(b, wtype, w, qoff, s, cols)[0]
            dots = lane_sums16(b, lanes) if small else lane_sums(b, lanes)
        if wtype == Q1_0:                                                     # set - clear = 2 set - all
            dots = b.sub(b.shl(dots, vconst(v8i32, 1)), cols.vec(b, cols.csum, 0, s0))
        if wtype == Q2_0:
            dots = b.sub(dots, cols.vec(b, cols.csum, 0, s0))                 # codes - 1
        if wtype == Q1_0:
            terms.append(b.mul(dots, cols.vec(b, cols.cmul, 0, s0)))
            continue
        wd = scale_words(b, wtype, w, goff, nsub, order)
        ws = b.fpext(b.fmul(f16_floats(b, wd), rel), v8f64)                 # d * am * 2^(ae - aemin), exact
        if wtype == Q4_1:
            ms = b.fpext(b.fmul(f16_floats(b, wd, 16), rel), v8f64)
            t = fma(b, b.sitofp(dots, v8f64), ws, b.fmul(ms, csf))
        else:
            t = b.fmul(b.sitofp(dots, v8f64), ws)
        terms.append(t)
        words.append(wd)
    if wtype == Q1_0:
        return q1_0_blocks4(b, wrows, goff, nsub, terms, cols, gi)
    aemin = cols.per_group(b, cols.aemin, 0, gi)
    r, untiny = round4(b, b.fmul(sum4(b, terms), splat_v(b, pow2(b, aemin), 4)))
    n = 16 if wtype == Q4_1 else 8
    ok = spread_ok(b, words, wtype == Q4_1, cols.per_group(b, cols.aspread, 0, gi),
                      cols.per_group(b, cols.gbad, 0, gi), limit(TERM_BITS[wtype], n))
    return r, b.and_(ok, untiny)


def tail4(b, wtype: int, wrows: list, gi, nsub: int, cols):
    """group4 for a last group of one or two sub-blocks (K = 576: 2): the eight lanes are
    (row r, sub-block j) at 2r + j (Q4_1: 4j + r, one pair_sums per row), so the four rows
    share one f64 pass."""
    goff = b.mul(gi, i64(group_bytes(wtype)))
    s0 = b.mul(gi, i64(8))
    zero = ir.Constant(v8i32, [0] * 8)
    t = i32 if wtype == Q4_1 else i16                                        # scale_words' lanes
    lane = (lambda r, j: 4 * j + r) if wtype == Q4_1 else (lambda r, j: 2 * r + j)
    lanes, words = [], ir.Constant(ir.VectorType(t, 8), [0] * 8)
    for r, w in enumerate(wrows):
        for j in range(2):
            if wtype != Q4_1:
                qoff = b.add(goff, i64(sub_layout(wtype, j)[2]))
                lanes.append(int8_lanes(b, wtype, w, qoff, b.add(s0, i64(j)), cols)[0] if j < nsub else zero)
            do = sub_layout(wtype, j if j < nsub else 0)[0]        # past nsub: sub-block 0's scale (a 0 term)
            words = b.insert_element(words, b.load(at(b, w, b.add(goff, i64(do)), t), align=1), i32(lane(r, j)))
    which = ir.Constant(v8i32, [k // 4 if wtype == Q4_1 else k % 2 for k in range(8)])  # lane -> sub-block

    def per_lane(arr, t):
        v = cols.vec(b, arr, 0, s0, t)
        return b.shuffle_vector(v, v, which)

    if wtype == Q4_1:
        dots = sums_of_pairs(b, [pair_sums(b, w, goff, s0, 0, nsub, cols) for w in wrows])
    else:
        dots = lane_sums(b, lanes)
    if wtype == Q2_0:
        dots = b.sub(dots, per_lane(cols.csum, v8i32))                      # codes - 1
    rel = per_lane(cols.arel, v8f32)
    ws = b.fpext(b.fmul(f16_floats(b, words), rel), v8f64)                  # as group4
    if wtype == Q4_1:
        ms = b.fpext(b.fmul(f16_floats(b, words, 16), rel), v8f64)
        t = fma(b, b.sitofp(dots, v8f64), ws, b.fmul(ms, per_lane(cols.csf, v8f64)))
    else:
        t = b.fmul(b.sitofp(dots, v8f64), ws)
    v4 = ir.VectorType(i32, 4)
    rows = [[lane(r, j) for r in range(4)] for j in range(2)]              # per j, the four rows' lanes
    s = b.fadd(b.shuffle_vector(t, t, ir.Constant(v4, rows[0])), b.shuffle_vector(t, t, ir.Constant(v4, rows[1])))
    r, untiny = round4(b, b.fmul(s, splat_v(b, pow2(b, cols.per_group(b, cols.aemin, 0, gi)), 4)))
    ok = spread_ok(b, [words], wtype == Q4_1, cols.per_group(b, cols.aspread, 0, gi),
                      cols.per_group(b, cols.gbad, 0, gi), limit(TERM_BITS[wtype], 16 if wtype == Q4_1 else 8))
    return r, b.and_(ok, untiny)


def q1_0_blocks4(b, wrows: list, goff, nsub: int, sums: list, cols, gi):
    """Q1_0's group of four rows from sums[r] (<8 x i32>: sub-block j's dot * am_j << (ae_j - aemin)):
    per row and weight block (two per group) the i32 sum of its four (|.| < 2^31 while the
    activation spread is at most I32_SPREAD), then f64 I * d * 2^aemin, exact (portable.f64)."""
    phadd = intrinsic(b.module, "llvm.x86.avx2.phadd.d", v8i32, [v8i32, v8i32])
    blocks = b.call(phadd, [b.call(phadd, [sums[0], sums[1]]), b.call(phadd, [sums[2], sums[3]])])
    words = ir.Constant(v8i16, [0] * 8)                    # lanes: block 0 of rows 0..3, block 1 of rows 0..3
    for blk in range(2):
        for r, w in enumerate(wrows):
            off = b.add(goff, i64(18 * blk if blk * 4 < nsub else 0))    # past the row's end: block 0 again (I = 0)
            words = b.insert_element(words, b.load(at(b, w, off, i16), align=1), i32(4 * blk + r))
    aemin = cols.per_group(b, cols.aemin, 0, gi)
    t = b.fmul(b.sitofp(blocks, v8f64), b.fmul(f16_values(b, words), splat_v(b, pow2(b, aemin), 8)))
    r, untiny = round4(b, b.fadd(b.shuffle_vector(t, t, ir.Constant(ir.VectorType(i32, 4), [0, 1, 2, 3])),
                                    b.shuffle_vector(t, t, ir.Constant(ir.VectorType(i32, 4), [4, 5, 6, 7]))))
    aspread = cols.per_group(b, cols.aspread, 0, gi)
    ok = spread_ok(b, [words], False, aspread, cols.per_group(b, cols.gbad, 0, gi), limit(TERM_BITS[Q1_0], 8))
    return r, b.and_(b.and_(ok, untiny), b.icmp_signed("<=", aspread, i32(I32_SPREAD)))

