"""The portable profile's arithmetic as SPIR-V pieces (docs/PORTABLE.md, docs/spirv.md).

`Emit` wraps a builder.Function and writes, inline, the profile's steps:

- f32 steps `fadd/fsub/fmul`: one OpFAdd/OpFSub/OpFMul (NoContraction, so never fused), then
  the profile's flush and NaN by integer bit tests, never the device's denorm mode:
  * add/sub: an exact sum of two normal-or-zero f32 values below 2^-125 is exact on the 2^-149
    grid, so when the device's result has a zero exponent field (a denormal, or a zero the
    device may have flushed with any sign) the result is the zero of the exact sum's sign,
    read from the operands' bits (equal magnitudes: -0 only for -0 + -0);
  * mul: when the device's result is below 2^-125 (whatever it flushed), the product is
    recomputed from the 24-bit significands in 64-bit integers and rounded to the 2^-149
    grid (gradual underflow, nearest even): 2^-126 or more is kept (its bits are that
    integer), less is the signed zero;
  * every NaN becomes 0x7FC00000.
- `exp`, `recip`, `rsqrt`, `ln`, and from them `ln1p`, `sigmoid`, `silu`, `softplus`: funcs.py's
  steps; the tables are a storage buffer (tables.py's values, uploaded by the host); scale2
  and the reduction of ln's argument are integer exponent arithmetic.
- `round_terms`: the exact value of Σ P_t·2^X_t (int64 P, int32 X, at most 16 terms) rounded
  once to f32 (arith.round_exact): an int64 sum when every aligned term has at most 59 bits
  (a spread inside SUM_WINDOW), else the window (`window_edge`: a term past SUM_WINDOW places
  below the largest term's least place floored there) and a 384-bit two's-complement
  accumulator of 12 u32 words (enough for every term a portable kernel makes: exponents within
  300 of each other, |P| < 2^59; see docs/spirv.md).
  Both end in `round_u64`, the correctly rounded u64 -> f32 conversion (leading bit, 24
  bits, nearest even with a sticky bit, exponent, overflow to inf, flush below 2^-126).

Integers are u32/u64 SPIR-V types; signed ops (SLessThan, ShiftRightArithmetic) read them as
two's complement. 32 -> 64-bit sign extension is two shifts: on lavapipe (Mesa, LLVM 15)
OpSLessThan(OpBitcast(OpSConvert(x)), 0) came out false for negative x.
"""
from __future__ import annotations

import struct

from bankml.backends.spirv import builder as B
from bankml.profiles.portable.arith import SUM_WINDOW

SIGN, EXP, QNAN, MAG = 0x80000000, 0x7F800000, 0x7FC00000, 0x7FFFFFFF
WIDE_WORDS = 12                 # the wide accumulator: 384 bits
MAX_TERMS = 16                  # terms of one round_terms (8 sub-blocks x 2 for Q4_1)
FAST_BITS = 59                  # an aligned term of at most 59 bits: 16 of them fit an int64
# the tables buffer: f32 words at these offsets (tables.py's values; ln's three of 97 entries)
EXP_T, RECIP_T, RSQRT_T, LN_INV_T, LN_HI_T, LN_LO_T = 0, 64, 192, 320, 417, 514


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


