"""The portable mul_mat's f64 group sums (bankml/backends/llvm/portable/f64.py): four weight
rows against one column, a group summed in f64 only where that is provably exact, else the
exact i64 / i512 path. Each case equals the numpy spec's bits, and a kernel whose exact path
writes a marker instead shows which path each four rows took: exponent spreads exactly at the
limit (f64) and one past it (exact path), results below 2^-126 (exact path), exact zeros,
exact cancellation and overflow (f64)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, run_kernel  # noqa: E402
from test_llvm_portable_matmul import _graph, bits, pq8, weights  # noqa: E402

from bankml.backends.llvm.portable import matmul as kpm  # noqa: E402
from bankml.backends.llvm.portable import f64 as pf  # noqa: E402
from bankml.profiles.portable import arith, quant  # noqa: E402
from bankml.quants import Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES  # noqa: E402

TYPES = [Q8_0, Q4_1, Q1_0, Q2_0]
NAMES = [WEIGHT_TYPES[t].name for t in TYPES]
K, ROWS = 256, 8                  # one group; two blocks of four rows, no remainder row
MARK = np.float32(12345.0)        # what the marked kernel's exact path gives


def limit(t: int) -> int:
    return pf.limit(kpm.TERM_BITS[t], 16 if t == Q4_1 else 8)


def run(raw, t, a, monkeypatch=None, nth: int = 1) -> np.ndarray:
    """The decode kernel's result on nth threads; with monkeypatch, a kernel whose exact path gives MARK."""
    g, _, mm, _ = _graph(t, a.q.shape[1], 1, len(raw))
    if monkeypatch is None:
        kern = compile_kernel(g, mm)
    else:
        with monkeypatch.context() as mp:
            mp.setattr(kpm, "group", lambda b, wtype, w, gi, nsub, cols: [kpm.f32(float(MARK))] * len(cols.x))
            kern = compile_kernel(g, mm)
    out = np.full((1, len(raw)), np.nan, np.float32)
    return run_kernel(g, mm, out, [raw, pq8(a)], nth, {"T": 1}, kernel=kern)[0]


