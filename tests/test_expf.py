"""bankml.numerics.expf.ggml_v_expf against ggml's own, through the exported ggml_vec_soft_max_f32 (max = 0)."""
from __future__ import annotations

import numpy as np
import pytest

from fractions import Fraction

from bankml.numerics.expf import fma, ggml_v_expf


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    parts = [
        rng.standard_normal(4096) * 4,
        rng.uniform(-110, 95, 8192),                       # both overflow/underflow branches
        rng.uniform(-104, -87, 2048),                      # subnormal results
        np.array([0.0, -0.0, np.inf, -np.inf, 88.72, 88.73, 89.0, -103.97, -103.98, -150, 150, 1e-30,
                  -1e-30, 126 * np.log(2), -126 * np.log(2), 192 * np.log(2), -192 * np.log(2), 1.0]),
    ]
    x = np.concatenate(parts).astype(np.float32)
    x = np.concatenate([x, rng.permutation(x)])            # every value beside both kinds of neighbours
    return x[: len(x) // 8 * 8]                            # only 8-lane chunks: no glibc tail


@pytest.mark.oracle
def test_ggml_v_expf_bits_equal_ggml():
    from bankml.oracle.ggml import vec_soft_max_f32

    x = _inputs()
    want, _ = vec_soft_max_f32(x, 0.0)
    got = ggml_v_expf(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert bad.size == 0, f"{bad.size} lanes differ, first x={x[bad[:5]]} got={got[bad[:5]]} want={want[bad[:5]]}"


def test_ggml_v_expf_minus_inf_is_zero_and_inf_overflows():
    y = ggml_v_expf(np.array([-np.inf, np.inf, 0.0, -200.0], np.float32))
    assert y[0] == 0 and not np.signbit(y[0])
    assert y[1] == np.inf and y[2] == 1.0 and y[3] == 0.0


def _exact_fma(a, b, c) -> np.float32:
    """Round the exact rational a*b+c to f32 (nearest, ties to even) by comparing neighbours."""
    x = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(x))
    cands = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    return min(cands, key=lambda y: (abs(Fraction(float(y)) - x), int(y.view(np.uint32)) & 1))


def test_fma_rounds_once_on_f32_midpoints_and_subnormals():
    """a*b+c landing on an f32 midpoint after the f64 add (or in the subnormal range) rounds once."""
    rng = np.random.default_rng(0)
    n = 1500
    c = rng.uniform(-2, 2, n).astype(np.float32)
    a = rng.uniform(0.5, 2, n).astype(np.float32)
    b = (np.spacing(c) / 2 / a * (1 + rng.uniform(-1e-6, 1e-6, n))).astype(np.float32)   # half an ulp of c
    c_sub = (rng.integers(1, 1 << 20, n) * 2.0 ** -149).astype(np.float32)
    b_sub = (2.0 ** -150 / a * (1 + rng.uniform(-1e-9, 1e-9, n))).astype(np.float32)
    A, B, C = np.concatenate([a, a]), np.concatenate([b, b_sub]), np.concatenate([c, c_sub])
    with np.errstate(under="ignore"):
        got = fma(A.reshape(2, n), B.reshape(2, n), C.reshape(2, n)).ravel()
    want = np.array([_exact_fma(*t) for t in zip(A, B, C)], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
