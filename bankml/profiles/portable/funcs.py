"""The portable profile's functions, from its f32 steps and tables alone (docs/PORTABLE.md).

Each is written as the sequence of rounded steps every backend performs; a comment above
each function states its specials. Error bounds against the true function (measured by the
sweeps in tests/profiles/test_portable_funcs.py) are in docs/PORTABLE.md.
"""
from __future__ import annotations

import numpy as np

from bankml.profiles.portable.arith import F32, add, canon, div, fields, fold_sum, mul, scale2, sub
from bankml.profiles.portable.tables import LN_HI, constants, exp_table, ln_tables, recip_table, rsqrt_table

NAN, INF = F32(np.nan), F32(np.inf)
EXP_LO, EXP_HI = F32(-104.0), F32(89.0)     # beyond these exp is 0 (flushed) or inf anyway


def _f(x) -> np.ndarray:
    return canon(np.asarray(x, F32))


# exp: NaN -> NaN; x is clamped to [-104, 89] (so -inf -> +0, +inf -> +inf).
# n = rint(x * 64/ln2); r = (x - n*C1) - n*C2 (C1 + C2 = ln2/64, n*C1 exact);
# q = ((r/6 + 1/2) * r + 1) * r  (the cubic e^r - 1); y = T[n mod 64] + T[n mod 64] * q;
# result y * 2^(n div 64), flushed below 2^-126.
def exp(x) -> np.ndarray:
    c = constants()
    x = _f(x)
    nan = np.isnan(x)
    x = np.clip(np.where(nan, F32(0), x), EXP_LO, EXP_HI)
    n = np.rint(mul(x, c["INV_LN2_64"])).astype(np.int64)
    nf = n.astype(F32)                                       # |n| < 2^14: exact
    r = sub(sub(x, mul(nf, c["EXP_C1"])), mul(nf, c["EXP_C2"]))
    q = mul(add(mul(add(mul(r, c["SIXTH"]), F32(0.5)), r), F32(1)), r)
    t = exp_table()[n & 63]
    y = add(t, mul(t, q))
    out = scale2(y, n >> 6)
    return np.where(nan, NAN, out).astype(F32)


# ln: NaN or x < 0 -> NaN; +-0 (and denormals) -> -inf; +inf -> +inf.
# x = m * 2^k with m in [3/4, 3/2); i = rint(64 m) (48..96), c = i/64;
# u = (m - c) * (64/i)  (m - c exact); p = (((-u/4 + 1/3) * u - 1/2) * u + 1) * u  (ln(1+u));
# result (k*LN2_HI + LNHI[i]) + ((k*LN2_LO + LNLO[i]) + p).
def ln(x) -> np.ndarray:
    c = constants()
    inv, lhi, llo = ln_tables()
    x = _f(x)
    _, e, frac = fields(x)
    k = e - 127
    big = frac >= 0x400000                                   # 1.frac >= 1.5: halve it
    k = np.where(big, k + 1, k)
    m = ((frac | 0x800000).astype(F32) * F32(2.0 ** -23)).astype(F32)
    m = np.where(big, m * F32(0.5), m).astype(F32)            # exact
    i = np.clip(np.rint(m * F32(64)).astype(np.int64), 0, LN_HI)
    u = mul(sub(m, (i.astype(F32) * F32(1 / 64)).astype(F32)), inv[i])
    p = mul(add(mul(add(mul(add(mul(u, F32(-0.25)), c["THIRD"]), u), F32(-0.5)), u), F32(1)), u)
    kf = k.astype(F32)
    hi = add(mul(kf, c["LN2_HI"]), lhi[i])
    lo = add(mul(kf, c["LN2_LO"]), llo[i])
    out = add(hi, add(lo, p))
    out = np.where(x == 0, -INF, out)
    out = np.where(np.isinf(x) & (x > 0), INF, out)
    out = np.where(np.isnan(x) | (x < 0), NAN, out)
    return canon(out)


