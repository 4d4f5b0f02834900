"""The portable Q1_0 decode mat-vec by table lookups (backends/llvm/portable/q1_lut.py) gives the numpy
spec's bits (bankml/profiles/portable/quant.py: mul_mat): 1, 2 and 3 threads, K from one group
plus a last group of one 128-block to 6,144, row counts that are not a multiple of 16 (the last
rows take the four-row and one-row paths). A kernel whose exact path writes a marker instead
shows which path each row's group took: exponent spreads at and one past pf.limit,
activation spreads at and one past I32_SPREAD, inf/NaN weight scales, bad activation blocks,
results below 2^-126 (exact path), zero blocks and exact zeros (f64)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).parent))
from test_llvm_portable_f64 import MARK, run as run_decode  # noqa: E402
from test_llvm_portable_matmul import _graph, bits, weights  # noqa: E402

from bankml.backends.llvm.portable import matmul as kpm, f64 as pf  # noqa: E402
from bankml.backends.llvm import registry
from bankml.backends.llvm.portable.q1_lut import ROWS  # noqa: E402
from bankml.profiles.portable import quant  # noqa: E402
from bankml.quants import Q1_0  # noqa: E402

THREADS = (1, 2, 3)
LIMIT = pf.limit(kpm.TERM_BITS[Q1_0], 8)
SHAPES = [(2048, 37), (6144, 50), (640, 45), (384, 16), (2048, 15), (128, 21)]


def run(raw: np.ndarray, x: np.ndarray, nth: int, marked=None) -> np.ndarray:
    """The decode kernel's result for one column x; marked (a monkeypatch): its exact path gives MARK."""
    return run_decode(raw, Q1_0, quant.quantize_act(x), marked, nth)


def check(raw: np.ndarray, x: np.ndarray, threads=THREADS) -> np.ndarray:
    want = quant.mul_mat(raw, Q1_0, quant.quantize_act(x))[0]
    for nth in threads:
        got = run(raw, x, nth)
        assert np.array_equal(bits(got), bits(want)), f"nth={nth}: rows {np.flatnonzero(bits(got) != bits(want))}"
    return want


def check_paths(raw: np.ndarray, x: np.ndarray, exact_rows, monkeypatch) -> np.ndarray:
    """One group (K = 256): the kernel equals the spec; the marked kernel equals it on every row
    but exact_rows (the f64 path) and gives MARK on those (the exact path)."""
    want = check(raw, x, threads=(1, 3))
    marked = run(raw, x, 1, monkeypatch)
    f64 = np.setdiff1d(np.arange(len(raw)), exact_rows)
    assert np.array_equal(bits(marked[f64]), bits(want[f64])), "not the f64 path"
    assert np.all(marked[exact_rows] == MARK), "not the exact path"
    return want


def activation(rng, exps) -> np.ndarray:
    """One column of 256 whose block j has absmax exactly 2^exps[j]: its scale is 9 * 2^(exps[j] - 10)."""
    v = rng.standard_normal((8, 32))
    v = v / np.abs(v).max(axis=1, keepdims=True) * np.exp2(np.asarray(exps, np.float64))[:, None]
    return v.astype(np.float32).reshape(1, 256)


def scales(rows: int, top: int, spreads) -> np.ndarray:
    """[rows, 2] f16 scales of one group: row r's blocks 2^top and -2^(top - spreads[r])."""
    s = np.asarray(spreads, np.float64)
    return np.stack([np.full(rows, 2.0 ** top), -np.exp2(top - s)], axis=1)


@pytest.mark.parametrize("k,n", SHAPES, ids=[f"K{k}-N{n}" for k, n in SHAPES])
def test_lookup_matvec_bits_equal_spec(k, n):
    rng = np.random.default_rng(k + n)
    x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    x[0, 32:64] = 0                                            # an all-zero block
    x[0, 64:96] = rng.choice([-127.0, 127.0], 32)             # codes +-127: table sums of +-508
    x[0, 96:128] = 127.0
    raw = weights(Q1_0, n, k, rng)
    raw.reshape(n, -1, 18)[3, 0, 2:] = 0xFF                   # all bits set / clear: dots of +-32 * 127
    raw.reshape(n, -1, 18)[4, 0, 2:] = 0
    raw.reshape(n, -1, 18)[5, -1, :2] = 0                     # a zero scale
    check(raw, x)


