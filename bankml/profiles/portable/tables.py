"""Every constant and table of the portable profile, from Python's decimal module.

decimal is specified arithmetic (no platform libm), so these values are the same on every
host; each is rounded once to f32 by `to_f32` (nearest even). Tables are built once per
process (they depend on nothing but the profile).
"""
from __future__ import annotations

import functools
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

F32 = np.float32
_PREC = 40


def to_f32(v) -> np.float32:
    """A Decimal, Fraction or int rounded once to f32, nearest even; below 2^-126 it is 0
    (the profile flushes denormals)."""
    f = Fraction(v) if not isinstance(v, Fraction) else v
    if abs(f) < Fraction(1, 2 ** 126):
        return F32(0)
    sign, a = (-1 if f < 0 else 1), abs(f)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    scaled = a / Fraction(2) ** (e - 23)             # in [2^23, 2^24)
    q, r = divmod(scaled.numerator, scaled.denominator)
    rem = Fraction(r, scaled.denominator)
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and q & 1):
        q += 1
    with np.errstate(over="ignore"):                  # beyond the f32 range: inf
        return F32(sign * float(q) * 2.0 ** (e - 23))   # q <= 2^24: exact in f64, then exact in f32


def _pi() -> Decimal:
    """pi to the context's precision (the decimal module's documented recipe)."""
    with localcontext() as ctx:
        ctx.prec += 2
        three = Decimal(3)
        lasts, t, s, n, na, d, da = 0, three, 3, 1, 0, 0, 24
        while s != lasts:
            lasts = s
            n, na = n + na, na + 8
            d, da = d + da, da + 32
            t = (t * n) / d
            s += t
    return +s


def _cos_sin(x: Decimal) -> tuple[Decimal, Decimal]:
    """Taylor series of cos and sin at |x| <= 2*pi."""
    with localcontext() as ctx:
        ctx.prec += 4
        c, s, term, i = Decimal(0), Decimal(0), Decimal(1), 0
        while True:
            if i % 4 == 0:
                c += term
            elif i % 4 == 1:
                s += term
            elif i % 4 == 2:
                c -= term
            else:
                s -= term
            i += 1
            term = term * x / i
            if abs(term) < Decimal(10) ** (-ctx.prec) and i > 4:
                break
    return +c, +s


@functools.lru_cache(maxsize=None)
def constants() -> dict[str, np.float32]:
    with localcontext() as ctx:
        ctx.prec = _PREC
        ln2, pi = Decimal(2).ln(), _pi()
        c1 = to_f32(_trunc_bits(ln2 / 64, 10))      # ln2/64 with 10 significant bits: n*C1 exact
        c2 = to_f32(ln2 / 64 - Decimal(float(c1)))
        ln2_hi = to_f32(_trunc_bits(ln2, 16))        # k*LN2_HI exact for |k| < 2^8
        return {
            "INV_LN2_64": to_f32(64 / ln2), "EXP_C1": c1, "EXP_C2": c2,
            "LN2_HI": ln2_hi, "LN2_LO": to_f32(ln2 - Decimal(float(ln2_hi))),
            "SIXTH": to_f32(Fraction(1, 6)), "THIRD": to_f32(Fraction(1, 3)),
            "TWENTYFOURTH": to_f32(Fraction(1, 24)), "TWO_PI": to_f32(2 * pi),
            "INV_127": to_f32(Fraction(1, 127)),
        }


def _trunc_bits(v: Decimal, bits: int) -> Fraction:
    """v truncated to `bits` significant bits (toward zero)."""
    f = Fraction(v)
    e = f.numerator.bit_length() - f.denominator.bit_length()
    unit = Fraction(2) ** (e - bits + 1)
    return (f // unit) * unit


@functools.lru_cache(maxsize=None)
def exp_table() -> np.ndarray:
    """2^(j/64), j = 0..63."""
    with localcontext() as ctx:
        ctx.prec = _PREC
        return np.array([to_f32((Decimal(2).ln() * j / 64).exp()) for j in range(64)], F32)


LN_LO, LN_HI = 48, 96            # ln's table points c = i/64, i = 48..96, cover [3/4, 3/2]


@functools.lru_cache(maxsize=None)
def ln_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(64/i, hi part of ln(i/64), lo part) for i = 0..96 (entries below 48 unused, zero)."""
    inv, hi, lo = (np.zeros(LN_HI + 1, F32) for _ in range(3))
    with localcontext() as ctx:
        ctx.prec = _PREC
        for i in range(LN_LO, LN_HI + 1):
            inv[i] = to_f32(Fraction(64, i))
            v = (Decimal(i) / 64).ln()
            hi[i] = to_f32(v)
            lo[i] = to_f32(v - Decimal(float(hi[i])))
    return inv, hi, lo


@functools.lru_cache(maxsize=None)
def rsqrt_table() -> np.ndarray:
    """Seeds 1/sqrt(c) at the centre c of each of 128 intervals: [1,2) and [2,4) in 64 each.
    Index = 64 * (exponent odd) + top 6 fraction bits (the document: "the seed from the
    exponent's parity and the top six mantissa bits")."""
    out = np.zeros(128, F32)
    with localcontext() as ctx:
        ctx.prec = _PREC
        for i in range(128):
            c = (1 + (Decimal(i % 64) + Decimal("0.5")) / 64) * (2 if i >= 64 else 1)
            out[i] = to_f32(1 / c.sqrt())
    return out


@functools.lru_cache(maxsize=None)
def recip_table() -> np.ndarray:
    """Seeds 1/c at the centre of each of 128 intervals of [1, 2) (index: top 7 fraction bits;
    the document: "the seed from the top seven mantissa bits")."""
    return np.array([to_f32(1 / (1 + (Fraction(i) + Fraction(1, 2)) / 128)) for i in range(128)], F32)


SINCOS_N = 256                   # table points per turn


@functools.lru_cache(maxsize=None)
def sincos_table() -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2*pi*j/256, j = 0..255."""
    with localcontext() as ctx:
        ctx.prec = _PREC
        two_pi = 2 * _pi()
        cs = [_cos_sin(two_pi * j / SINCOS_N) for j in range(SINCOS_N)]
    return (np.array([to_f32(c) for c, _ in cs], F32), np.array([to_f32(s) for _, s in cs], F32))


@functools.lru_cache(maxsize=16)
def rope_turns(n_dims: int, freq_base: float, freq_scale: float) -> np.ndarray:
    """The rotation speed of each pair i < n_dims/2 in turns per position:
    freq_scale * base^(-2i/n_dims) / (2*pi), rounded once to f32 (base and scale are the
    model's f32 values, read exactly)."""
    with localcontext() as ctx:
        ctx.prec = _PREC
        two_pi, base = 2 * _pi(), Decimal(float(F32(freq_base)))
        scale = Decimal(float(F32(freq_scale)))
        return np.array([to_f32(scale * (-(Decimal(2 * i) / n_dims) * base.ln()).exp() / two_pi)
                         for i in range(n_dims // 2)], F32)