# rsqrt: NaN or x < 0 -> NaN; +0 -> +inf; -0 -> -inf; +inf -> +0.
# x = m * 4^j with m in [1, 4); y0 = seed[parity, top 6 fraction bits];
# twice y = y * (1.5 - 0.5 * ((m * y) * y)); result y * 2^-j. m*y, (m*y)*y and every step
# stay near 1 (m in [1, 4), y in (0.5, 1]), so nothing flushes whatever x's binade.
def rsqrt(x) -> np.ndarray:
    """1/√x for x ≥ 0: the seed from the exponent's parity and the top six mantissa bits, then two
    Newton steps y·(1.5 − ½·((x·y)·y)), every intermediate near 1 so none flushes at the ends of
    the range (x here the reduced m of x = m·4^j)."""
    x = _f(x)
    _, e, frac = fields(x)
    k = e - 127
    odd = k & 1
    j = (k - odd) >> 1
    m = ((frac | 0x800000).astype(F32) * F32(2.0 ** -23)).astype(F32)
    m = np.where(odd == 1, m * F32(2), m).astype(F32)        # exact
    y = rsqrt_table()[np.clip(odd * 64 + (frac >> 17), 0, 127)]
    for _ in range(2):
        y = mul(y, sub(F32(1.5), mul(F32(0.5), mul(mul(m, y), y))))
    out = scale2(y, -j)
    out = np.where(x == 0, np.copysign(INF, x), out)
    out = np.where(np.isinf(x) & (x > 0), F32(0), out)
    out = np.where(np.isnan(x) | (x < 0), NAN, out)
    return canon(out)


# recip: NaN -> NaN; +-0 -> +-inf; +-inf -> +-0.
# |x| = m * 2^k with m in [1, 2); y0 = seed[top 7 fraction bits]; twice y = y * (2 - m * y);
# result +-y * 2^-k, flushed below 2^-126.
def recip(x) -> np.ndarray:
    """1/x: the seed from the top seven mantissa bits, then two Newton steps y·(2 − x·y) (x here the
    reduced m of |x| = m·2^k)."""
    x = _f(x)
    s, e, frac = fields(x)
    k = e - 127
    m = ((frac | 0x800000).astype(F32) * F32(2.0 ** -23)).astype(F32)
    y = recip_table()[frac >> 16]
    for _ in range(2):
        y = mul(y, sub(F32(2), mul(m, y)))
    out = scale2(y, -k)
    out = np.where(s == 1, -out, out)
    out = np.where(x == 0, np.copysign(INF, x), out)
    out = np.where(np.isinf(x), np.copysign(F32(0), x), out)
    out = np.where(np.isnan(x), NAN, out)
    return canon(out)


# ln1p(t) for t >= 0: u = 1 + t rounded; ln(u) + (t - (u - 1)) * recip(u). Below u = 2^24, u - 1
# is exact and t - (u - 1) is the rounding's own error, exactly (above it the correction, under
# 2^-23 of ln u, is not exact and does not matter); the profile never divides, so "/u" is the
# product with recip(u). +inf -> +inf, NaN -> NaN.
def ln1p(t) -> np.ndarray:
    """ln(1 + t) for t ≥ 0: ln u of u = 1 + t rounded, corrected by the rounding's own error
    (t − (u − 1))/u, which is exact."""
    t = _f(t)
    u = add(F32(1), t)
    err = sub(t, sub(u, F32(1)))
    out = add(ln(u), mul(err, recip(u)))
    return canon(np.where(np.isinf(t) & (t > 0), INF, out))


# sigmoid(x) = recip(1 + exp(-x)); silu(x) = x * sigmoid(x) (so silu(-inf) is NaN: -inf * 0);
# softplus(u) = u + exp(-u) when u > 16, else ln1p(exp(u)).
def sigmoid(x) -> np.ndarray:
    return recip(add(F32(1), exp(-_f(x))))


def silu(x) -> np.ndarray:
    x = _f(x)
    return mul(x, sigmoid(x))


def softplus(u) -> np.ndarray:
    """ln(1 + e^u): u past 16 adds e^-u."""
    u = _f(u)
    big = u > F32(16)
    return canon(np.where(big, add(u, exp(-u)), ln1p(exp(np.where(big, F32(0), u)))))


