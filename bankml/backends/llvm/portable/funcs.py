"""LLVM IR emitters of the portable profile's f32 steps and functions (bankml/profiles/portable/).

Every emitter takes and returns f32 values of any lane count (float, <4 x float>, <8 x float>)
and repeats the numpy spec one step for one step:

- add/sub/mul: plain fadd/fsub/fmul (no fast-math flag, so LLVM never contracts into an FMA),
  operands and results canonical (`canon`: denormals to zero of their sign, every NaN
  0x7FC00000). Values loaded from memory go through `canon` once; every step's result is
  canonical, so operands made here need no second flush.
- tree8: the lane fold of arith.fold_sum, (l0+l1), (l2+l3), ... then pairs of those.
- exp, recip, rsqrt, sigmoid, silu: funcs.py, their tables (tables.py, decimal, rounded once)
  as LLVM constant arrays, looked up lane by lane. exp, recip and sigmoid take their inner steps
  as plain fadd/fsub/fmul where the spec's canon is provably a no-op (the value is normal or
  zero) or its flush is absorbed by the next add (a value below 2^-126 added to 1/2 or 1): same
  bits (each emitter's docstring gives the argument; the tests sweep a million bit patterns
  over every binade, and every f32 input was compared once with the canon-every-step form).
- scale2: y * 2^k exactly by adding k to the exponent field, +-inf above the range and zero of
  y's sign below 2^-126 (arith.scale2, for finite y).
Exact integer sums rounded once (arith.round_exact) are backends/llvm/portable/exact.py's.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, f64, i32, i64, intrinsic
from bankml.profiles.portable import tables

SIGN, EXPO, QNAN = 0x80000000, 0x7F800000, 0x7FC00000


# ---------------------------------------------------------------- types and constants

def int_type(t: ir.Type, width: int = 32) -> ir.Type:
    """The integer type with t's lane count (i32 for float, <8 x i32> for <8 x float>)."""
    it = ir.IntType(width)
    return ir.VectorType(it, t.count) if isinstance(t, ir.VectorType) else it


def const(t: ir.Type, x) -> ir.Constant:
    """x in every lane of type t; integers are wrapped to t's width (signed)."""
    et = t.element if isinstance(t, ir.VectorType) else t
    if isinstance(et, ir.IntType):
        x = int(x) & ((1 << et.width) - 1)
        x = x - (1 << et.width) if x >> (et.width - 1) else x
    else:
        x = float(x)
    c = ir.Constant(et, x)
    return ir.Constant(t, [c] * t.count) if isinstance(t, ir.VectorType) else c


def fconst(t: ir.Type, x: np.float32) -> ir.Constant:
    """An f32 value (exactly) in every lane."""
    return const(t, float(np.float32(x)))


def splat(b: ir.IRBuilder, x: ir.Value, t: ir.Type) -> ir.Value:
    """A scalar in every lane of vector type t (t itself when it is scalar)."""
    if not isinstance(t, ir.VectorType):
        return x
    v = b.insert_element(ir.Constant(t, ir.Undefined), x, i32(0))
    return b.shuffle_vector(v, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, t.count), [0] * t.count))


def bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.bitcast(x, int_type(x.type))


def _vcall(b: ir.IRBuilder, name: str, x: ir.Value, *more) -> ir.Value:
    t = x.type
    suffix = f"v{t.count}f32" if isinstance(t, ir.VectorType) else "f32"
    return b.call(intrinsic(b.module, f"llvm.{name}.{suffix}", t, [t] * (1 + len(more))), [x, *more])


def fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return _vcall(b, "fabs", x)


