"""The portable profile's f32 steps: flush to zero, one NaN, the lane+tree fold, exact sums rounded once."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from bankml.profiles.portable import arith
from bankml.profiles.portable.tables import to_f32

F32, U32 = np.float32, np.uint32
TINY = F32(2.0 ** -126)


def bits(x) -> np.ndarray:
    return np.asarray(x, F32).view(U32)


def test_denormals_flush_to_zero_keeping_their_sign_and_nans_are_one():
    x = np.array([1e-40, -1e-40, 0.0, -0.0, 1.0], F32)
    nans = np.array([0x7FC00001, 0xFFC00000, 0x7F800001], U32).view(F32)
    out = arith.canon(np.concatenate([x, nans]))
    assert bits(out).tolist() == [0, 0x80000000, 0, 0x80000000, 0x3F800000] + [0x7FC00000] * 3


def test_operands_are_read_as_zero_when_denormal():
    den = F32(1e-40)
    assert arith.mul(den, F32(2.0 ** 40)) == 0            # DAZ: not 1e-40 * 2^40
    assert bits(arith.add(-den, F32(0.0))) == bits(F32(0.0))  # -0 + +0 = +0


def test_results_below_2_to_minus_126_flush_keeping_their_sign():
    a = F32(1.5) * TINY
    assert bits(arith.sub(a, TINY)) == 0                  # 0.5 * 2^-126: flushed, +0
    assert bits(arith.sub(TINY, a)) == 0x80000000         # -0.5 * 2^-126: flushed, -0
    assert arith.mul(TINY, F32(1.0)) == TINY              # the least normal stays
    assert bits(arith.mul(F32(2.0 ** -70), F32(-(2.0 ** -70)))) == 0x80000000


def test_no_fused_multiply_add():
    a = F32(1 + 2.0 ** -12)
    # a*a = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 (a tie, to even) before the subtraction;
    # a fused a*a - (1 + 2^-11) would give 2^-24
    assert bits(arith.sub(arith.mul(a, a), F32(1 + 2.0 ** -11))) == 0


def _fold_by_hand(x: np.ndarray) -> np.float32:
    lanes = [F32(-0.0)] * arith.LANES
    for i, v in enumerate(x):
        lanes[i % arith.LANES] = F32(arith.add(lanes[i % arith.LANES], v))
    while len(lanes) > 1:
        lanes = [F32(arith.add(lanes[i], lanes[i + 1])) for i in range(0, len(lanes), 2)]
    return lanes[0]


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 100, 576])
def test_fold_sum_is_lanes_in_index_order_then_a_balanced_tree(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(F32)
    assert bits(arith.fold_sum(x)) == bits(_fold_by_hand(x))


def test_fold_sum_order_matters_and_is_the_lane_one():
    x = np.zeros(16, F32)
    x[0], x[8], x[1] = F32(2.0 ** 25), F32(1.0), F32(1.0)  # lane 0: 2^25 + 1 -> 2^25 (tie to even)
    assert arith.fold_sum(x) == F32(2.0 ** 25)            # a sequential sum would give 2^25 + 2
    assert bits(arith.fold_sum(np.array([-0.0], F32))) == 0x80000000     # missing elements change nothing
    assert bits(arith.fold_sum(np.array([-0.0] * 9, F32))) == 0x80000000


def test_int64_to_f32_rounds_once():
    # via f64 this would round twice: 2^60 + 2^36 + 1 -> 2^60 + 2^36 (a tie) -> 2^60
    n = np.array([(1 << 60) + (1 << 36) + 1, (1 << 60) + (1 << 36), -((1 << 62) + (1 << 38) + 1)], np.int64)
    out = arith.int_to_f32(n, 0)
    assert out.tolist() == [2.0 ** 60 + 2.0 ** 37, 2.0 ** 60, -(2.0 ** 62 + 2.0 ** 39)]
    rng = np.random.default_rng(0)
    n = rng.integers(-(1 << 62), 1 << 62, 20000, dtype=np.int64)
    n[::2] = (n[::2] >> 30 << 30) | (1 << 29)              # many exact ties below the 24 kept bits
    out = arith.int_to_f32(n, 0)
    assert all(o == to_f32(int(v)) for o, v in zip(out[:2000], n[:2000]))


def _exact(p, x) -> np.float32:
    """The document's exact_sum from its text, in Fractions: the largest term's least place L
    (of equal terms the greatest), each term below L - 64 floored at it, then one rounding."""
    terms = [(Fraction(int(pi)) * Fraction(2) ** int(xi), int(xi)) for pi, xi in zip(p, x) if pi]
    if not terms:
        return F32(0)
    top = max(abs(v) for v, _ in terms)
    edge = max(xi for v, xi in terms if abs(v) == top) - arith.SUM_WINDOW
    unit = Fraction(2) ** edge
    return to_f32(sum(v if xi >= edge else math.floor(v / unit) * unit for v, xi in terms))


def test_round_exact_equals_the_windowed_exact_sum_rounded_once():
    rng = np.random.default_rng(1)
    for spread in (0, 10, 40, 200):                        # 200: Python's integers, and the window
        p = rng.integers(-(1 << 34), 1 << 34, (300, 8), dtype=np.int64)
        x = rng.integers(-60, -60 + spread + 1, (300, 8))
        out = arith.round_exact(p, x)
        assert all(o == _exact(pi, xi) for o, pi, xi in zip(out, p, x)), spread


def test_exact_sum_floors_a_term_past_the_window_however_far_past_in_any_order():
    """SUM_WINDOW places below the largest term's least place are kept; a term past them is
    floored at the window's edge (toward -inf), so a negative term 1,000 places below still
    takes one unit of the edge; the result does not depend on the terms' order."""
    W = arith.SUM_WINDOW
    one = lambda p, x: arith.round_exact(np.array([p]), np.array([x]))[0]         # noqa: E731
    assert one([1, -1, 3], [100, 100, 100 - W]) == F32(3 * 2.0 ** (100 - W))   # at the edge: exact
    assert one([1, -1, 3], [100, 100, 99 - W]) == F32(2.0 ** (100 - W))        # 1.5 units: 1
    assert one([1, -1, -3], [100, 100, 99 - W]) == F32(-2 * 2.0 ** (100 - W))  # -1.5 units: -2
    assert one([1, -1, 1], [100, 100, -1000]) == F32(0)
    assert one([1, -1, -1], [100, 100, -1000]) == F32(-(2.0 ** (100 - W)))
    # equal largest terms 2·2^99 and 1·2^100: the greater least place, 100, anchors the window
    assert one([2, -1, 3], [99, 100, 99 - W]) == F32(2.0 ** (100 - W))
    rng = np.random.default_rng(4)
    p = rng.integers(-255, 256, (200, 8), dtype=np.int64)
    x = rng.integers(120 - W, 200 - W, (200, 8))                        # every other term past the edge
    p[:, 0], p[:, 1], x[:, :2] = 1 << 20, -(1 << 20), 200               # cancelling largest terms
    out = arith.round_exact(p, x)
    perm = rng.permutation(8)
    assert np.array_equal(bits(out), bits(arith.round_exact(p[:, perm], x[:, perm])))
    assert all(o == _exact(pi, xi) for o, pi, xi in zip(out, p, x))
    unbounded = [to_f32(sum(Fraction(int(a)) * 2 ** int(b) for a, b in zip(pi, xi))) for pi, xi in zip(p, x)]
    assert sum(o != u for o, u in zip(out, unbounded)) > 50                 # the window shows (103 of 200)


