"""reference.fma_f32 rounds once: checked against exact rational arithmetic, ties included."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from bankml.backends.spirv.q1 import reference


def _exact_fma(a, b, c) -> np.float32:
    x = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if x == 0:                        # the sign of an exact zero: f64 gets it right
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    r = np.float32(float(x))
    cands = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]
    return min(cands, key=lambda y: (abs(Fraction(float(y)) - x), int(np.float32(y).view(np.uint32)) & 1))


def test_fma_f32_rounds_once_on_random_and_midpoint_cases():
    rng = np.random.default_rng(3)
    n = 4000
    a = np.float16(rng.standard_normal(n) * np.exp2(rng.integers(-20, 10, n))).astype(np.float32)
    b = (rng.integers(-2 ** 24, 2 ** 24, n) * np.exp2(rng.integers(-40, 0, n))).astype(np.float32)
    p = a.astype(np.float64) * b.astype(np.float64)
    c = np.concatenate([(-p[:1000]).astype(np.float32),                           # cancellation
                        np.exp2(rng.integers(5, 25, 1000)).astype(np.float32),    # near ties
                        (p[2000:3000] * rng.standard_normal(1000)).astype(np.float32),
                        np.zeros(1000, np.float32)])
    got = reference.fma_f32(a, b, c)
    want = np.array([_exact_fma(*t) for t in zip(a, b, c)], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _near_one_products():
    """(a, b) with a an f16 value, b an f32, and a*b = 1 + eta, 0 < |eta| < 2^-29 exactly."""
    for k in range(1, 1024):
        a = np.float32(1 + k * 2.0 ** -10)
        b0 = np.float32(1 / a)
        for b in (b0, np.nextafter(b0, np.float32(2)), np.nextafter(b0, np.float32(0))):
            eta = Fraction(float(a)) * Fraction(float(b)) - 1
            if 0 < abs(eta) < Fraction(1, 2 ** 29):
                yield a, b, eta


def test_fma_f32_breaks_an_f64_double_rounding_tie_correctly():
    # c + a*b = 2^24 + 1 + eta: f64 rounds it to the f32 midpoint 2^24 + 1, which then ties to
    # even (2^24); rounded once it goes toward eta's side.
    c = np.float32(2.0 ** 24)
    cases = list(_near_one_products())
    assert any(e > 0 for *_, e in cases) and any(e < 0 for *_, e in cases)
    for a, b, eta in cases:
        got = reference.fma_f32(np.array([a]), np.array([b]), np.array([c]))[0]
        assert got == (np.float32(2.0 ** 24 + 2) if eta > 0 else c) == _exact_fma(a, b, c)
        assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == c   # the naive way