def roundeven(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Nearest integer, ties to even (np.rint), f32 or f64 scalars and f32 vectors."""
    if x.type == f64:
        return b.call(intrinsic(b.module, "llvm.roundeven.f64", f64, [f64]), [x])
    return _vcall(b, "roundeven", x)


def table(m: ir.Module, name: str, values: np.ndarray) -> ir.GlobalVariable:
    """A constant f32 (or i64) array in module m, made once per name."""
    if name in m.globals:
        return m.globals[name]
    et = i64 if values.dtype.kind == "i" else f32
    conv = int if et == i64 else float
    arr = ir.ArrayType(et, len(values))
    gv = ir.GlobalVariable(m, arr, name=name)
    gv.global_constant = True
    gv.linkage = "internal"
    gv.initializer = ir.Constant(arr, [ir.Constant(et, conv(v)) for v in values])
    return gv


def lookup(b: ir.IRBuilder, gv: ir.GlobalVariable, idx: ir.Value) -> ir.Value:
    """gv[idx] lane by lane (idx an i32 or a vector of i32)."""
    if not isinstance(idx.type, ir.VectorType):
        return b.load(b.gep(gv, [i32(0), idx]))
    et = gv.type.pointee.element
    out = ir.Constant(ir.VectorType(et, idx.type.count), ir.Undefined)
    for lane in range(idx.type.count):
        k = b.extract_element(idx, i32(lane))
        out = b.insert_element(out, b.load(b.gep(gv, [i32(0), k])), i32(lane))
    return out


# ---------------------------------------------------------------- the f32 steps

def canon(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """arith.canon: a denormal becomes zero of its sign, any NaN the one quiet NaN."""
    it = int_type(x.type)
    u = bits(b, x)
    tiny = b.icmp_unsigned("==", b.and_(u, const(it, EXPO)), const(it, 0))
    u = b.select(tiny, b.and_(u, const(it, SIGN)), u)
    u = b.select(b.fcmp_unordered("uno", x, x), const(it, QNAN), u)
    return b.bitcast(u, x.type)


def add(b: ir.IRBuilder, x, y) -> ir.Value:
    return canon(b, b.fadd(x, y))


def sub(b: ir.IRBuilder, x, y) -> ir.Value:
    return canon(b, b.fsub(x, y))


def mul(b: ir.IRBuilder, x, y) -> ir.Value:
    return canon(b, b.fmul(x, y))


def div(b: ir.IRBuilder, x, y) -> ir.Value:
    """arith.div: fdiv is IEEE division (no reciprocal without fast-math flags)."""
    return canon(b, b.fdiv(x, y))


def is_nan(b: ir.IRBuilder, x) -> ir.Value:
    return b.fcmp_unordered("uno", x, x)


def nan_of(t: ir.Type) -> ir.Value:
    return ir.Constant(t, [ir.Constant(f32, float("nan"))] * t.count) if isinstance(t, ir.VectorType) else \
        ir.Constant(f32, float("nan"))


def with_bits(b: ir.IRBuilder, cond, pattern: int, x: ir.Value) -> ir.Value:
    """x where cond is false, the f32 with bits `pattern` where it is true."""
    it = int_type(x.type)
    return b.bitcast(b.select(cond, const(it, pattern), bits(b, x)), x.type)


def tree(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The balanced fold of a vector's lanes (a power of two): adjacent pairs, then pairs of pairs."""
    while isinstance(v.type, ir.VectorType):
        n = v.type.count
        even = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, n // 2), list(range(0, n, 2))))
        odd = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, n // 2), list(range(1, n, 2))))
        v = add(b, even, odd)
        if n == 2:
            v = b.extract_element(v, i32(0))
    return v


def scale2(b: ir.IRBuilder, y: ir.Value, k: ir.Value) -> ir.Value:
    """arith.scale2 for finite y (normal or zero) and i32 k (same lane count): y * 2^k exactly,
    +-inf above the range, zero of y's sign when the result is below 2^-126."""
    it = int_type(y.type)
    u = bits(b, y)
    e = b.and_(b.lshr(u, const(it, 23)), const(it, 255))
    e2 = b.add(e, k)
    sign = b.and_(u, const(it, SIGN))
    out = b.add(u, b.shl(k, const(it, 23)))
    out = b.select(b.icmp_signed("<", e2, const(it, 1)), sign, out)
    out = b.select(b.icmp_signed(">", e2, const(it, 254)), b.or_(sign, const(it, EXPO)), out)
    out = b.select(b.icmp_signed("==", e, const(it, 0)), u, out)
    return b.bitcast(out, y.type)


# ---------------------------------------------------------------- the functions (funcs.py)

def _fields(b: ir.IRBuilder, x: ir.Value):
    it = int_type(x.type)
    u = bits(b, x)
    return (b.and_(u, const(it, SIGN)), b.and_(b.lshr(u, const(it, 23)), const(it, 255)),
            b.and_(u, const(it, 0x7FFFFF)))


def _mantissa(b: ir.IRBuilder, frac: ir.Value, t: ir.Type) -> ir.Value:
    """1.frac as f32 (exactly (frac | 2^23) * 2^-23)."""
    return b.bitcast(b.or_(frac, const(frac.type, 0x3F800000)), t)


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """funcs.exp of canonical x (a NaN of either sign). Its steps are plain fadd/fsub/fmul: for
    x in [-104, 89] (after the clamp) every canon of the spec's steps is a no-op or its flush
    is absorbed by the next add, so the bits are the spec's (the steps' comments say why)."""
    c = tables.constants()
    t, it = x.type, int_type(x.type)
    nan = is_nan(b, x)
    x = b.select(nan, const(t, 0.0), x)
    x = b.select(b.fcmp_ordered("<", x, fconst(t, -104.0)), fconst(t, -104.0), x)
    x = b.select(b.fcmp_ordered(">", x, fconst(t, 89.0)), fconst(t, 89.0), x)
    # x * 64/ln2: +-0, or |.| >= 92 * 2^-126 (normal) and below 9604
    n = b.fptosi(roundeven(b, b.fmul(x, fconst(t, c["INV_LN2_64"]))), it)
    nf = b.sitofp(n, t)
    # n*C1 is exact (C1's significand has 11 bits, |n| < 2^14). n = 0: r1 = x. Else |x| > 2^-8,
    # so x and n*C1 are multiples of 2^-31 and r1 is 0 or at least 2^-31. n*C2 is 0 or at least
    # C2 (2^-17) and a multiple of 2^-40, so r is x (n = 0), or 0 or at least 2^-40: normal
    r1 = b.fsub(x, b.fmul(nf, fconst(t, c["EXP_C1"])))
    r = b.fsub(r1, b.fmul(nf, fconst(t, c["EXP_C2"])))
    # r/6 and (..)*r may be below 2^-126 (r tiny) where the spec flushes them; the adds of 1/2
    # and of 1 absorb them either way (|.| < 2^-126 against an ulp of 2^-25 or 2^-24). q: for
    # |r| < 2^-24 the factor is exactly 1 and q = r; else |q| > 2^-26
    u = b.fmul(b.fadd(b.fmul(r, fconst(t, c["SIXTH"])), fconst(t, 0.5)), r)
    q = b.fmul(b.fadd(u, fconst(t, 1.0)), r)
    tj = lookup(b, table(b.module, "portable_exp_table", tables.exp_table()), b.and_(n, const(it, 63)))
    # tj in [1, 2): |tj*q| >= |q| (0 or normal), and y in (0.98, 2.01)
    y = b.fadd(tj, b.fmul(tj, q))
    out = scale2(b, y, b.ashr(n, const(it, 6)))
    return with_bits(b, nan, QNAN, out)


def recip(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """funcs.recip of canonical x. The iteration's steps are plain: m in [1, 2), the seed in
    (0.5, 1), so m*y, 2 - m*y and y*(2 - m*y) stay normal (near 1 and in (0.5, 1]) and every
    canon is a no-op; so is the last one (scale2's result with its sign, +-inf, +-0 or QNAN)."""
    t, it = x.type, int_type(x.type)
    s, e, frac = _fields(b, x)
    m = _mantissa(b, frac, t)
    y = lookup(b, table(b.module, "portable_recip_table", tables.recip_table()), b.lshr(frac, const(it, 16)))
    for _ in range(2):
        y = b.fmul(y, b.fsub(fconst(t, 2.0), b.fmul(m, y)))
    out = bits(b, scale2(b, y, b.sub(const(it, 127), e)))
    out = b.xor(out, s)
    out = b.select(b.fcmp_ordered("==", x, const(t, 0.0)), b.or_(s, const(it, EXPO)), out)
    out = b.select(b.fcmp_ordered("==", fabs(b, x), const(t, float("inf"))), s, out)
    out = b.select(is_nan(b, x), const(it, QNAN), out)
    return b.bitcast(out, t)


def rsqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """funcs.rsqrt of canonical x."""
    t, it = x.type, int_type(x.type)
    s, e, frac = _fields(b, x)
    k = b.sub(e, const(it, 127))
    odd = b.and_(k, const(it, 1))
    j = b.ashr(b.sub(k, odd), const(it, 1))
    m = _mantissa(b, frac, t)
    m = b.select(b.icmp_signed("==", odd, const(it, 1)), b.fmul(m, fconst(t, 2.0)), m)     # exact
    idx = b.add(b.mul(odd, const(it, 64)), b.lshr(frac, const(it, 17)))
    y = lookup(b, table(b.module, "portable_rsqrt_table", tables.rsqrt_table()), idx)
    for _ in range(2):
        y = mul(b, y, sub(b, fconst(t, 1.5), mul(b, fconst(t, 0.5), mul(b, mul(b, m, y), y))))
    out = bits(b, scale2(b, y, b.sub(const(it, 0), j)))
    out = b.select(b.fcmp_ordered("==", x, const(t, 0.0)), b.or_(s, const(it, EXPO)), out)
    out = b.select(b.fcmp_ordered("==", x, const(t, float("inf"))), const(it, 0), out)
    out = b.select(b.or_(is_nan(b, x), b.fcmp_ordered("<", x, const(t, 0.0))), const(it, QNAN), out)
    return canon(b, b.bitcast(out, t))


def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """recip(1 + exp(-x)) of canonical x: -x is canonical but for a NaN's sign, which exp
    takes; 1 + exp(-x) is at least 1, +inf or QNAN (canonical)."""
    return recip(b, b.fadd(fconst(x.type, 1.0), exp(b, b.fneg(x))))


def silu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x * sigmoid(x) of canonical x."""
    return mul(b, x, sigmoid(b, x))


def ln(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """funcs.ln of canonical x, every step the spec's canonical one: m = 1.frac (halved from 1.5
    up, k raised), i = rint(64 m), u = (m - i/64) * (64/i), the polynomial p, then
    (k*LN2_HI + LNHI[i]) + ((k*LN2_LO + LNLO[i]) + p); 0 -> -inf, +inf -> +inf, NaN or x < 0 -> NaN."""
    c = tables.constants()
    t, it = x.type, int_type(x.type)
    inv, lhi, llo = (table(b.module, f"portable_ln_{name}", v)
                     for name, v in zip(("inv", "hi", "lo"), tables.ln_tables()))
    _, e, frac = _fields(b, x)
    big = b.icmp_unsigned(">=", frac, const(it, 0x400000))
    k = b.select(big, b.sub(e, const(it, 126)), b.sub(e, const(it, 127)))
    m = _mantissa(b, frac, t)
    m = b.select(big, b.fmul(m, fconst(t, 0.5)), m)                                    # exact
    i = b.fptosi(roundeven(b, b.fmul(m, fconst(t, 64.0))), it)                         # 48..96
    u = mul(b, sub(b, m, b.fmul(b.sitofp(i, t), fconst(t, 1 / 64))), lookup(b, inv, i))
    p = mul(b, add(b, mul(b, add(b, mul(b, add(b, mul(b, u, fconst(t, -0.25)), fconst(t, c["THIRD"])), u),
                                     fconst(t, -0.5)), u), fconst(t, 1.0)), u)
    kf = b.sitofp(k, t)
    hi = add(b, mul(b, kf, fconst(t, c["LN2_HI"])), lookup(b, lhi, i))
    lo = add(b, mul(b, kf, fconst(t, c["LN2_LO"])), lookup(b, llo, i))
    out = bits(b, add(b, hi, add(b, lo, p)))
    out = b.select(b.fcmp_ordered("==", x, const(t, 0.0)), const(it, SIGN | EXPO), out)
    out = b.select(b.fcmp_ordered("==", x, const(t, float("inf"))), const(it, EXPO), out)
    out = b.select(b.fcmp_unordered("ult", x, const(t, 0.0)), const(it, QNAN), out)      # NaN or x < 0
    return b.bitcast(out, t)


def ln1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """funcs.ln1p of canonical x >= 0: ln(u) + (x - (u - 1)) * recip(u), u = 1 + x; +inf -> +inf."""
    t = x.type
    u = add(b, fconst(t, 1.0), x)
    err = sub(b, x, sub(b, u, fconst(t, 1.0)))
    out = add(b, ln(b, u), mul(b, err, recip(b, u)))
    return b.select(b.fcmp_ordered("==", x, const(t, float("inf"))), const(t, float("inf")), out)


def softplus(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """funcs.softplus of canonical x: x + exp(-x) past 16, else ln1p(exp(x))."""
    t = x.type
    big = b.fcmp_ordered(">", x, fconst(t, 16.0))
    small = ln1p(b, exp(b, b.select(big, const(t, 0.0), x)))
    return b.select(big, add(b, x, exp(b, b.fneg(x))), small)