# softmax over the last axis: mx = fmax (a NaN passed over); e = exp(x - mx); s = fold_sum(e);
# r = recip(s); y = e * r. So a NaN anywhere makes the row NaN (its e is NaN, so is s), and so
# does a row of -inf (-inf - -inf is NaN) or with +inf (inf - inf).
def softmax(x) -> np.ndarray:
    """The softmax: the maximum (fmax), each exp(s − max), their sum in lanes (fsum), one
    reciprocal, the products."""
    x = _f(x)
    e = exp(sub(x, fmax(x)[..., None]))
    return mul(e, recip(fold_sum(e))[..., None])


# rmsnorm over the last axis: s = fold_sum(x * x); v = s / n + eps; y = (x * rsqrt(v)) * w.
def rmsnorm(x, w, eps: float) -> np.ndarray:
    """RMSNorm: x_i · rsqrt(Σx²/n + ε) · w_i, the product in that order."""
    x = _f(x)
    v = add(div(fold_sum(mul(x, x)), F32(x.shape[-1])), F32(eps))
    y = mul(x, rsqrt(v)[..., None])
    return y if w is None else mul(y, w)


# l2norm over the last axis: x * rsqrt(fold_sum(x * x) + eps).
def l2norm(x, eps: float) -> np.ndarray:
    """x / √(Σx² + ε)."""
    x = _f(x)
    return mul(x, rsqrt(add(fold_sum(mul(x, x)), F32(eps)))[..., None])


# fmax / absmax over the last axis: NaNs are passed over. fmax folds from -inf (an all-NaN or
# empty row gives -inf) and a zero maximum is +0; absmax folds from +0 with denormals read as 0.
def fmax(x) -> np.ndarray:
    """The largest of x, folded from −∞; a NaN is passed over, and a largest value that is a zero is
    +0 whichever zeros it was folded from, so lanes folding in any order agree."""
    x = _f(x)
    m = np.max(np.where(np.isnan(x), -INF, x), axis=-1, initial=-INF)
    return canon(np.where(m == 0, F32(0), m))


def absmax(x) -> np.ndarray:
    """The largest magnitude in x, a denormal read as a zero, folded from +0; a NaN is passed over."""
    a = np.abs(_f(x))
    return canon(np.max(np.where(np.isnan(a), F32(0), a), axis=-1, initial=F32(0)))


# argmax over the last axis: the first index of the largest non-NaN value (the two zeros equal);
# 0 when there is none (every element NaN).
def argmax(x) -> np.ndarray:
    x = _f(x)
    filled = np.where(np.isnan(x), -INF, x)
    idx = np.argmax(filled, axis=-1)
    allnan = np.all(np.isnan(x), axis=-1)
    # a row of -inf and NaN: the first -inf that is not a NaN
    first_real = np.argmax(~np.isnan(x), axis=-1)
    idx = np.where(np.take_along_axis(filled, idx[..., None], -1)[..., 0] == -INF, first_real, idx)
    return np.where(allnan, 0, idx)


# hadamard over the last axis (a power of two): for h = 1, 2, 4, ..., len/2, each pair
# (x[j], x[j+h]) of every 2h-block becomes (x[j] + x[j+h], x[j] - x[j+h]), in index order.
def hadamard(x) -> np.ndarray:
    """The Walsh–Hadamard transform of x in place, unnormalized: for each stride h from 1 doubling to
    len/2, every pair (x[j], x[j+h]) of each 2h-block becomes (x[j] + x[j+h], x[j] − x[j+h]), in
    index order. Applied twice it is len times the identity, so len a power of two makes the
    inverse exact: the transform, then 2^-log2 len.

    numpy arrays here: the transformed copy is returned."""
    x = _f(x)
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard: length {n} is not a power of two")
    h = 1
    while h < n:
        b = x.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        lo, hi = b[..., 0, :], b[..., 1, :]
        x = np.stack([add(lo, hi), sub(lo, hi)], axis=-2).reshape(x.shape)
        h *= 2
    return x
