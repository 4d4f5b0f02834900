"""Stratified sweeps of the profile's exp, ln and rsqrt against the true function.

Every binade of f32 inputs in a function's range is swept at `per_binade` evenly spaced
fractions (both signs where the function takes them), plus the binade's ends; the error is
|y - f(x)| in units of the last place of f(x) in f32 (float64 `math` gives f(x)). Results
that are flushed (true value below 2^-126) or infinite are checked for being exactly that.

    python -m bankml.profiles.portable.sweep 65536     # the figures in docs/PORTABLE.md
"""
from __future__ import annotations

import sys

import numpy as np

from bankml.profiles.portable import funcs

F32 = np.float32


def inputs(lo_exp: int, hi_exp: int, per_binade: int, signs=(1,)) -> np.ndarray:
    """f32 values s * 2^e * (1 + j/per_binade) for e in [lo_exp, hi_exp], plus the last of each binade."""
    frac = (np.arange(per_binade, dtype=np.int64) * (1 << 23)) // per_binade
    frac = np.concatenate([frac, [(1 << 23) - 1]])
    out = []
    for e in range(lo_exp, hi_exp + 1):
        bits = ((e + 127) << 23) | frac
        v = bits.astype(np.uint32).view(F32)
        out += [v * F32(s) for s in signs]
    return np.concatenate(out).astype(F32)


def ulp_error(y: np.ndarray, true: np.ndarray) -> np.ndarray:
    """|y - true| / ulp_f32(true), for true in the normal range."""
    _, e = np.frexp(np.abs(true))
    ulp = np.ldexp(1.0, e - 24)
    return np.abs(y.astype(np.float64) - true) / ulp


def sweep(name: str, per_binade: int) -> tuple[float, int]:
    """(max ulp error over the normal results, number of inputs); raises on a wrong special."""
    if name == "exp":
        x = inputs(-126, 6, per_binade, (1, -1))
        x = x[(x >= F32(-104)) & (x <= F32(89))]
        true = np.exp(x.astype(np.float64))
        y = funcs.exp(x)
    elif name == "ln":
        x = inputs(-126, 127, per_binade)
        true = np.log(x.astype(np.float64))
        y = funcs.ln(x)
    elif name == "rsqrt":
        x = inputs(-126, 127, per_binade)
        true = 1 / np.sqrt(x.astype(np.float64))
        y = funcs.rsqrt(x)
    else:
        raise ValueError(name)
    tiny = np.abs(true) < 2.0 ** -126
    huge = np.abs(true) >= float(np.finfo(F32).max) * (1 + 2.0 ** -25)
    if np.any(y[tiny] != 0) or np.any(~np.isinf(y[huge])):
        raise AssertionError(f"{name}: a flushed or overflowing result is wrong")
    ok = ~tiny & ~huge
    exact_one = (true == 0) & ok           # ln(1) = 0: must be exactly 0
    if np.any(y[exact_one] != 0):
        raise AssertionError(f"{name}: ln(1) is not 0")
    ok &= true != 0
    return float(np.max(ulp_error(y[ok], true[ok]))), int(x.size)


def exhaustive(name: str) -> tuple[float, int]:
    """rsqrt over every f32 in [1, 4) and recip over every f32 in [1, 2): both scale exactly
    (rsqrt(m 4^j) = rsqrt(m) 2^-j, recip(m 2^k) = recip(m) 2^-k), so these stand for every
    input whose result is normal."""
    lo, hi = (0x3F800000, 0x40800000) if name == "rsqrt" else (0x3F800000, 0x40000000)
    worst = 0.0
    for a in range(lo, hi, 1 << 22):
        x = np.arange(a, min(a + (1 << 22), hi), dtype=np.uint32).view(F32)
        xd = x.astype(np.float64)
        y, true = (funcs.rsqrt(x), 1 / np.sqrt(xd)) if name == "rsqrt" else (funcs.recip(x), 1 / xd)
        worst = max(worst, float(ulp_error(y, true).max()))
    return worst, hi - lo


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    for fn in ("exp", "ln", "rsqrt"):
        err, count = sweep(fn, n)
        print(f"{fn}: max {err:.3f} ulp over {count} inputs ({n} per binade)")
    for fn in ("rsqrt", "recip"):
        err, count = exhaustive(fn)
        print(f"{fn}: max {err:.3f} ulp over all {count} inputs of its scaling interval")
