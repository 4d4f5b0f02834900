"""Exact integer sums rounded once to f32, as the portable profile's arith.round_exact, in LLVM IR.

    round_i64(b, s, x)    s * 2^x (s i64, x i32; scalars or vectors of equal lanes) rounded once
    round_terms(b, p, x)  sum_k p[k] * 2^x[k] (p, x <n x i64>) exactly, rounded once (a scalar f32)
    round_shifted(b, p, sh, xref, fits, x)  the same with the alignment made by the caller
    round_lanes(b, [(p, x), ...])  per lane of <L x i64> terms, each lane's sum rounded once

Rounding (arith.int_to_f32 / round_exact): the exact value is rounded to 24 significant bits,
nearest even, at an unbounded exponent; a rounded value of 2^128 or more is +-inf, one below
2^-126 zero of its sign; an exact zero is +0. `round_i64` gets the 24 bits from one sitofp (i64 -> f32
is correctly rounded: cvtsi2ss), then moves the exponent by x in the bits, as arith.scale2.

`round_terms` is exact for up to 32 terms with |p| < 2^63 whose nonzero terms' exponents span
at most 440 (their aligned sum fits the i512), which every group of the profile does (activation
scale exponents -136..118, f16 exponents -24..6: a span below 300):
- fast path: every nonzero term shifted to the least exponent of the nonzero terms has at most
  58 bits (the spec's rule), so the sum of up to 32 of them is an exact i64: one round_i64;
- wide path (a call, rare): the window first (arith.windowed: the largest term's least place
  L, of equal terms the greatest; every term below L - SUM_WINDOW floored there by an
  arithmetic shift), the terms aligned at max(L - SUM_WINDOW, least exponent) in an i512, whose
  top 62 bits (the bits below them ORed into the last, a sticky bit, which rounds to 24 bits as
  the whole would) go through round_i64 at the exponent they stand at. (A fast path's spread
  is at most 58 places, inside the window: no term there is past it.)
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, for_range, i1, i32, i64, intrinsic, new_function
from bankml.profiles.portable.arith import SUM_WINDOW

i512 = ir.IntType(512)
WIDE = "bankml.portable.round_wide"
_BIG = 1 << 40                 # an exponent beyond every real one: "no nonzero term"


def _const(t: ir.Type, v: int):
    """Constant v of an int type or an int vector type (splat)."""
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [v] * t.count)
    return ir.Constant(t, v)


def _like(t: ir.Type, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, t.count) if isinstance(t, ir.VectorType) else elem


def round_i64(b: ir.IRBuilder, s, x):
    """s * 2^x rounded once to f32 (s i64, x i32, or vectors of them): +-inf past the range,
    signed zero below 2^-126, +0 for s = 0."""
    ti = _like(s.type, i32)
    y = b.bitcast(b.sitofp(s, _like(s.type, f32)), ti)
    e = b.and_(b.lshr(y, _const(ti, 23)), _const(ti, 0xFF))
    e2 = b.add(e, x)
    sign = b.and_(y, _const(ti, 0x80000000))
    moved = b.add(y, b.shl(x, _const(ti, 23)))                     # exponent field e + x
    under = b.icmp_signed("<", e2, _const(ti, 1))
    over = b.icmp_signed(">", e2, _const(ti, 254))
    out = b.select(under, sign, b.select(over, b.or_(sign, _const(ti, 0x7F800000)), moved))
    out = b.select(b.icmp_signed("==", e, _const(ti, 0)), y, out)  # s = 0: +0
    return b.bitcast(out, _like(s.type, f32))


def _reduce(b: ir.IRBuilder, kind: str, v):
    n = v.type.count
    elem = v.type.element
    return b.call(intrinsic(b.module, f"llvm.vector.reduce.{kind}.v{n}i{elem.width}", elem, [v.type]), [v])


def round_terms(b: ir.IRBuilder, p, x):
    """sum_k p[k] * 2^x[k] (p, x <n x i64>, n <= 32) exactly, rounded once to f32."""
    vt = p.type
    n = vt.count
    nz = b.icmp_signed("!=", p, _const(vt, 0))
    xm = _reduce(b, "smin", b.select(nz, x, _const(vt, _BIG)))
    xm = b.select(b.icmp_signed("==", xm, i64(_BIG)), i64(0), xm)
    sh = b.select(nz, b.sub(x, _splat(b, xm, n)), _const(vt, 0))
    shc = b.select(b.icmp_unsigned("<", sh, _const(vt, 58)), sh, _const(vt, 58))
    ap = b.select(b.icmp_signed("<", p, _const(vt, 0)), b.sub(_const(vt, 0), p), p)
    fits = b.and_(b.icmp_unsigned("<=", sh, _const(vt, 58)),
                  b.icmp_signed("==", b.lshr(ap, b.sub(_const(vt, 58), shc)), _const(vt, 0)))
    ok = _reduce(b, "and", b.zext(fits, ir.VectorType(ir.IntType(8), n)))
    with b.if_else(b.icmp_unsigned("!=", ok, ir.IntType(8)(0)), likely=True) as (fast, wide):
        with fast:
            s = _reduce(b, "add", b.shl(p, shc))
            r_fast = round_i64(b, s, b.trunc(xm, i32))
            fast_block = b.block
        with wide:
            r_wide = _call_wide(b, p, x)
            wide_block = b.block
    r = b.phi(f32, name="exact")
    r.add_incoming(r_fast, fast_block)
    r.add_incoming(r_wide, wide_block)
    return r


def round_lanes(b: ir.IRBuilder, terms: list):
    """Per lane, sum_k p_k * 2^x_k exactly, rounded once to f32: terms a list of (p, x), each
    <L x i64>, lane l being one sum's term k (p_k = 0 no term). As round_terms lane by lane: in
    i64 when every lane's terms, aligned at its least exponent, have at most 58 bits each (one
    round_i64 of <L x i64>); otherwise each lane through round_terms (a rare branch)."""
    vt = terms[0][0].type
    L = vt.count
    big = _const(vt, _BIG)
    xm = big
    for p, x in terms:
        x_nz = b.select(b.icmp_signed("!=", p, _const(vt, 0)), x, big)
        xm = b.select(b.icmp_signed("<", x_nz, xm), x_nz, xm)
    xm = b.select(b.icmp_signed("==", xm, big), _const(vt, 0), xm)
    fits, total = None, _const(vt, 0)
    for p, x in terms:
        sh = b.select(b.icmp_signed("!=", p, _const(vt, 0)), b.sub(x, xm), _const(vt, 0))
        shc = b.select(b.icmp_unsigned("<", sh, _const(vt, 58)), sh, _const(vt, 58))
        ap = b.select(b.icmp_signed("<", p, _const(vt, 0)), b.sub(_const(vt, 0), p), p)
        ok = b.and_(b.icmp_unsigned("<=", sh, _const(vt, 58)),
                    b.icmp_signed("==", b.lshr(ap, b.sub(_const(vt, 58), shc)), _const(vt, 0)))
        fits = ok if fits is None else b.and_(fits, ok)
        total = b.add(total, b.shl(p, shc))
    all_fit = _reduce(b, "and", b.zext(fits, ir.VectorType(ir.IntType(8), L)))
    ft = ir.VectorType(f32, L)
    with b.if_else(b.icmp_unsigned("!=", all_fit, ir.IntType(8)(0)), likely=True) as (fast, slow):
        with fast:
            r_fast = round_i64(b, total, b.trunc(xm, ir.VectorType(i32, L)))
            fast_block = b.block
        with slow:
            nt = ir.VectorType(i64, len(terms))
            r_slow = ir.Constant(ft, ir.Undefined)
            for lane in range(L):
                ps, xs = ir.Constant(nt, ir.Undefined), ir.Constant(nt, ir.Undefined)
                for k, (p, x) in enumerate(terms):
                    ps = b.insert_element(ps, b.extract_element(p, i32(lane)), i32(k))
                    xs = b.insert_element(xs, b.extract_element(x, i32(lane)), i32(k))
                r_slow = b.insert_element(r_slow, round_terms(b, ps, xs), i32(lane))
            slow_block = b.block
    r = b.phi(ft, name="exact8")
    r.add_incoming(r_fast, fast_block)
    r.add_incoming(r_slow, slow_block)
    return r


def room(pbits: int, n: int) -> int:
    """The largest exponent spread at which n terms below 2^pbits, aligned, sum exactly in an i64."""
    return 62 - pbits - (n - 1).bit_length()


def round_shifted(b: ir.IRBuilder, p, sh, xref, fits, x):
    """sum_k p[k] * 2^x[k] rounded once, where the caller has aligned the terms: when `fits`
    (i1), x[k] = xref + sh[k] for every nonzero p[k] and the sum of p[k] << sh[k] is an exact
    i64; otherwise the i512 path. p <n x i64>; sh, x <n x i32>; xref i32."""
    vt = p.type
    with b.if_else(fits, likely=True) as (fast, wide):
        with fast:
            r_fast = round_i64(b, _reduce(b, "add", b.shl(p, b.zext(sh, vt))), xref)
            fast_block = b.block
        with wide:
            r_wide = _call_wide(b, p, b.sext(x, vt))
            wide_block = b.block
    r = b.phi(f32, name="exact")
    r.add_incoming(r_fast, fast_block)
    r.add_incoming(r_wide, wide_block)
    return r


def _splat(b: ir.IRBuilder, v, n: int):
    t = ir.VectorType(v.type, n)
    u = b.insert_element(ir.Constant(t, ir.Undefined), v, i32(0))
    return b.shuffle_vector(u, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))


def _call_wide(b: ir.IRBuilder, p, x):
    n = p.type.count
    with b.goto_entry_block():
        pp = b.alloca(ir.ArrayType(i64, n), name="wide.p")
        xp = b.alloca(ir.ArrayType(i64, n), name="wide.x")
    b.store(p, b.bitcast(pp, p.type.as_pointer()), align=8)
    b.store(x, b.bitcast(xp, x.type.as_pointer()), align=8)
    fn = define_round_wide(b.module)
    return b.call(fn, [b.bitcast(pp, i64.as_pointer()), b.bitcast(xp, i64.as_pointer()), i64(n)])


def define_round_wide(m: ir.Module) -> ir.Function:
    """float round_wide(i64* p, i64* x, i64 n): sum p[k] * 2^x[k] under SUM_WINDOW in an i512,
    rounded once."""
    if WIDE in m.globals:
        return m.globals[WIDE]
    fn, b = new_function(m, WIDE, ir.FunctionType(f32, [i64.as_pointer(), i64.as_pointer(), i64]))
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    pp, xp, n = fn.args
    # the least exponent of the nonzero terms
    xm_slot = b.alloca(i64, name="xm")
    b.store(i64(_BIG), xm_slot)
    acc_slot = b.alloca(i512, name="acc")
    b.store(i512(0), acc_slot)
    with for_range(b, 0, n, name="k") as k:
        pk, xk = b.load(b.gep(pp, [k])), b.load(b.gep(xp, [k]))
        xm = b.load(xm_slot)
        less = b.and_(b.icmp_signed("!=", pk, i64(0)), b.icmp_signed("<", xk, xm))
        b.store(b.select(less, xk, xm), xm_slot)
    xm = b.load(xm_slot)
    xm = b.select(b.icmp_signed("==", xm, i64(_BIG)), i64(0), xm)
    # the largest term's least place: |p| aligned at xm compared whole, ties to the greater x
    size_slot, low_slot = b.alloca(i512, name="size"), b.alloca(i64, name="low")
    b.store(i512(0), size_slot)
    b.store(xm, low_slot)
    with for_range(b, 0, n, name="w") as k:
        pk, xk = b.load(b.gep(pp, [k])), b.load(b.gep(xp, [k]))
        ap = b.sext(b.select(b.icmp_signed("<", pk, i64(0)), b.sub(i64(0), pk), pk), i512)
        sh = b.select(b.icmp_signed("!=", pk, i64(0)), b.sub(xk, xm), i64(0))
        size = b.shl(ap, b.zext(b.select(b.icmp_unsigned("<", sh, i64(448)), sh, i64(448)), i512))
        best = b.load(size_slot)
        more = b.or_(b.icmp_unsigned(">", size, best),
                     b.and_(b.icmp_unsigned("==", size, best), b.icmp_signed(">", xk, b.load(low_slot))))
        more = b.and_(more, b.icmp_signed("!=", pk, i64(0)))
        b.store(b.select(more, size, best), size_slot)
        b.store(b.select(more, xk, b.load(low_slot)), low_slot)
    edge = b.sub(b.load(low_slot), i64(SUM_WINDOW))
    xm = b.select(b.icmp_signed(">", edge, xm), edge, xm)             # where the sum is aligned
    with for_range(b, 0, n, name="t") as k:
        pk, xk = b.load(b.gep(pp, [k])), b.load(b.gep(xp, [k]))
        nz = b.icmp_signed("!=", pk, i64(0))
        sh = b.select(nz, b.sub(xk, xm), i64(0))
        up = b.select(b.icmp_signed("<", sh, i64(448)), sh, i64(448))   # never past the bound above
        down = b.select(b.icmp_signed(">", sh, i64(-100)), b.sub(i64(0), sh), i64(100))
        wide = b.sext(pk, i512)
        term = b.select(b.icmp_signed(">=", sh, i64(0)), b.shl(wide, b.zext(up, i512)),
                        b.ashr(wide, b.zext(down, i512)))                # past the window: floored
        b.store(b.add(b.load(acc_slot), term), acc_slot)
    acc = b.load(acc_slot)
    neg = b.icmp_signed("<", acc, i512(0))
    mag = b.select(neg, b.sub(i512(0), acc), acc)
    ctlz = intrinsic(m, "llvm.ctlz.i512", i512, [i512, i1])
    bits = b.sub(i512(512), b.call(ctlz, [mag, i1(0)]))
    drop = b.select(b.icmp_unsigned(">", bits, i512(62)), b.sub(bits, i512(62)), i512(0))
    top = b.trunc(b.lshr(mag, drop), i64)
    rest = b.sub(b.shl(i512(1), drop), i512(1))
    sticky = b.zext(b.icmp_unsigned("!=", b.and_(mag, rest), i512(0)), i64)
    top = b.or_(top, sticky)
    s = b.select(neg, b.sub(i64(0), top), top)
    b.ret(round_i64(b, s, b.trunc(b.add(xm, b.trunc(drop, i64)), i32)))
    return fn
