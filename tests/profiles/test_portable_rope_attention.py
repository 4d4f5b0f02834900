"""The portable rope table and the int8-cache attention."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from bankml.profiles.portable import attention, rotary
from bankml.profiles.portable.arith import add, mul, sub
from bankml.profiles.portable.tables import rope_turns

F32 = np.float32


@pytest.mark.parametrize("n_dims,base", [(64, 10000.0), (128, 1e6)])
def test_rope_table_angle_is_exact_in_turns_so_its_error_does_not_grow_with_position(n_dims, base):
    pos = np.concatenate([np.arange(64), np.arange(4096, 131072, 4093)])
    cos, sin = rotary.rope_table(pos, n_dims, base, 1.0)
    t = rope_turns(n_dims, base, 1.0).astype(np.float64)        # the f32 turn rates, read exactly
    frac = np.array([[float((int(p) * Fraction(float(ti))) % 1) for ti in t] for p in pos])
    assert np.abs(cos - np.cos(2 * np.pi * frac)).max() < 4e-7
    assert np.abs(sin - np.sin(2 * np.pi * frac)).max() < 4e-7
    assert cos[0].tolist() == [1.0] * (n_dims // 2) and sin[0].tolist() == [0.0] * (n_dims // 2)


@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_rope_pairs_and_rotation_order(mode):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 8)).astype(F32)
    cos, sin = rotary.rope_table(np.array([0, 5, 900]), 8, 10000.0, 1.0)
    y = rotary.rope(x, cos, sin, mode)
    pairs = [(2 * i, 2 * i + 1) for i in range(4)] if mode == "norm" else [(i, i + 4) for i in range(4)]
    for i, (a, b) in enumerate(pairs):
        c, s = cos[:, None, i], sin[:, None, i]
        assert np.array_equal(y[..., a], sub(mul(x[..., a], c), mul(x[..., b], s)))
        assert np.array_equal(y[..., b], add(mul(x[..., a], s), mul(x[..., b], c)))


def test_cache_rows_hold_an_f16_scale_and_codes_within_127():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((10, 2, 64)).astype(F32) * 3
    x[0, 0] = 0
    rows = attention.cache_row(x)
    assert rows["d"][0, 0] == 0 and not rows["qs"][0, 0].any()
    amax = np.abs(x).max(-1)
    assert np.array_equal(rows["d"], (amax * F32(1 / 127)).astype(F32).astype(np.float16))
    assert np.abs(rows["qs"].astype(int)).max() == 127
    err = np.abs(attention.dequantize_rows(rows) - x).max(-1)
    assert np.all(err <= rows["d"].astype(np.float64) * 0.5 * 1.01 + 1e-30)


def test_int8_codes_round_ties_to_even_clamp_and_zero_a_nan_product_or_an_infinite_inverse():
    x = np.array([2.5, 3.5, -2.5, -0.5, 0.5, 1.5, 200.0, -1e30, np.inf, -np.inf, np.nan, 1e-40], F32)
    want = [2, 4, -2, 0, 0, 2, 127, -127, 127, -127, 0, 0]
    assert attention.int8_codes(x, F32(1)).tolist() == want
    assert attention.int8_codes(x, F32(0)).tolist() == [0] * 10 + [0, 0]      # inf * 0: a NaN product
    assert not attention.int8_codes(x, F32(np.inf)).any()
    assert not attention.int8_codes(x, F32(-np.inf)).any()


def test_cache_row_codes_are_the_product_with_the_reciprocal_not_a_quotient():
    """x = s·(k + 1/2) exactly: a quotient is the tie, rounded to even; the document multiplies by
    recip(s), whose rounding lands either side of the tie: the codes must follow the product."""
    from bankml.profiles.portable.funcs import recip
    s = (np.arange(1, 3000, dtype=np.float32) * F32(0.013)).astype(np.float16).astype(F32)
    s = np.unique(s)
    k = np.arange(0, 126, dtype=np.float32)
    x = (s[:, None] * (k[None] + F32(0.5))).astype(F32)
    exact = x.astype(np.float64) == s[:, None].astype(np.float64) * (k[None] + 0.5)
    by_quotient = np.rint(x.astype(np.float64) / s[:, None])
    by_product = attention.int8_codes(x, recip(s)[:, None])
    assert np.any(exact & (by_quotient != by_product))                 # the two readings differ here
    row = np.zeros((1, 128), F32)
    i, j = np.argwhere(exact & (by_quotient != by_product))[0]
    row[0, 0], row[0, 1] = s[i] * F32(127), x[i, j]                       # amax 127·s: scale s exactly
    r = attention.cache_row(row)
    assert r["d"][0].astype(F32) == s[i] and r["qs"][0, 1] == by_product[i, j] != by_quotient[i, j]


def test_cache_row_passes_a_nan_over_and_zeroes_rows_whose_scale_rounds_to_zero_or_overflows():
    x = np.array([[1.0, np.nan, -127.0, 64.0], [1e-9, -2e-9, 0, 0], [1.0, np.inf, 2.0, 0], [1e8, 1, 2, 3]], F32)
    r = attention.cache_row(x)
    assert r["d"][0] == np.float16(1) and r["qs"][0].tolist() == [1, 0, -127, 64]
    assert r["d"][1] == 0 and not r["qs"][1].any()                          # f16(amax/127) is 0
    assert np.isinf(r["d"][2]) and not r["qs"][2].any()                     # recip(inf) = 0: x·0
    assert np.isinf(r["d"][3]) and not r["qs"][3].any()                     # past f16's top


@pytest.mark.parametrize("n", [1, 7, 8, 41])
def test_attend_vector_is_scores_softmax_and_value_dots_lanes_by_position(n):
    """attend_vector written out step by step: score_j = fdot(q, k_j)·scale (lanes by element),
    p = softmax, out_d = Σ_j p_j·v_jd with position j in lane j mod 8, from -0, then the tree."""
    from bankml.profiles.portable import arith, funcs
    rng = np.random.default_rng(n)
    D = 64
    q, k, v = (rng.standard_normal(s).astype(F32) for s in ((D,), (n, D), (n, D)))
    got = attention.attend_vector(q, k, v, 0.125)
    s = np.array([arith.mul(arith.fdot(k[j], q), F32(0.125)) for j in range(n)], F32)
    p = funcs.softmax(s)
    lanes = np.full((8, D), -0.0, F32)
    for j in range(n):
        lanes[j % 8] = add(lanes[j % 8], mul(p[j], v[j]))
    want = arith.tree(np.swapaxes(lanes, 0, 1))
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    e = np.exp(s.astype(np.float64) - s.max())
    ref = (e / e.sum()) @ v.astype(np.float64)
    assert np.abs(got - ref).max() < 1e-5


def _setup(M=3, H=4, Hkv=2, D=64, n_kv=256, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((M, H, D)).astype(F32)
    k = attention.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    v = attention.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    used = 40
    mask = np.where(np.arange(n_kv)[None] <= np.arange(used - M, used)[:, None], 0, -np.inf).astype(np.float16)
    return q, k, v, mask


def test_attention_of_a_head_is_that_head_alone_and_masked_cells_never_count():
    q, k, v, mask = _setup()
    out = attention.attention(q, k, v, mask, 0.125)
    one = attention.attention(q[:, 3:4], k[:, 1:2], v[:, 1:2], mask, 0.125)   # head 3 reads K/V head 1
    assert np.array_equal(out[:, 3:4].view(np.uint32), one.view(np.uint32))
    k2, v2 = k.copy(), v.copy()
    k2["qs"][40:], v2["qs"][40:], k2["d"][40:] = 99, -7, 3.0                       # masked for every row
    assert np.array_equal(out.view(np.uint32), attention.attention(q, k2, v2, mask, 0.125).view(np.uint32))


def test_attention_rows_are_independent_of_the_other_rows():
    q, k, v, mask = _setup()
    out = attention.attention(q, k, v, mask, 0.125)
    for m in range(3):
        row = attention.attention(q[m:m + 1], k, v, mask[m:m + 1], 0.125)
        assert np.array_equal(out[m:m + 1].view(np.uint32), row.view(np.uint32))


def test_attention_is_close_to_float64_softmax_of_the_cached_values():
    q, k, v, mask = _setup(seed=3)
    out = attention.attention(q, k, v, mask, 0.125)
    kd, vd = attention.dequantize_rows(k).astype(np.float64), attention.dequantize_rows(v).astype(np.float64)
    ref = np.zeros(out.shape)
    for m in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = kd[:, h // 2] @ q[m, h] * 0.125 + mask[m].astype(np.float64)
            p = np.exp(s - s.max())
            ref[m, h] = (p / p.sum()) @ vd[:, h // 2]
    assert np.abs(out - ref).max() < 0.05                  # 8-bit q codes and 8-bit value weights


@pytest.mark.parametrize("scaling", ["SUB32", "PER_BLOCK"])
def test_attention_is_attend_int8_over_each_rows_live_cells(scaling):
    """attention.attention of a causal row is the document's attend_int8 over the row's positions
    (its live cells), head by head, bit for bit, under either ActScaling (PerBlock: each head one
    block, heads of very different sizes); masked cells with NaN or infinite K/V scales (a stale
    cell) change nothing."""
    from bankml.profiles.portable.quant import ActScaling
    sc = ActScaling[scaling]
    q, k, v, mask = _setup(M=4, D=64, n_kv=96, seed=5)
    q[1] *= np.float32(2.0 ** 40)
    q[2, :, :32] *= np.float32(2.0 ** -30)
    mask = np.where(np.arange(96)[None] <= np.array([0, 31, 32, 70])[:, None], 0, -np.inf).astype(np.float16)
    k["d"][80:], v["d"][80:] = np.inf, np.nan                                   # never live
    out = attention.attention(q, k, v, mask, 0.125, sc)
    for m, last in enumerate([0, 31, 32, 70]):
        for h in range(4):
            want = attention.attend_int8(q[m, h], k[:last + 1, h // 2], v[:last + 1, h // 2], 0.125, scaling=sc)
            assert out[m, h].view(np.uint32).tolist() == want.view(np.uint32).tolist(), (m, h)


def test_quantize_head_pads_to_a_group_or_takes_the_head_as_one_block():
    from bankml.profiles.portable.quant import ActScaling, quantize_act, quantize_blocks
    x = np.random.default_rng(1).standard_normal(64).astype(F32)
    a = attention.quantize_head(x)
    assert a.q.shape == (256,) and not a.q[64:].any() and not a.m[2:].any()
    assert np.array_equal(a.q[:64], quantize_act(x).q) and np.array_equal(a.m[:2], quantize_act(x).m)
    b = attention.quantize_head(x, ActScaling.PER_BLOCK)
    assert b.m.shape == (1,) and 128 <= b.m[0] <= 255
    assert np.array_equal(b.q, quantize_blocks(x, 64).q)


@pytest.mark.parametrize("scaling", ["SUB32", "PER_BLOCK"])
def test_int8_score_is_the_exact_sum_of_block_terms_rounded_once(scaling):
    from bankml.profiles.portable.quant import ActScaling
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(128) * np.repeat([1e-3, 1.0, 30.0, 1e4], 32)).astype(F32)
    row = attention.cache_row(rng.standard_normal(128).astype(F32))
    qh = attention.quantize_head(x, ActScaling[scaling])
    blk = 128 // len(qh.m) if scaling == "PER_BLOCK" else 32
    kd = Fraction(float(row["d"]))
    exact = sum(Fraction(int(qh.m[b])) * Fraction(2) ** int(qh.e[b]) * kd *
                sum(int(qh.q[i]) * int(row["qs"][i]) for i in range(b * blk, min(b * blk + blk, 128)))
                for b in range(len(qh.m)))
    assert attention.int8_score(qh, row) == F32(float(exact))          # f32(f64(exact)): no double rounding here
    bad = row.copy()
    bad["d"] = np.inf
    assert np.isnan(attention.int8_score(qh, bad))


def test_weighted_int8_blocks_round_once_zeros_are_positive_and_blocks_add_in_order():
    rng = np.random.default_rng(3)
    v = attention.cache_row(rng.standard_normal((70, 64)).astype(F32))
    v["qs"][:, 5] = 0                                    # an element every row holds as 0: +0, not -0
    p = rng.random(70).astype(F32)
    got = attention.weighted_int8(p, v)
    assert got[5].view(np.uint32) == 0
    want = None
    for b0 in range(0, 70, attention.VALUE_BLOCK):
        w = [Fraction(float(mul(p[j], F32(v["d"][j])))) for j in range(b0, min(b0 + 32, 70))]
        amax = max(abs(x) for x in w)
        E = -200
        while 127 * Fraction(2) ** E < amax:
            E += 1
        W = [round(x / Fraction(2) ** E) for x in w]                     # exact quotients: no ties arise
        r = np.array([float(Fraction(2) ** E * sum(Wj * int(v["qs"][b0 + j][d]) for j, Wj in enumerate(W)))
                      for d in range(64)]).astype(F32)
        want = r if want is None else add(want, r)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert attention.weighted_int8(np.zeros(0, F32), v[:0]).view(np.uint32).tolist() == [0x80000000] * 64
    big = v.copy()
    big["d"][40] = np.inf                                # w infinite: no power of two holds it
    assert np.isneginf(attention.weighted_int8(p, big)).all()


def test_attention_row_with_no_live_cell_is_negative_zero_and_a_live_row_of_minus_inf_is_nan():
    q, k, v, mask = _setup(M=2, n_kv=64)
    mask[0] = -np.inf
    out = attention.attention(q, k, v, mask, 0.125)
    assert (out[0].view(np.uint32) == 0x80000000).all()
    q2 = q.copy()
    q2[1] = np.float32(3e38)
    k2 = k.copy()
    k2["d"][:] = np.float16(60000.0)
    k2["qs"][:] = -127                                   # every live score overflows to -inf
    assert np.isnan(attention.attention(q2, k2, v, mask, 1.0)[1]).all()
