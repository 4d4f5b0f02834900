"""The portable QUANTIZE's codes without a division (kernels_portable_rows.nearest_quotient: the
product with r(1/m), then rint): the finite set of code ties, where the argument is "checked for
each", in f64 and through the kernel; every tie's f32 neighbours a few ulps either side, for
every m; wide random blocks. Each equals the spec's rint of one f64 division
(quant.quantize_act), for 1, 2 and 3 threads."""
from __future__ import annotations

import numpy as np

from bankml.profiles.portable import quant
from tests.backends.llvm.test_llvm_portable_matmul import pq8, run_quantize


def test_every_tie_is_exact_in_the_product():
    """x = (k + 1/2) m with |x / m| <= 127, m 1..15 (1: an all-zero block's divisor):
    x * r(1/m) is exactly k + 1/2, so rint takes the even neighbour as the spec does."""
    for m in range(1, 16):
        k = np.arange(-127, 127) + 0.5
        y = (k * m) * (1.0 / m)
        assert np.array_equal(y, k), f"m={m}: {k[y != k]}"


def test_every_tie_through_the_kernel():
    """Each block's scale held at m * 2^-6 by a first element 127 m 2^-6; its other values
    the ties (c + 1/2) m 2^-6, c over -127..126, for every m 8..15."""
    c = np.resize(np.arange(-127, 127) + 0.5, 31 * 9)
    x = np.array([np.insert(c.reshape(9, 31), 0, 127.0, axis=1).reshape(-1) * m * 2.0 ** -6
                  for m in range(8, 16)], np.float32)
    want = pq8(quant.quantize_act(x))
    for nth in (1, 2, 3):
        assert np.array_equal(run_quantize(x, nth), want), f"nth={nth}"


def near_ties(m: int, ulps: int) -> np.ndarray:
    """Rows of blocks at scale m * 2^-6 (a first element 127 m 2^-6 holds it): 31 values each
    (c + 1/2) m 2^-6 moved by `ulps` f32 ulps, c over -127..126."""
    c = np.resize(np.arange(-127, 127) + 0.5, 31 * 9)
    ties = (c * m * 2.0 ** -6).astype(np.float32)
    moved = (ties.view(np.int32) + np.int32(ulps)).view(np.float32)       # toward or away from 0 by sign
    v = np.insert(moved.reshape(9, 31), 0, np.float32(127 * m * 2.0 ** -6), axis=1)
    return v.reshape(1, -1)


def test_codes_next_to_ties():
    rows = [near_ties(m, d) for m in range(8, 16) for d in (-3, -2, -1, 1, 2, 3)]
    x = np.concatenate(rows).astype(np.float32)
    want = pq8(quant.quantize_act(x))
    for nth in (1, 2, 3):
        assert np.array_equal(run_quantize(x, nth), want), f"nth={nth}"


def test_codes_of_wide_random_blocks():
    """Blocks whose values span many binades (small codes and codes near +-127, every m)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((40, 512)) * np.exp2(rng.integers(-30, 30, (40, 512)))).astype(np.float32)
    x[:, ::16] = (rng.integers(-127, 128, (40, 32)) + 0.5) * np.float32(0.375)      # ties at m = 12
    want = pq8(quant.quantize_act(x))
    for nth in (1, 2, 3):
        assert np.array_equal(run_quantize(x, nth), want), f"nth={nth}"
