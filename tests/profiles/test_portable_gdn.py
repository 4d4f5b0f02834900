"""The Gated-DeltaNet functions of the decode-arithmetic document (bankml/profiles/portable/gdn.py):
each rule the document states, and the claims it makes between them (a flush is the token-by-token
memory bit for bit; a trailing fold is two plain folds bit for bit; a folded read is the memory's
read-out up to rounding)."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.profiles.portable import funcs, gdn
from bankml.profiles.portable.arith import F32, add, fdot, mul, sub

U32 = np.uint32


def bits(x) -> list:
    return np.asarray(x, F32).view(U32).tolist()


def f16(x):
    return np.asarray(x, F32).astype(np.float16).astype(F32)


def log_of(rng, n, s_k=16, s_v=8):
    return [gdn.Logged(rng.standard_normal(s_k).astype(F32) * F32(0.25), rng.standard_normal(s_v).astype(F32),
                       F32(-abs(rng.standard_normal()) * 0.3), F32(rng.uniform(0.05, 0.9))) for _ in range(n)]


def test_conv_pairs_the_oldest_ring_row_with_the_first_tap_and_the_token_with_the_last():
    ring = np.array([[5, 0.5], [6, 0.25], [7, 0.125]], F32)       # 3 rows for 4 taps, oldest first
    x = np.array([8, 1], F32)
    kernel = np.array([[1, 0, 0, 0], [0, 0, 0, 1]], F32)
    assert bits(gdn.conv(ring, x, kernel)) == bits(funcs.silu(np.array([5, 1], F32)))


def test_conv_sums_in_tap_order_from_plus_zero():
    ring = np.array([[1e8, -0.0], [-1e8, -0.0], [1, -0.0]], F32)
    x = np.array([1, -0.0], F32)
    kernel = np.ones((2, 4), F32)
    # in tap order: 1e8 - 1e8 is 0, + 1 + 1 is 2; newest first, or the token first, 1 - 1e8 and
    # 1 + 1e8 round the 1 away (1 instead of 2). Products all -0: +0 + -0 is +0, where a sum
    # from -0 would stay -0
    assert bits(gdn.conv(ring, x, kernel)) == bits(funcs.silu(np.array([2, 0.0], F32)))
    assert bits(gdn.conv(ring[::-1].copy(), x, kernel)[0]) == bits(funcs.silu(F32(1)))
    with pytest.raises(ValueError, match="needs 3"):
        gdn.conv(ring[:2], x, kernel)


def test_gdn_update_is_the_rank_one_delta_rule_through_store():
    row = np.array([3, -2, 5, 1], F32)
    k = np.array([0, 1, 0, 0], F32)
    coef = gdn.gdn_update(row, k, F32(7), F32(1), F32(1))      # decay 1, beta 1, k a unit key: row.k becomes v
    assert coef == F32(9) and row.tolist() == [3, 7, 5, 1]
    rng = np.random.default_rng(3)
    row, k = rng.standard_normal(64).astype(F32), rng.standard_normal(64).astype(F32)
    v, decay, beta = F32(0.7), F32(0.9), F32(0.3)
    want_coef = mul(beta, sub(v, mul(decay, fdot(row, k))))
    want = add(mul(decay, row), mul(want_coef, k))
    got = row.copy()
    assert bits(gdn.gdn_update(got, k, v, decay, beta)) == bits(want_coef) and bits(got) == bits(want)
    got = row.copy()
    gdn.gdn_update(got, k, v, decay, beta, store=f16)
    assert bits(got) == bits(f16(want))


def test_gdn_row_reads_the_row_as_it_was_and_updates_it_as_gdn_update_does():
    rng = np.random.default_rng(4)
    row, k, q = (rng.standard_normal(128).astype(F32) for _ in range(3))
    v, decay, beta, scale = F32(-0.4), F32(0.8), F32(0.6), F32(0.125)
    kq = fdot(k, q)
    a, b = row.copy(), row.copy()
    out = gdn.gdn_row(a, k, q, v, decay, beta, kq, scale, store=f16)
    coef = gdn.gdn_update(b, k, v, decay, beta, store=f16)
    assert bits(a) == bits(b)
    assert bits(out) == bits(mul(add(mul(decay, fdot(row, q)), mul(coef, kq)), scale))
    # the read-out of the row as it was is the updated row's read-out, up to rounding (f32 store)
    c = row.copy()
    out = gdn.gdn_row(c, k, q, v, decay, beta, kq, scale)
    assert abs(float(out) - float(c.astype(np.float64) @ q * scale)) < 1e-4


def test_gdn_flush_is_the_token_by_token_memory_bit_for_bit():
    rng = np.random.default_rng(5)
    log = log_of(rng, 9)
    for store in (None, f16):
        for r in range(8):
            row = rng.standard_normal(16).astype(F32)
            want = row.copy()
            for tok in log:
                gdn.gdn_update(want, tok.key, tok.values[r], F32(funcs.exp(tok.g)), tok.beta, store)
            got = row.copy()
            gdn.gdn_flush(got, log, r, store)
            assert bits(got) == bits(want)
            split = row.copy()
            gdn.gdn_flush(split, log[:4], r, store)
            gdn.gdn_flush(split, log[4:], r, store)
            assert bits(split) == bits(want)


def test_a_folded_read_is_the_token_by_token_read_out_up_to_rounding():
    rng = np.random.default_rng(6)
    log = log_of(rng, 12)
    q = rng.standard_normal(16).astype(F32)
    rows = rng.standard_normal((8, 16)).astype(F32) * F32(0.5)
    y, carried = gdn.gdn_fold(log, q, 8)
    mem = rows.copy()
    for r in range(8):
        for tok in log:
            gdn.gdn_update(mem[r], tok.key, tok.values[r], tok.decay, tok.beta)
    for r in range(8):
        lazy = gdn.gdn_read(rows[r], y, carried[r], F32(0.25))
        eager = float(mem[r].astype(np.float64) @ q * 0.25)
        assert abs(float(lazy) - eager) < 1e-5 * max(1.0, abs(eager))
        assert bits(lazy) == bits(mul(add(fdot(rows[r], y), carried[r]), F32(0.25)))


def test_gdn_fold_walks_newest_first():
    rng = np.random.default_rng(7)
    log = log_of(rng, 3)
    q = rng.standard_normal(16).astype(F32)
    y, carried = q.copy(), np.zeros(8, F32)
    for tok in reversed(log):
        coef = mul(tok.beta, fdot(tok.key, y))
        carried = add(carried, mul(coef, tok.values))
        y = mul(tok.decay, sub(y, mul(coef, tok.key)))
    got_y, got_c = gdn.gdn_fold(log, q, 8)
    assert bits(got_y) == bits(y) and bits(got_c) == bits(carried)
    empty_y, empty_c = gdn.gdn_fold([], q, 8)
    assert bits(empty_y) == bits(q) and bits(empty_c) == [0] * 8


@pytest.mark.parametrize("older", [0, 1, 5, 10])
def test_a_trailing_fold_is_the_fold_of_the_newer_tokens_then_of_all_bit_for_bit(older):
    rng = np.random.default_rng(8 + older)
    log = log_of(rng, 10)
    q = rng.standard_normal(16).astype(F32)
    (ny, nc), (wy, wc) = gdn.gdn_fold_trailing(log, q, 8, older)
    want_ny, want_nc = gdn.gdn_fold(log[older:], q, 8)
    want_wy, want_wc = gdn.gdn_fold(log, q, 8)
    assert bits(ny) == bits(want_ny) and bits(nc) == bits(want_nc)
    assert bits(wy) == bits(want_wy) and bits(wc) == bits(want_wc)
    with pytest.raises(ValueError):
        gdn.gdn_fold_trailing(log, q, 8, 11)


def test_logged_decay_is_exp_of_its_exponent():
    tok = gdn.Logged(np.zeros(4, F32), np.zeros(4, F32), F32(-0.37), F32(0.5))
    assert bits(tok.decay) == bits(funcs.exp(F32(-0.37)))


def test_stacked_rows_are_each_updated_and_read_as_alone():
    """gdn_update and gdn_row over a stack of rows (the state's value rows at once) give each row,
    coef and read-out the bits of the row alone."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((6, 16)).astype(F32)
    k, q = rng.standard_normal(16).astype(F32), rng.standard_normal(16).astype(F32)
    v = rng.standard_normal(6).astype(F32)
    decay, beta, kq, scale = F32(0.8), F32(0.4), F32(fdot(k, q)), F32(0.25)
    alone = rows.copy()
    want = [gdn.gdn_row(alone[r], k, q, v[r], decay, beta, kq, scale) for r in range(6)]
    stacked = rows.copy()
    assert bits(gdn.gdn_row(stacked, k, q, v, decay, beta, kq, scale)) == bits(want)
    assert bits(stacked) == bits(alone)


def test_conv_is_silu_of_conv_sum():
    rng = np.random.default_rng(8)
    ring, x, kern = rng.standard_normal((3, 12)).astype(F32), rng.standard_normal(12).astype(F32), \
        rng.standard_normal((12, 4)).astype(F32)
    assert bits(gdn.conv(ring, x, kern)) == bits(funcs.silu(gdn.conv_sum(ring, x, kern)))