class Emit:
    """Emitter of the portable steps into one function (`f`) of one module (`m`)."""

    def __init__(self, m: B.Module, f: B.Function, tables: int | None = None, flushing: bool = False):
        """flushing: act as the worst device the fixes allow for (tests): every denormal result
        of an add or mul becomes +0 and a product of exactly +-2^-126 becomes +0 too."""
        self.m, self.f, self.tables, self.flushing = m, f, tables, flushing
        self.u64 = m.type("TypeInt", 64, 0)
        self._c64: dict[int, int] = {}
        self._n = 0

    # ---- constants and small integer helpers
    def c(self, v: int) -> int:
        return self.m.const(self.m.u32, v)

    def fc(self, v: float) -> int:
        return self.m.const(self.m.f32, v)

    def c64(self, v: int) -> int:
        v &= (1 << 64) - 1
        if v not in self._c64:
            i = self._c64[v] = self.m.id()
            self.m.globals.append(B.inst("Constant", self.u64, i, v & 0xFFFFFFFF, v >> 32))
        return self._c64[v]

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}{self._n}"

    def u(self, op, *a, name=None):
        return self.f.u(op, *a, name=name)

    def w(self, op, *a, name=None):
        """A 64-bit integer op."""
        return self.f.op(op, self.u64, *a, name=name)

    def b(self, op, *a):
        return self.f.op(op, self.m.bool, *a)

    def sel(self, cond, a, b, t=None):
        return self.f.select(self.m.u32 if t is None else t, cond, a, b)

    def sel64(self, cond, a, b):
        return self.f.select(self.u64, cond, a, b)

    def bits(self, x):
        return self.f.bitcast(self.m.u32, x)

    def mag(self, x):
        """x's magnitude bits (its f32 bits, the sign cleared), u32."""
        return self.u("BitwiseAnd", self.bits(x), self.c(MAG))

    def flt(self, b, name=None):
        return self.f.bitcast(self.m.f32, b, name=name)

    def sext64(self, x32):
        return self.w("ShiftRightArithmetic", self.w("ShiftLeftLogical", self.zext64(x32), self.c64(32)), self.c64(32))

    def zext64(self, x32):
        return self.f.op("UConvert", self.u64, x32)

    def lo32(self, x64):
        return self.f.op("UConvert", self.m.u32, x64)

    def var(self, t, name, init=None):
        return self.f.local(t, self.name(name), init)

    def get(self, t, v):
        return self.f.load(t, v)

    def smin(self, a, b):
        return self.sel(self.b("SLessThan", a, b), a, b)

    # ---- the profile's f32 steps
    def canon_bits(self, r):
        """Bits of an f32 result as the profile holds it: denormal -> signed zero, NaN -> QNAN."""
        tiny = self.b("IEqual", self.u("BitwiseAnd", r, self.c(EXP)), self.c(0))
        r = self.sel(tiny, self.u("BitwiseAnd", r, self.c(SIGN)), r)
        nan = self.b("UGreaterThan", self.u("BitwiseAnd", r, self.c(MAG)), self.c(EXP))
        return self.sel(nan, self.c(QNAN), r)

    def canon(self, x):
        """An f32 value read from a buffer: denormals to signed zero, the one NaN."""
        return self.flt(self.canon_bits(self.bits(x)))

    def _device(self, r, mul: bool):
        """The device's result r, or (flushing) the worst a device without DenormPreserve may give."""
        if not self.flushing:
            return r
        rb = self.bits(r)
        mag = self.u("BitwiseAnd", rb, self.c(MAG))
        flush = self.b("ULessThan", mag, self.c(0x00800001 if mul else 0x00800000))
        return self.flt(self.sel(flush, self.c(0), rb))

    def _add_fix(self, r, a, b):
        """r = device's a + b (b's sign already as added); a zero exponent field means the exact
        sum is zero or denormal: the zero of its sign."""
        r = self._device(r, False)
        ab, bb = self.bits(a), self.bits(b)
        ma, mb = self.u("BitwiseAnd", ab, self.c(MAG)), self.u("BitwiseAnd", bb, self.c(MAG))
        sa, sb = self.u("BitwiseAnd", ab, self.c(SIGN)), self.u("BitwiseAnd", bb, self.c(SIGN))
        z = self.sel(self.b("IEqual", ma, mb), self.u("BitwiseAnd", sa, sb),
                     self.sel(self.b("UGreaterThan", ma, mb), sa, sb))
        rb = self.bits(r)
        tiny = self.b("IEqual", self.u("BitwiseAnd", rb, self.c(EXP)), self.c(0))
        return self.flt(self.canon_bits(self.sel(tiny, z, rb)))

    def fadd(self, a, b, name=None):
        return self._add_fix(self.f.fadd(a, b, name=name), a, b)

    def fsub(self, a, b, name=None):
        nb = self.flt(self.u("BitwiseXor", self.bits(b), self.c(SIGN)))
        return self._add_fix(self.f.fsub(a, b, name=name), a, nb)

    def fmul(self, a, b, name=None):
        r = self._device(self.f.fmul(a, b, name=name), True)
        rb, ab, bb = self.bits(r), self.bits(a), self.bits(b)
        tiny = self.b("ULessThanEqual", self.u("BitwiseAnd", rb, self.c(EXP)), self.c(0x00800000))
        ea = self.u("BitFieldUExtract", ab, self.c(23), self.c(8))
        eb = self.u("BitFieldUExtract", bb, self.c(23), self.c(8))

        def sig(x, e):
            s = self.u("BitwiseOr", self.u("BitwiseAnd", x, self.c(0x7FFFFF)), self.c(0x800000))
            return self.zext64(self.sel(self.b("IEqual", e, self.c(0)), self.c(0), s))
        prod = self.w("IMul", sig(ab, ea), sig(bb, eb))
        # n = RN(prod * 2^(ea+eb-151)): the exact product on the 2^-149 grid; when tiny, the
        # shift 151 - ea - eb is above 22 (at 49 or more n is 0)
        sh = self.u("ISub", self.c(151), self.u("IAdd", ea, eb))
        sh = self.sel(self.b("SGreaterThan", sh, self.c(60)), self.c(60), sh)
        sh = self.sel(self.b("SLessThan", sh, self.c(1)), self.c(1), sh)
        n = self.lo32(self.rne_shift64(prod, sh))
        sign = self.u("BitwiseAnd", self.u("BitwiseXor", ab, bb), self.c(SIGN))
        small = self.u("BitwiseOr", sign, self.sel(self.b("UGreaterThanEqual", n, self.c(0x800000)), n, self.c(0)))
        return self.flt(self.canon_bits(self.sel(tiny, small, rb)))

    def rne_shift64(self, x, sh):
        """x (u64) >> sh (u32, 1..63) rounded to nearest, ties to even."""
        sh64 = self.zext64(sh)
        q = self.w("ShiftRightLogical", x, sh64)
        one = self.c64(1)
        half = self.w("ShiftLeftLogical", one, self.w("ISub", sh64, one))
        rem = self.w("BitwiseAnd", x, self.w("ISub", self.w("ShiftLeftLogical", one, sh64), one))
        odd = self.b("INotEqual", self.w("BitwiseAnd", q, one), self.c64(0))
        up = self.b("LogicalOr", self.b("UGreaterThan", rem, half),
                    self.b("LogicalAnd", self.b("IEqual", rem, half), odd))
        return self.w("IAdd", q, self.sel64(up, one, self.c64(0)))

    def rint_small(self, x):
        """rint(x) (ties to even) of an f32 with |x| < 2^22, as (f32, i32 bits): (x + 1.5*2^23) - 1.5*2^23."""
        big = self.fc(12582912.0)
        r = self.f.fsub(self.f.fadd(x, big), big)
        return r, self.f.op("ConvertFToS", self.m.u32, r)

    def scale2(self, y, k):
        """y * 2^k exactly (y finite, normal or zero; k an i32): inf on overflow, signed zero
        below 2^-126 (arith.scale2)."""
        yb = self.bits(y)
        e = self.u("BitFieldUExtract", yb, self.c(23), self.c(8))
        e2 = self.u("IAdd", e, k)
        sign = self.u("BitwiseAnd", yb, self.c(SIGN))
        out = self.u("BitwiseOr", self.u("BitwiseAnd", yb, self.c(0x807FFFFF)),
                     self.u("ShiftLeftLogical", e2, self.c(23)))
        out = self.sel(self.b("SLessThan", e2, self.c(1)), sign, out)
        out = self.sel(self.b("SGreaterThan", e2, self.c(254)), self.u("BitwiseOr", sign, self.c(EXP)), out)
        out = self.sel(self.b("IEqual", e, self.c(0)), yb, out)
        return self.flt(out)

    def table(self, base, idx):
        p = self.f.chain(B.SC_STORAGE_BUFFER, self.m.f32, self.tables, self.c(0), self.u("IAdd", idx, self.c(base)))
        return self.f.load(self.m.f32, p)

    # ---- funcs.py
    def exp(self, x):
        """funcs.exp."""
        xb = self.bits(x)
        nan = self.b("UGreaterThan", self.u("BitwiseAnd", xb, self.c(MAG)), self.c(EXP))
        x = self.f.select(self.m.f32, nan, self.fc(0.0), x)
        x = self.f.select(self.m.f32, self.b("FOrdLessThan", x, self.fc(-104.0)), self.fc(-104.0), x)
        x = self.f.select(self.m.f32, self.b("FOrdGreaterThan", x, self.fc(89.0)), self.fc(89.0), x)
        from bankml.profiles.portable.tables import constants
        c = {k: self.fc(float(v)) for k, v in constants().items()
             if k in ("INV_LN2_64", "EXP_C1", "EXP_C2", "SIXTH")}
        nf, n = self.rint_small(self.fmul(x, c["INV_LN2_64"]))
        r = self.fsub(self.fsub(x, self.fmul(nf, c["EXP_C1"])), self.fmul(nf, c["EXP_C2"]))
        q = self.fmul(self.fadd(self.fmul(self.fadd(self.fmul(r, c["SIXTH"]), self.fc(0.5)), r), self.fc(1.0)), r)
        t = self.table(EXP_T, self.u("BitwiseAnd", n, self.c(63)))
        y = self.fadd(t, self.fmul(t, q))
        out = self.scale2(y, self.u("ShiftRightArithmetic", n, self.c(6)))
        return self.f.select(self.m.f32, nan, self.flt(self.c(QNAN)), out)

    def _mant(self, xb):
        """1.frac as f32 (exact), the fraction bits of xb."""
        return self.flt(self.u("BitwiseOr", self.u("BitwiseAnd", xb, self.c(0x7FFFFF)), self.c(0x3F800000)))

    def recip(self, x):
        """funcs.recip."""
        xb = self.bits(x)
        e = self.u("BitFieldUExtract", xb, self.c(23), self.c(8))
        k = self.u("ISub", e, self.c(127))
        m = self._mant(xb)
        y = self.table(RECIP_T, self.u("BitFieldUExtract", xb, self.c(16), self.c(7)))
        for _ in range(2):
            y = self.fmul(y, self.fsub(self.fc(2.0), self.fmul(m, y)))
        out = self.bits(self.scale2(y, self.u("ISub", self.c(0), k)))
        sign = self.u("BitwiseAnd", xb, self.c(SIGN))
        out = self.u("BitwiseOr", out, sign)
        mag = self.u("BitwiseAnd", xb, self.c(MAG))
        out = self.sel(self.b("IEqual", mag, self.c(0)), self.u("BitwiseOr", sign, self.c(EXP)), out)
        out = self.sel(self.b("IEqual", mag, self.c(EXP)), sign, out)
        out = self.sel(self.b("UGreaterThan", mag, self.c(EXP)), self.c(QNAN), out)
        return self.flt(out)

    def rsqrt(self, x):
        """funcs.rsqrt."""
        xb = self.bits(x)
        e = self.u("BitFieldUExtract", xb, self.c(23), self.c(8))
        k = self.u("ISub", e, self.c(127))
        odd = self.u("BitwiseAnd", k, self.c(1))
        j = self.u("ShiftRightArithmetic", self.u("ISub", k, odd), self.c(1))
        m = self.flt(self.u("IAdd", self.bits(self._mant(xb)), self.u("ShiftLeftLogical", odd, self.c(23))))
        y = self.table(RSQRT_T, self.u("IAdd", self.u("ShiftLeftLogical", odd, self.c(6)),
                                       self.u("BitFieldUExtract", xb, self.c(17), self.c(6))))
        for _ in range(2):
            y = self.fmul(y, self.fsub(self.fc(1.5), self.fmul(self.fc(0.5), self.fmul(self.fmul(m, y), y))))
        out = self.bits(self.scale2(y, self.u("ISub", self.c(0), j)))
        sign = self.u("BitwiseAnd", xb, self.c(SIGN))
        mag = self.u("BitwiseAnd", xb, self.c(MAG))
        out = self.sel(self.b("IEqual", mag, self.c(0)), self.u("BitwiseOr", sign, self.c(EXP)), out)
        out = self.sel(self.b("IEqual", xb, self.c(EXP)), self.c(0), out)
        bad = self.b("LogicalOr", self.b("UGreaterThan", mag, self.c(EXP)),
                     self.b("LogicalAnd", self.b("INotEqual", sign, self.c(0)), self.b("INotEqual", mag, self.c(0))))
        return self.flt(self.sel(bad, self.c(QNAN), out))

    def ln(self, x):
        """funcs.ln: x = m·2^k with m in [3/4, 3/2) by its bits (1.frac, halved at 1.5 or more:
        exponent field 126), i = rint(64 m), then the table point's ln plus the quartic in u."""
        from bankml.profiles.portable.tables import constants
        c = {k: self.fc(float(v)) for k, v in constants().items() if k in ("THIRD", "LN2_HI", "LN2_LO")}
        xb = self.bits(x)
        e = self.u("BitFieldUExtract", xb, self.c(23), self.c(8))
        frac = self.u("BitwiseAnd", xb, self.c(0x7FFFFF))
        big = self.b("UGreaterThanEqual", frac, self.c(0x400000))
        k = self.u("ISub", e, self.sel(big, self.c(126), self.c(127)))
        m = self.flt(self.u("BitwiseOr", frac, self.sel(big, self.c(0x3F000000), self.c(0x3F800000))))
        cf, i = self.rint_small(self.fmul(m, self.fc(64.0)))          # 48..96: no clamp needed
        u = self.fmul(self.fsub(m, self.fmul(cf, self.fc(1 / 64))), self.table(LN_INV_T, i))
        p = self.fmul(self.fadd(self.fmul(self.fadd(self.fmul(self.fadd(self.fmul(u, self.fc(-0.25)), c["THIRD"]), u),
                                                    self.fc(-0.5)), u), self.fc(1.0)), u)
        kf = self.f.op("ConvertSToF", self.m.f32, k)                  # |k| <= 128: exact
        hi = self.fadd(self.fmul(kf, c["LN2_HI"]), self.table(LN_HI_T, i))
        lo = self.fadd(self.fmul(kf, c["LN2_LO"]), self.table(LN_LO_T, i))
        out = self.bits(self.fadd(hi, self.fadd(lo, p)))
        zero = self.b("IEqual", e, self.c(0))                          # +-0 (a denormal read as one)
        out = self.sel(zero, self.c(0xFF800000), out)
        out = self.sel(self.b("IEqual", xb, self.c(EXP)), self.c(EXP), out)
        neg = self.b("LogicalAnd", self.b("INotEqual", self.u("BitwiseAnd", xb, self.c(SIGN)), self.c(0)),
                     self.f.op("LogicalNot", self.m.bool, zero))
        bad = self.b("LogicalOr", self.b("UGreaterThan", self.u("BitwiseAnd", xb, self.c(MAG)), self.c(EXP)), neg)
        return self.flt(self.sel(bad, self.c(QNAN), out))

    def ln1p(self, t):
        """funcs.ln1p: ln u of u = 1 + t, plus (t - (u - 1))·recip(u); +inf -> +inf."""
        one = self.fc(1.0)
        u = self.fadd(one, t)
        err = self.fsub(t, self.fsub(u, one))
        out = self.bits(self.fadd(self.ln(u), self.fmul(err, self.recip(u))))
        return self.flt(self.sel(self.b("IEqual", self.bits(t), self.c(EXP)), self.c(EXP), out))

    def neg(self, x):
        """-x: the sign bit flipped (exact, as numpy's negation)."""
        return self.flt(self.u("BitwiseXor", self.bits(x), self.c(SIGN)))

    def sigmoid(self, x):
        """funcs.sigmoid: recip(1 + exp(-x))."""
        return self.recip(self.fadd(self.fc(1.0), self.exp(self.neg(x))))

    def silu(self, x):
        """funcs.silu: x · sigmoid(x)."""
        return self.fmul(x, self.sigmoid(x))

    def softplus(self, u):
        """funcs.softplus: u + exp(-u) when u > 16, else ln1p(exp(u)) (both made, one selected)."""
        f32 = self.m.f32
        big = self.b("FOrdGreaterThan", u, self.fc(16.0))
        hi = self.fadd(u, self.exp(self.neg(u)))
        lo = self.ln1p(self.exp(self.f.select(f32, big, self.fc(0.0), u)))
        return self.f.select(f32, big, hi, lo)

    # ---- exact sums
    def bitlen64(self, x):
        """The bit length of a u64 (0 for 0), by halving."""
        n = self.c(0)
        for s in (32, 16, 8, 4, 2, 1):
            t = self.w("ShiftRightLogical", x, self.c64(s))
            nz = self.b("INotEqual", t, self.c64(0))
            x = self.sel64(nz, t, x)
            n = self.u("IAdd", n, self.sel(nz, self.c(s), self.c(0)))
        return self.u("IAdd", n, self.sel(self.b("INotEqual", x, self.c64(0)), self.c(1), self.c(0)))

    def round_u64(self, w, k, sticky, sign):
        """Bits of the f32 nearest (ties to even) to (w + sticky·ε)·2^k for a u64 w != 0 (sticky:
        nonzero bits below w, only when w has more than 25 bits), signed by `sign` (0 or
        0x80000000): inf past the f32 range, signed zero below 2^-126."""
        L = self.bitlen64(w)
        big = self.b("UGreaterThan", L, self.c(24))
        drop = self.sel(big, self.u("ISub", L, self.c(24)), self.c(1))
        sh64 = self.zext64(drop)
        one = self.c64(1)
        q = self.w("ShiftRightLogical", w, sh64)
        half = self.w("ShiftLeftLogical", one, self.w("ISub", sh64, one))
        rem = self.w("BitwiseAnd", w, self.w("ISub", self.w("ShiftLeftLogical", one, sh64), one))
        odd = self.b("INotEqual", self.w("BitwiseAnd", q, one), self.c64(0))
        up = self.b("LogicalOr", self.b("UGreaterThan", rem, half),
                    self.b("LogicalAnd", self.b("IEqual", rem, half), self.b("LogicalOr", odd, sticky)))
        qr = self.lo32(self.w("IAdd", q, self.sel64(up, one, self.c64(0))))
        carry = self.b("IEqual", qr, self.c(1 << 24))
        qr = self.sel(carry, self.c(1 << 23), qr)
        e_big = self.u("IAdd", self.u("IAdd", k, drop), self.sel(carry, self.c(1), self.c(0)))
        lift = self.u("ISub", self.c(24), self.sel(big, self.c(24), L))       # small w: shift left
        q_small = self.u("ShiftLeftLogical", self.lo32(w), lift)
        e_small = self.u("ISub", k, lift)
        qf = self.sel(big, qr, q_small)
        biased = self.u("IAdd", self.sel(big, e_big, e_small), self.c(150))
        out = self.u("BitwiseOr", self.u("ShiftLeftLogical", biased, self.c(23)),
                     self.u("BitwiseAnd", qf, self.c(0x7FFFFF)))
        out = self.sel(self.b("SLessThan", biased, self.c(1)), self.c(0), out)
        out = self.sel(self.b("SGreaterThan", biased, self.c(254)), self.c(EXP), out)
        return self.u("BitwiseOr", out, sign)

    def div_n(self, x, n):
        """arith.div(x, n) for an i32 n >= 1, by integers (OpFDiv is not exact on Vulkan): x's
        24-bit significand times 2^32 over n, the remainder as the sticky bit, rounded once. A
        quotient under 2^-126 is flushed, but for one in [2^-126 - 2^-150, 2^-126): IEEE rounds
        it at 2^-149, up to 2^-126 (round_u64 rounds at 24 bits first and would flush it)."""
        xb = self.bits(x)
        sign, mag = self.u("BitwiseAnd", xb, self.c(SIGN)), self.u("BitwiseAnd", xb, self.c(MAG))
        e = self.u("BitFieldUExtract", xb, self.c(23), self.c(8))
        sig = self.zext64(self.u("BitwiseOr", self.u("BitwiseAnd", xb, self.c(0x7FFFFF)), self.c(0x800000)))
        num, n64 = self.w("ShiftLeftLogical", sig, self.c64(32)), self.zext64(n)
        q = self.w("UDiv", num, n64)
        rem = self.w("ISub", num, self.w("IMul", q, n64))
        out = self.round_u64(q, self.u("ISub", e, self.c(182)), self.b("INotEqual", rem, self.c64(0)), sign)
        shift = self.u("ISub", self.c(32), e)                        # q >= (2^24 - 1)·2^shift: up to 2^-126
        low = self.b("LogicalAnd", self.b("IEqual", self.u("BitwiseAnd", out, self.c(MAG)), self.c(0)),
                     self.b("ULessThan", shift, self.c(32)))                # 0 <= shift < 32
        edge = self.w("ShiftLeftLogical", self.c64((1 << 24) - 1), self.zext64(self.u("BitwiseAnd", shift, self.c(31))))
        up = self.b("LogicalAnd", low, self.b("UGreaterThanEqual", q, edge))
        out = self.sel(up, self.u("BitwiseOr", sign, self.c(0x800000)), out)
        out = self.sel(self.b("IEqual", e, self.c(0)), sign, out)
        out = self.sel(self.b("IEqual", mag, self.c(EXP)), self.u("BitwiseOr", sign, self.c(EXP)), out)
        return self.flt(self.sel(self.b("UGreaterThan", mag, self.c(EXP)), self.c(QNAN), out))

    def int_to_f32(self, s64, k):
        """An i64 (in a u64) times 2^k rounded once (arith.int_to_f32); 0 gives +0."""
        neg = self.b("SLessThan", s64, self.c64(0))
        mag = self.sel64(neg, self.w("ISub", self.c64(0), s64), s64)
        r = self.round_u64(mag, k, self._false(), self.sel(neg, self.c(SIGN), self.c(0)))
        return self.sel(self.b("IEqual", s64, self.c64(0)), self.c(0), r)

    def _false(self):
        return self.b("INotEqual", self.c(0), self.c(0))

    def terms(self):
        """Function arrays for up to MAX_TERMS terms: (P u64[16], X u32[16])."""
        m = self.m
        pa = m.type("TypeArray", self.u64, self.c(MAX_TERMS))
        xa = m.type("TypeArray", m.u32, self.c(MAX_TERMS))
        return self.var(pa, "P"), self.var(xa, "X")

    def put_term(self, P, X, t, p64, x32):
        self.f.store(self.f.chain(B.SC_FUNCTION, self.u64, P, t), p64)
        self.f.store(self.f.chain(B.SC_FUNCTION, self.m.u32, X, t), x32)

    def round_terms(self, P, X, n):
        """Bits of Σ_{t<n} P[t]·2^X[t] (exact) rounded once to f32 (arith.round_exact); +0 if 0."""
        f, m = self.f, self.m
        u32, u64 = m.u32, self.u64
        xmin = self.var(u32, "xmin", self.c(0x7FFFFFFF))
        nz_any = self.var(u32, "nz", self.c(0))

        def term(t):
            return (f.load(u64, f.chain(B.SC_FUNCTION, u64, P, t)), f.load(u32, f.chain(B.SC_FUNCTION, u32, X, t)))
        with f.loop(n, self.name("xmin")) as t:
            p, x = term(t)
            nz = self.b("INotEqual", p, self.c64(0))
            f.store(xmin, self.sel(nz, self.smin(f.load(u32, xmin), x), f.load(u32, xmin)))
            f.store(nz_any, self.sel(nz, self.c(1), f.load(u32, nz_any)))
        xm = f.load(u32, xmin)
        fits = self.var(u32, "fits", self.c(1))
        with f.loop(n, self.name("fit")) as t:
            p, x = term(t)
            neg = self.b("SLessThan", p, self.c64(0))
            mag = self.sel64(neg, self.w("ISub", self.c64(0), p), p)
            width = self.u("IAdd", self.bitlen64(mag), self.u("ISub", x, xm))
            bad = self.b("LogicalAnd", self.b("INotEqual", p, self.c64(0)),
                         self.b("SGreaterThan", width, self.c(FAST_BITS)))
            f.store(fits, self.sel(bad, self.c(0), f.load(u32, fits)))
        out = self.var(u32, "sum", self.c(0))
        fast = self.b("IEqual", f.load(u32, fits), self.c(1))
        with f.if_then(fast, self.name("fast")):
            s = self.var(u64, "s", self.c64(0))
            with f.loop(n, self.name("add")) as t:
                p, x = term(t)
                sh = self.sel(self.b("INotEqual", p, self.c64(0)), self.u("ISub", x, xm), self.c(0))
                f.store(s, self.w("IAdd", f.load(u64, s), self.w("ShiftLeftLogical", p, self.zext64(sh))))
            f.store(out, self.int_to_f32(f.load(u64, s), xm))
        with f.if_then(f.op("LogicalNot", m.bool, fast), self.name("wide")):
            f.store(out, self.wide_sum(P, X, n, xm))
        zero = self.b("IEqual", f.load(u32, nz_any), self.c(0))
        return self.sel(zero, self.c(0), f.load(u32, out))

    def window_edge(self, P, X, n):
        """arith.windowed's edge: the largest term's least place (|P|·2^X compared exactly, of
        equal terms the greatest X) minus SUM_WINDOW. Terms of equal top place (bit length + X)
        are compared with the one of greater X shifted up by the difference (below 63 places)."""
        f, m = self.f, self.m
        u32, u64 = m.u32, self.u64
        bmag, bx = self.var(u64, "bmag", self.c64(0)), self.var(u32, "bx", self.c(0))
        btop = self.var(u32, "btop", self.c(0x80000000))                 # below every top place
        with f.loop(n, self.name("largest")) as t:
            p = f.load(u64, f.chain(B.SC_FUNCTION, u64, P, t))
            x = f.load(u32, f.chain(B.SC_FUNCTION, u32, X, t))
            mag = self.sel64(self.b("SLessThan", p, self.c64(0)), self.w("ISub", self.c64(0), p), p)
            top = self.u("IAdd", self.bitlen64(mag), x)
            ob, ox = f.load(u64, bmag), f.load(u32, bx)
            up = self.b("SGreaterThan", x, ox)                       # this term's x above the best's
            d = self.zext64(self.sel(up, self.u("ISub", x, ox), self.u("ISub", ox, x)))
            a = self.sel64(up, self.w("ShiftLeftLogical", mag, d), mag)
            c = self.sel64(up, ob, self.w("ShiftLeftLogical", ob, d))
            same = self.b("IEqual", top, f.load(u32, btop))
            more = self.b("LogicalOr", self.b("SGreaterThan", top, f.load(u32, btop)),
                          self.b("LogicalAnd", same, self.b("LogicalOr", self.b("UGreaterThan", a, c),
                                                            self.b("LogicalAnd", self.b("IEqual", a, c), up))))
            more = self.b("LogicalAnd", more, self.b("INotEqual", p, self.c64(0)))
            f.store(bmag, self.sel64(more, mag, ob))
            f.store(bx, self.sel(more, x, ox))
            f.store(btop, self.sel(more, top, f.load(u32, btop)))
        return self.u("ISub", f.load(u32, bx), self.c(SUM_WINDOW))

    def wide_sum(self, P, X, n, xm):
        """The wide path: the terms aligned at max(window_edge, xm), one past the window floored
        there (an arithmetic shift); 12 u32 words, two's complement; each term added word by word
        with carries (sign-extended to the top), then |sum|'s top 64 bits and a sticky bit."""
        f, m = self.f, self.m
        u32, u64 = m.u32, self.u64
        edge = self.window_edge(P, X, n)
        xm = self.sel(self.b("SGreaterThan", edge, xm), edge, xm)
        arr = m.type("TypeArray", u32, self.c(WIDE_WORDS))
        acc = self.var(arr, "acc")
        with f.loop(self.c(WIDE_WORDS), self.name("zero")) as i:
            f.store(f.chain(B.SC_FUNCTION, u32, acc, i), self.c(0))
        with f.loop(n, self.name("wadd")) as t:
            p = f.load(u64, f.chain(B.SC_FUNCTION, u64, P, t))
            x = f.load(u32, f.chain(B.SC_FUNCTION, u32, X, t))
            past = self.b("SLessThan", x, xm)
            down = self.u("ISub", xm, x)
            down = self.zext64(self.sel(self.b("UGreaterThan", down, self.c(63)), self.c(63), down))
            p = self.sel64(past, self.w("ShiftRightArithmetic", p, down), p)     # floored at the edge
            x = self.sel(past, xm, x)
            with f.if_then(self.b("INotEqual", p, self.c64(0)), self.name("wterm")):
                sh = self.u("ISub", x, xm)
                wo, bo = self.u("ShiftRightLogical", sh, self.c(5)), self.u("BitwiseAnd", sh, self.c(31))
                ext = self.sel(self.b("SLessThan", p, self.c64(0)), self.c(0xFFFFFFFF), self.c(0))
                p0, p1 = self.lo32(p), self.lo32(self.w("ShiftRightLogical", p, self.c64(32)))
                carry = self.var(u64, "carry", self.c64(0))
                with f.loop(self.c(WIDE_WORDS), self.name("word")) as i:
                    kk = self.u("ISub", i, wo)                    # word of the unshifted term (signed)

                    def pw(j):                                    # word j of P sign-extended (0 below)
                        v = self.sel(self.b("IEqual", j, self.c(0)), p0,
                                     self.sel(self.b("IEqual", j, self.c(1)), p1, ext))
                        return self.sel(self.b("SLessThan", j, self.c(0)), self.c(0), v)
                    pair = self.w("BitwiseOr", self.w("ShiftLeftLogical", self.zext64(pw(kk)), self.c64(32)),
                                  self.zext64(pw(self.u("ISub", kk, self.c(1)))))
                    tw = self.lo32(self.w("ShiftRightLogical", self.w("ShiftLeftLogical", pair, self.zext64(bo)),
                                          self.c64(32)))
                    ptr = f.chain(B.SC_FUNCTION, u32, acc, i)
                    s = self.w("IAdd", self.w("IAdd", self.zext64(f.load(u32, ptr)), self.zext64(tw)),
                               f.load(u64, carry))
                    f.store(ptr, self.lo32(s))
                    f.store(carry, self.w("ShiftRightLogical", s, self.c64(32)))
        top = f.load(u32, f.chain(B.SC_FUNCTION, u32, acc, self.c(WIDE_WORDS - 1)))
        neg = self.b("INotEqual", self.u("BitwiseAnd", top, self.c(SIGN)), self.c(0))
        with f.if_then(neg, self.name("negate")):
            carry = self.var(u64, "ncarry", self.c64(1))
            with f.loop(self.c(WIDE_WORDS), self.name("neg")) as i:
                ptr = f.chain(B.SC_FUNCTION, u32, acc, i)
                inv = self.u("BitwiseXor", f.load(u32, ptr), self.c(0xFFFFFFFF))
                s = self.w("IAdd", self.zext64(inv), f.load(u64, carry))
                f.store(ptr, self.lo32(s))
                f.store(carry, self.w("ShiftRightLogical", s, self.c64(32)))
        # the highest nonzero word (>= 1: a wide sum has more than 59 bits), the two words from
        # it down, and whether anything below them is nonzero
        hi = self.var(u32, "hi", self.c(1))
        with f.loop(self.c(WIDE_WORDS), self.name("top")) as i:
            nz = self.b("INotEqual", f.load(u32, f.chain(B.SC_FUNCTION, u32, acc, i)), self.c(0))
            above0 = self.b("LogicalAnd", nz, self.b("UGreaterThanEqual", i, self.c(1)))
            f.store(hi, self.sel(above0, i, f.load(u32, hi)))
        h = f.load(u32, hi)
        sticky = self.var(u32, "sticky", self.c(0))
        with f.loop(self.u("ISub", h, self.c(1)), self.name("sticky")) as i:
            v = f.load(u32, f.chain(B.SC_FUNCTION, u32, acc, i))
            f.store(sticky, self.u("BitwiseOr", f.load(u32, sticky), v))
        w_hi = f.load(u32, f.chain(B.SC_FUNCTION, u32, acc, h))
        w_lo = f.load(u32, f.chain(B.SC_FUNCTION, u32, acc, self.u("ISub", h, self.c(1))))
        w = self.w("BitwiseOr", self.w("ShiftLeftLogical", self.zext64(w_hi), self.c64(32)), self.zext64(w_lo))
        k = self.u("IAdd", xm, self.u("ShiftLeftLogical", self.u("ISub", h, self.c(1)), self.c(5)))
        st = self.b("INotEqual", f.load(u32, sticky), self.c(0))
        r = self.round_u64(w, k, st, self.sel(neg, self.c(SIGN), self.c(0)))
        return self.sel(self.b("IEqual", w, self.c64(0)), self.c(0), r)