def test_decode_kernel_uses_the_lookup_tiles():
    g, _, mm, _ = _graph(Q1_0, 2048, 1, 4 * ROWS)
    text = str(registry.define(ir.Module(name="t"), g, mm).module)
    assert "act.lut" in text and "acc16" in text


def test_weight_spread_at_the_limit_is_f64_one_past_is_exact(monkeypatch):
    """Activation spread 3 plus a row's weight spread LIMIT - 3 sums in f64; LIMIT - 2 goes the
    exact way, row by row (even rows at the limit, odd rows past it)."""
    rng = np.random.default_rng(1)
    x = activation(rng, [0, -3, -1, 0, -2, -3, 0, -1])
    n = 2 * ROWS
    raw = weights(Q1_0, n, 256, rng, d=scales(n, 15, [LIMIT - 3 + (r % 2) for r in range(n)]))
    check_paths(raw, x, np.arange(1, n, 2), monkeypatch)


@pytest.mark.parametrize("spread", [pf.I32_SPREAD, pf.I32_SPREAD + 1])
def test_activation_spread_at_the_i32_bound(spread, monkeypatch):
    """Codes of +-127 (the largest dots) at an activation spread of I32_SPREAD take the f64 path,
    one more the exact path, every row."""
    rng = np.random.default_rng(2)
    x = (np.sign(rng.standard_normal((1, 256))) * 127 * 2.0 ** -7).astype(np.float32)
    x[0, 224:] *= np.float32(2.0 ** -spread)
    raw = weights(Q1_0, ROWS, 256, rng, d=scales(ROWS, 0, [1] * ROWS))
    raw.reshape(ROWS, -1, 18)[:8, :, 2:] = 0xFF              # dots of 32 * 127 in eight rows
    exact = np.arange(ROWS) if spread > pf.I32_SPREAD else np.arange(0)
    check_paths(raw, x, exact, monkeypatch)


def test_inf_nan_scales_and_bad_blocks_are_exact_path(monkeypatch):
    """A row with an inf or NaN scale is NaN by the exact path, its neighbours f64; a bad
    activation block sends every row of its group the exact way (all NaN)."""
    rng = np.random.default_rng(3)
    d = scales(ROWS, 0, [2] * ROWS)
    d[2, 0], d[7, 1], d[11, 0] = np.inf, -np.inf, np.nan
    raw = weights(Q1_0, ROWS, 256, rng, d=d)
    x = activation(rng, [0, -1, 0, -2, 0, -1, 0, 0])
    want = check_paths(raw, x, [2, 7, 11], monkeypatch)
    assert np.isnan(want[[2, 7, 11]]).all() and np.isfinite(np.delete(want, [2, 7, 11])).all()
    x[0, 100] = np.nan
    want = check_paths(raw, x, np.arange(ROWS), monkeypatch)
    assert np.isnan(want).all()
    big = rng.standard_normal((1, 6144)).astype(np.float32)
    big[0, 3000] = np.inf                                      # one bad group among 24, many rows
    check(weights(Q1_0, 40, 6144, rng), big)


def test_below_2_pow_minus_126_is_exact_path(monkeypatch):
    """Row results below the f32 normal range go the exact path (the spec flushes after rounding
    at an unbounded exponent); normal rows next to them stay f64."""
    rng = np.random.default_rng(4)
    x = (rng.choice([-1.0, 1.0], (1, 256)) * (1 + rng.random((1, 256))) * 2.0 ** -126).astype(np.float32)
    d = scales(ROWS, -14, [2] * ROWS)
    d[::2] = scales(ROWS, 15, [2] * ROWS)[::2]
    raw = weights(Q1_0, ROWS, 256, rng, d=d)
    want = check_paths(raw, x, np.arange(1, ROWS, 2), monkeypatch)
    assert np.all(np.abs(want[1::2]) < 2.0 ** -126) and np.all(np.abs(want[::2]) >= 2.0 ** -126)


def test_zero_column_is_plus_zero_on_the_f64_path(monkeypatch):
    """A zero activation against negative scales: every term -0 in f64; the result is +0."""
    rng = np.random.default_rng(5)
    raw = weights(Q1_0, ROWS, 256, rng, d=np.full((ROWS, 2), -0.5))
    want = check_paths(raw, np.zeros((1, 256), np.float32), np.arange(0), monkeypatch)
    assert np.all(bits(want) == 0)