def activation(rng, exps) -> np.ndarray:
    """One column whose block j has absmax exactly 2^exps[j]: every block's scale is 9 * 2^(exps[j] - 10)."""
    v = rng.standard_normal((K // 32, 32))
    v = v / np.abs(v).max(axis=1, keepdims=True) * np.exp2(np.asarray(exps, np.float64))[:, None]
    return v.astype(np.float32).reshape(1, K)


def spread_weights(t: int, rng, top: int, spreads) -> np.ndarray:
    """ROWS rows whose f16 scales (Q4_1: and mins) are powers of two in [2^(top - s), 2^top],
    s = spreads[r // 4] over each block of four rows: row 4i holds 2^top, row 4i + 3 2^(top - s)."""
    nb = K // WEIGHT_TYPES[t].block
    e = np.zeros((ROWS, nb), np.int64)
    least = np.repeat(top - np.asarray(spreads), 4)[:, None]
    for i, s in enumerate(spreads):
        e[4 * i:4 * i + 4] = top - rng.integers(0, s + 1, (4, nb))
        e[4 * i, 0], e[4 * i + 3, -1] = top, top - s
    sign = rng.choice([-1.0, 1.0], (ROWS, nb))
    d = np.exp2(e.astype(np.float64)) * sign
    mins = np.exp2(np.maximum(e - rng.integers(0, 2, e.shape), least).astype(np.float64)) if t == Q4_1 else None
    return weights(t, ROWS, K, rng, d=d, mins=mins)


def check(raw, t, x, monkeypatch, f64_rows) -> np.ndarray:
    """The kernel equals the spec; the marked kernel equals it on the four-row blocks in
    f64_rows (their f64 path was taken) and gives MARK on the others (the exact path)."""
    a = quant.quantize_act(x)
    want = quant.mul_mat(raw, t, a)[0]
    assert np.array_equal(bits(run(raw, t, a)), bits(want))
    if monkeypatch is None:
        return want
    marked = run(raw, t, a, monkeypatch)
    for blk in range(len(raw) // 4):
        rows = slice(4 * blk, 4 * blk + 4)
        if blk in f64_rows:
            assert np.array_equal(bits(marked[rows]), bits(want[rows])), f"rows {rows}: not the f64 path"
        else:
            assert np.all(marked[rows] == MARK), f"rows {rows}: not the exact path"
    return want


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_spread_at_the_limit_is_f64_one_past_is_exact(t, monkeypatch):
    """Activation spread 3 plus weight spread limit - 3 (over four rows: the largest scale in
    the first row, the least in the last) sums in f64; one more binade goes the exact way."""
    rng = np.random.default_rng(t)
    lim = limit(t)
    x = activation(rng, [0, -3, -1, 0, -2, -3, 0, -1])
    check(spread_weights(t, rng, 15, [lim - 3, lim - 2]), t, x, monkeypatch, f64_rows={0})
    check(spread_weights(t, rng, 15, [lim - 2, lim - 3]), t, x, monkeypatch, f64_rows={1})


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_below_2_pow_minus_126_is_exact_path(t, monkeypatch):
    """Group sums below the f32 normal range go the exact path (the spec flushes after
    rounding at an unbounded exponent); normal ones next to them stay f64."""
    rng = np.random.default_rng(10 + t)
    x = (rng.choice([-1.0, 1.0], (1, K)) * (1 + rng.random((1, K))) * 2.0 ** -126).astype(np.float32)
    raw = spread_weights(t, rng, -14, [2, 2])
    nb = K // WEIGHT_TYPES[t].block
    big = weights(t, ROWS, K, rng, d=np.full((ROWS, nb), 2.0 ** 15),
                  mins=np.full((ROWS, nb), 2.0 ** 14) if t == Q4_1 else None)
    raw[4:] = big[4:]
    want = check(raw, t, x, monkeypatch, f64_rows={1})
    assert np.all(np.abs(want[:4]) < 2.0 ** -126) and np.all(np.abs(want[4:]) >= 2.0 ** -126)


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_exact_zero_is_plus_zero(t, monkeypatch):
    """A zero activation against negative scales: every term -0 in f64; the result is +0."""
    rng = np.random.default_rng(20 + t)
    nb = K // WEIGHT_TYPES[t].block
    raw = weights(t, ROWS, K, rng, d=np.full((ROWS, nb), -0.5), mins=np.full((ROWS, nb), -0.25) if t == Q4_1 else None)
    want = check(raw, t, np.zeros((1, K), np.float32), monkeypatch, f64_rows={0, 1})
    assert np.all(bits(want) == 0)


@pytest.mark.parametrize("t", [Q8_0, Q4_1], ids=["Q8_0", "Q4_1"])
def test_cancellation_and_overflow_in_f64(t, monkeypatch):
    """Sub-blocks 0 and 1 cancel exactly (the small rest decides), and sums past 2^128 round to
    +-inf, both on the f64 path."""
    rng = np.random.default_rng(30 + t)
    raw = spread_weights(t, rng, 15, [4, 4])
    blocks = raw.reshape(ROWS, -1, WEIGHT_TYPES[t].block_bytes)
    blocks[:, 1] = blocks[:, 0]
    x = activation(rng, [0, 0, -11, -11, -11, -11, -11, -11])
    x[0, 32:64] = -x[0, 0:32]
    want = check(raw, t, x, monkeypatch, f64_rows={0, 1})
    alone = quant.mul_mat(raw, t, quant.quantize_act(np.where(np.arange(K) < 32, x, 0).astype(np.float32)))[0]
    assert np.all(np.abs(want) < np.abs(alone) / 8)                 # the big sub-blocks are gone
    x = activation(rng, [120, 118, 119, 120, 117, 120, 116, 118])
    raw = spread_weights(t, rng, 10, [3, 3])
    raw[4:] = spread_weights(t, rng, -2, [3, 3])[4:]
    want = check(raw, t, x, monkeypatch, f64_rows={0, 1})
    assert np.isinf(want[:4]).all() and np.isfinite(want[4:]).all() and np.abs(want[4:]).max() > 2.0 ** 122


def test_q1_0_activation_spread_at_the_i32_bound(monkeypatch):
    """Q1_0 sums a weight block's four dots, shifted to the group's least activation exponent,
    in i32: an activation spread of I32_SPREAD takes the f64 path, one more the exact path."""
    rng = np.random.default_rng(40)
    raw = spread_weights(Q1_0, rng, 0, [1, 1])
    s = pf.I32_SPREAD
    big = (np.sign(rng.standard_normal((1, K))) * 127 * 2.0 ** -7).astype(np.float32)   # codes +-127: the largest dots
    for spread, f64_rows in ((s, {0, 1}), (s + 1, set())):
        x = activation(rng, [0, -spread, 0, 0, -1, -spread, 0, 0])
        x[:, :32] = big[:, :32]
        check(raw, Q1_0, x, monkeypatch, f64_rows=f64_rows)


@pytest.mark.parametrize("t", [Q4_1, Q2_0, Q1_0], ids=["Q4_1", "Q2_0", "Q1_0"])
def test_largest_dots(t, monkeypatch):
    """Every weight code at its largest (Q4_1 15, Q2_0 3, Q1_0 bit set) against codes of +-127
    of one sign: the largest sub-block dots (Q1_0, Q2_0: lane_sums16's i16 partial sums at their bound)."""
    rng = np.random.default_rng(50 + t)
    raw = spread_weights(t, rng, 0, [2, 2])
    wt = WEIGHT_TYPES[t]
    blocks = raw.reshape(ROWS, -1, wt.block_bytes)
    blocks[:, :, 4 if t == Q4_1 else 2:] = 0xFF
    for sign in (1, -1):
        x = np.full((1, K), sign * 127 * 2.0 ** -7, np.float32)
        check(raw, t, x, monkeypatch, f64_rows={0, 1})


@pytest.mark.parametrize("t", [Q8_0, Q4_1, Q2_0], ids=["Q8_0", "Q4_1", "Q2_0"])
def test_last_group_of_one_or_two_sub_blocks(t, monkeypatch):
    """A last group of 32 or 64 values (K = 288, 320, 576, 64; tail4: the four rows' sub-blocks
    in one vector), 4k + 3 rows (the last three by the one-row path); a wide last group goes
    the exact way, the full groups before it stay f64."""
    rng = np.random.default_rng(60 + t)
    for k in (288, 320, 576, 64):
        if k % WEIGHT_TYPES[t].block:
            continue
        raw = weights(t, 11, k, rng)
        x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
        check(raw, t, x, None, None)
        x[0, -32:] *= np.float32(2.0 ** -40)                   # the last group's spread past every limit
        a = quant.quantize_act(x)
        want = quant.mul_mat(raw, t, a)[0]
        assert np.array_equal(bits(run(raw, t, a)), bits(want))
        marked = run(raw[:8], t, a, monkeypatch)
        if k % 256 == 32:                                       # one sub-block: no spread, f64
            assert np.array_equal(bits(marked), bits(want[:8]))
            continue
        xf = np.where(np.arange(k) < k // 256 * 256, x, 0).astype(np.float32)
        y_full = quant.mul_mat(raw[:8], t, quant.quantize_act(xf))[0]
        assert np.array_equal(bits(marked), bits(arith.add(y_full, MARK)))


@pytest.mark.parametrize("t", [Q8_0, Q4_1], ids=["Q8_0", "Q4_1"])
def test_last_group_of_three_to_seven_sub_blocks(t, monkeypatch):
    """A last group of 3..7 sub-blocks (K = 352 .. 480; Q4_1: an odd count leaves its last
    pair half empty, pair_codes' zero half) on the f64 path (the marked kernel equals the
    spec on every four rows), 4k + 3 rows; Q4_1 also at its largest dots (codes 15 against +-127)."""
    rng = np.random.default_rng(70 + t)
    for n in range(3, 8):
        k = 256 + 32 * n
        raw = weights(t, 11, k, rng)
        check(raw, t, (rng.standard_normal((1, k)) * 3).astype(np.float32), None, None)
        x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
        a = quant.quantize_act(x)
        assert np.array_equal(bits(run(raw[:8], t, a, monkeypatch)), bits(quant.mul_mat(raw[:8], t, a)[0]))
        if t == Q4_1:
            raw[:, :].reshape(11, -1, 20)[:, :, 4:] = 0xFF
            for sign in (1, -1):
                a = quant.quantize_act(np.full((1, k), sign * 127 * 2.0 ** -7, np.float32))
                want = quant.mul_mat(raw[:8], t, a)[0]
                assert np.array_equal(bits(run(raw[:8], t, a, monkeypatch)), bits(want))
