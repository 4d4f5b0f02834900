"""The portable profile's QUANTIZE and GET_ROWS on the llvm backend (bits of
bankml/profiles/portable/quant.py: quantize_act, get_rows), and the weight and pq8 decoding
that MUL_MAT (backends/llvm/portable/matmul.py) and its f64 path (backends/llvm/portable/f64.py) share.

pq8, the activation buffer (orders.ACT_TYPE; QUANTIZE's output), one row after another, per
block of 32 values 36 bytes (ActScaling PerBlock: blocks of the weight's, B values in B + 4
bytes laid out alike; backends/llvm/portable/per_block.py):
    bytes 0..31  the codes (int8, -127..127)
    bytes 32..33 e (int16): the block scale is m * 2^e
    byte  34     m (uint8, 8..15; 0 for an all-zero or bad block)
    byte  35     bad (uint8, 1 where the block holds a NaN or an infinity)

QUANTIZE, per block: x canonical (denormals read as zero); bad = any non-finite; absmax as the
largest |x| bits; (m, e) from its significand C and exponent p as act_scale; codes =
rint(x * 2^-e / m) in f64 (x * 2^-e exact; the spec's one division and roundeven give the exact
quotient's nearest integer, here from the product with r(1/m): nearest_quotient), clamped to
+-127, all 0 where m = 0 or bad.

GET_ROWS of a weight: every weight's exact value rounded once (round_i64), NaN in a 32-block
with a bad scale (F16: a 32-block holding an inf or NaN); of an f32 node: the ggml row copy.

Weight sub-block dots (int8_lanes, pair_sums16, f16_dots) read the activation codes through a
tile's columns (portable.matmul.Cols).
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import (f32, f64, for_range, i8, i16, i32, i64, intrinsic, new_function, size,
    thread_range)
from bankml.backends.llvm.emit.simd import at, maddubs, nibbles, psign, sums_us8, v32i8
from bankml.backends.llvm.ggml.matmul.quant import ONES, q1_0_neg_signs, q1_0_sums
from bankml.backends.llvm.portable.exact import round_i64
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES

BLOCK_BYTES = 36                 # pq8 bytes per 32 values
TYPES = (F16, Q8_0, Q4_1, Q1_0, Q2_0)

v8i32, v8i64 = ir.VectorType(i32, 8), ir.VectorType(i64, 8)
v32i32, v32i64, v32i16 = ir.VectorType(i32, 32), ir.VectorType(i64, 32), ir.VectorType(i16, 32)
v32f32, v32f64 = ir.VectorType(f32, 32), ir.VectorType(f64, 32)
_PERM = [4 * (j % 8) + j // 8 for j in range(32)]          # Q2_0 code order: byte 8p+i is element 4i+p
_UNPERM = [_PERM.index(k) for k in range(32)]
QNAN = 0x7FC00000


def pq8_bytes(k: int, block: int = 32) -> int:
    """Bytes of one pq8 activation row of k values in blocks of `block` (PerBlock: the weight's
    own; each block its codes, then e, m and bad as below)."""
    return k // block * (block + BLOCK_BYTES - 32)


def vconst(t: ir.VectorType, v):
    return ir.Constant(t, [v] * t.count)


def splat_v(b: ir.IRBuilder, x, n: int):
    t = ir.VectorType(x.type, n)
    u = b.insert_element(ir.Constant(t, ir.Undefined), x, i32(0))
    return b.shuffle_vector(u, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))


def reduce(b: ir.IRBuilder, kind: str, v):
    e = v.type.element
    return b.call(intrinsic(b.module, f"llvm.vector.reduce.{kind}.v{v.type.count}i{e.width}", e, [v.type]), [v])


def start(m, n):
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    return fn, b


# ---- QUANTIZE --------------------------------------------------------------------------------

def nearest_quotient(b: ir.IRBuilder, x, m):
    """rint(x / m), ties to even, as f64 lanes, for x f64 lanes each an f32 value times a power
    of two (24 significant bits) with |x / m| <= 127, and m an integer 1..15 (scalar f64): the
    spec's rint of one f64 division (the exact quotient's nearest integer), by a product with
    r(1/m). y = x * r(1/m) is within 2^-45 of x/m. Off a tie, x/m is at least 2^-21 / 15 from
    every half-integer (where |x| >= 2: x a multiple of 2^-22, (2k+1)m/2 of 1/2), so y rounds
    as x/m. The ties x = (k + 1/2) m are few (|k| < 128, m < 16): for each, y is exactly k + 1/2
    (checked for all of them: tests/backends/llvm/test_llvm_portable_quantize.py)."""
    t = x.type
    y = b.fmul(x, splat_v(b, b.fdiv(f64(1.0), m), t.count))
    return b.call(intrinsic(b.module, f"llvm.roundeven.v{t.count}f64", t, [t]), [y])


def least_scale(b: ir.IRBuilder, amax, bits: int):
    """quant._least_scale of a finite amax >= 0 given by its bits (i32): (m, e, amax == 0), m and
    e i32, m in 2^(bits-1)..2^bits - 1 the least with 127·m·2^e >= amax ((0, 0) for 0): with C
    amax's 24-bit significand and p its exponent, m = ceil(C / (127·2^(17-bits))) at e = p - 6 -
    bits, or past 2^bits - 1 half of it rounded up at e + 1."""
    d = 127 << (17 - bits)
    c = b.or_(b.and_(amax, i32(0x7FFFFF)), i32(0x800000))
    p = b.sub(b.lshr(amax, i32(23)), i32(127))
    m1 = b.udiv(b.add(c, i32(d - 1)), i32(d))
    m2 = b.udiv(b.add(c, i32(2 * d - 1)), i32(2 * d))
    small = b.icmp_unsigned("<=", m1, i32((1 << bits) - 1))
    zero = b.icmp_unsigned("==", amax, i32(0))
    m = b.select(zero, i32(0), b.select(small, m1, m2))
    e = b.select(zero, i32(0), b.select(small, b.sub(p, i32(6 + bits)), b.sub(p, i32(5 + bits))))
    return m, e, zero


@kernel(Op.QUANTIZE, order=po.QUANTIZE, profile="portable")
def define_quantize(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    x = g[n.inputs[0]]
    K = x.shape[-1]
    if n.order != po.QUANTIZE or n.params.get("type") != po.ACT_TYPE or x.dtype != "f32" or K % 32:
        raise LoweringError(f"quantize {n.name or n.id}: portable llvm quantizes f32 rows of 32k into {po.ACT_TYPE}")
    fn, b = start(m, n)
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
        ms, e, zero = least_scale(b, b.select(bad, i32(0), amax), 4)
        # rint(x * 2^-e / m): 2^-e as f64 bits, then nearest_quotient, clamp
        pow2 = b.bitcast(b.shl(b.zext(b.sub(i32(1023), e), i64), i64(52)), f64)
        y = b.fmul(b.fpext(b.bitcast(xc, v32f32), v32f64), splat_v(b, pow2, 32))
        y = nearest_quotient(b, y, b.uitofp(b.select(zero, i32(1), ms), f64))
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


# ---- sub-block dots (MUL_MAT) ---------------------------------------------------------------

def f16_dots(b, w, qoff, s, cols) -> tuple[list, ir.Value]:
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


def int8_lanes(b, wtype: int, w, qoff, s, cols) -> list:
    """Per column, lane l = the exact sum of weight * code over elements 4l..4l+3 of the
    sub-block (Q2_0: codes 0..3 against the permuted activation; the -1 comes with csum)."""
    C = len(cols.x)
    if wtype == Q8_0:
        wq = b.load(at(b, w, qoff, v32i8), align=1)
        wabs = psign(b, wq, wq)
        return [sums_us8(b, wabs, psign(b, cols.codes(b, c, s), wq)) for c in range(C)]
    if wtype == Q4_1:
        wq = nibbles(b, w, qoff)
        return [sums_us8(b, wq, cols.codes(b, c, s)) for c in range(C)]
    if wtype == Q1_0:
        neg = q1_0_neg_signs(b, b.load(at(b, w, qoff, i32), align=1))
        return [q1_0_sums(b, cols.codes(b, c, s), neg) for c in range(C)]
    wq = q2_0_codes(b, w, qoff)
    return [sums_us8(b, wq, cols.codes(b, c, s, permuted=True)) for c in range(C)]


_BYTE_SHUF = ir.Constant(v32i8, [j // 8 for j in range(32)])          # byte j: bits byte j / 8
_BIT_MASKS = ir.Constant(v32i8, [1 << (j % 8) for j in range(32)])     # ... its bit j % 8


def pair_sums16(b, wtype: int, w, qoff, s, cols):
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


def any_lane(b, v):
    return b.icmp_unsigned("!=", reduce(b, "or", b.zext(v, ir.VectorType(i8, v.type.count))), i8(0))



# ---- f32 results -----------------------------------------------------------------------------

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


# ---- GET_ROWS (the kernel is backends/llvm/portable/coded.py's) ------------------------------

def sub_codes(b, wtype: int, row, s):
    """(the 32 integer coefficients <32 x i32> of sub-block s of a block-format row, in element
    order: Q8_0 its codes, Q4_1 its nibbles, Q1_0 +-1, Q2_0 code - 1; the byte offset of the
    sub-block's weight block)."""
    per = WEIGHT_TYPES[wtype].block // 32                          # sub-blocks per weight block
    _, _, qo = sub_layout(wtype, 0)
    base = b.mul(b.udiv(s, i64(per)), i64(WEIGHT_TYPES[wtype].block_bytes))
    qoff = b.add(base, b.add(i64(qo), b.mul(b.urem(s, i64(per)), i64(4 if wtype == Q1_0 else 8))))
    if wtype == Q8_0:
        return b.sext(b.load(at(b, row, qoff, v32i8), align=1), v32i32), base
    if wtype == Q4_1:
        return b.zext(nibbles(b, row, qoff), v32i32), base
    if wtype == Q1_0:
        bits = b.bitcast(b.load(at(b, row, qoff, i32), align=1), ir.VectorType(ir.IntType(1), 32))
        return b.select(bits, vconst(v32i32, 1), vconst(v32i32, -1)), base
    codes = b.zext(q2_0_codes(b, row, qoff), v32i32)
    return b.sub(b.shuffle_vector(codes, ir.Constant(v32i32, ir.Undefined), ir.Constant(v32i32, _UNPERM)),
                 vconst(v32i32, 1)), base


def block_scale(b, row, base, off):
    """(significand, exponent, bad) of the f16 scale at byte base + off of a row (i32 each; bad i1)."""
    return f16_parts(b, b.zext(b.load(at(b, row, b.add(base, i64(off)), i16), align=1), i32))


def sub_values(b, wtype: int, row, s):
    """The 32 weights of sub-block s of a row as f32, each its exact value rounded once; NaN
    where the block's scale (F16: any of the 32) is inf or NaN."""
    if wtype == F16:
        sig, shift, bad = f16_weights(b, row, b.mul(s, i64(64)))
        vals = round_i64(b, b.shl(b.sext(sig, v32i64), shift), vconst(v32i32, -24))
        isbad = b.icmp_unsigned("!=", bad, i8(0))
    else:
        do, mo, _ = sub_layout(wtype, 0)
        q, base = sub_codes(b, wtype, row, s)
        ws, wx, isbad = block_scale(b, row, base, do)
        p = b.sext(b.mul(q, splat_v(b, ws, 32)), v32i64)                  # |.| < 2^15
        if mo is None:
            vals = round_i64(b, p, splat_v(b, wx, 32))
        else:
            ms, mx, mbad = block_scale(b, row, base, mo)
            isbad = b.or_(isbad, mbad)
            xm = b.select(b.icmp_signed("<", wx, mx), wx, mx)
            s_ = b.add(b.shl(p, splat_v(b, b.zext(b.sub(wx, xm), i64), 32)),
                       splat_v(b, b.shl(b.sext(ms, i64), b.zext(b.sub(mx, xm), i64)), 32))
            vals = round_i64(b, s_, splat_v(b, xm, 32))
    return b.select(isbad, b.bitcast(vconst(v32i32, QNAN), v32f32), vals)