def test_round_exact_of_cancelling_terms_is_plus_zero_and_ties_go_to_even():
    assert bits(arith.round_exact(np.array([[5, -5]]), np.array([[3, 3]])))[0] == 0
    # (2^24 + 1) * 2^0 + 0 = a tie between 2^24 and 2^24 + 2: even is 2^24
    assert arith.round_exact(np.array([[(1 << 24) + 1, 0]]), np.array([[0, 0]]))[0] == F32(2.0 ** 24)
    assert arith.round_exact(np.array([[(1 << 24) + 3]]), np.array([[0]]))[0] == F32(2.0 ** 24 + 4)


def test_scale2_overflows_to_inf_and_flushes_below_the_least_normal():
    y = np.array([1.0, 1.5, -1.0, 1.0], F32)
    k = np.array([-126, -127, 128, 127])
    out = arith.scale2(y, k)
    assert bits(out).tolist() == [bits(TINY), 0, bits(F32(-np.inf)), bits(F32(2.0 ** 127))]


def test_div_is_ieee_division_then_ftz():
    """rmsnorm's Σx²/n: nearest even at f32's own precision (2^-149 below 2^-126), then flushed."""
    from bankml.profiles.portable.arith import div
    edge = np.float32(((1 << 24) - 1) * 2.0 ** -148)          # /4: the tie (2^24 - 1)·2^-150 -> 2^-126
    below = np.nextafter(edge, np.float32(0))                 # /4: a denormal -> +0
    got = div(np.array([edge, below, -edge, 6.0, 1.0, np.inf, np.nan, 1e-40], np.float32), np.float32(4))
    want = np.array([2.0 ** -126, 0.0, -2.0 ** -126, 1.5, 0.25, np.inf, np.nan, 0.0], np.float32)
    assert got.view(np.uint32).tolist()[:6] == want.view(np.uint32).tolist()[:6]
    assert got.view(np.uint32)[6] == 0x7FC00000 and got.view(np.uint32)[7] == 0
    assert np.signbit(div(np.float32(-1e-38), np.float32(3)))    # a flushed negative keeps its sign


def test_round_exact_of_one_sum_takes_the_wide_path_too():
    """A single sum (p, x 1-D) whose terms are too far apart for int64 is the windowed sum rounded
    once, as a row of such sums gives it (attention.int8_score calls it so)."""
    p, x = np.array([3, -1, 5], np.int64), np.array([0, 70, -40], np.int64)
    got = arith.round_exact(p, x)
    assert got.shape == () and got.view(np.uint32) == arith.round_exact(p[None], x[None])[0].view(np.uint32)
    n, k = arith.windowed(p.tolist(), x.tolist())
    assert got == np.float32(n * 2.0 ** k)
