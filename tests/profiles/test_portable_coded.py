"""Coded rows (the document's Scale, Segment, CodedRow, COEF_BOUND), K-quants included, and
their dot under Sub32 and PerBlock against exact rationals."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from bankml.profiles.portable import arith, coded, quant
from bankml.profiles.portable.tables import to_f32
from bankml.quants import Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES, q4_k, q6_k

F32 = np.float32
K = 512


def _kquant_raw(wtype: int, rows: int, rng) -> np.ndarray:
    mod = {Q4_K: q4_k, Q6_K: q6_k}[wtype]
    b = np.zeros((rows, K // 256), mod.DTYPE)
    raw = b.view(np.uint8).reshape(rows, -1)
    raw[:] = rng.integers(0, 256, raw.shape)
    b = raw.view(mod.DTYPE).reshape(rows, -1)
    b["d"] = (rng.standard_normal(b.shape) * np.exp2(rng.integers(-12, 0, b.shape))).astype(np.float16)
    if wtype == Q4_K:
        b["dmin"] = (rng.standard_normal(b.shape) * np.exp2(rng.integers(-12, 0, b.shape))).astype(np.float16)
    return raw


def _exact_kquant(raw: np.ndarray, wtype: int) -> list[list[Fraction]]:
    """Each weight's exact value from the format's definition: Q4_K d·sc·q - dmin·m, Q6_K d·sc·(q - 32)."""
    if wtype == Q4_K:
        u = q4_k.unpack(raw, K)
        return [[Fraction(float(u.d[r, i // 256])) * int(u.sc[r, i // 32]) * int(u.q[r, i])
                 - Fraction(float(u.dmin[r, i // 256])) * int(u.m[r, i // 32]) for i in range(K)]
                for r in range(len(raw))]
    u = q6_k.unpack(raw, K)
    return [[Fraction(float(u.d[r, i // 256])) * int(u.sc[r, i // 16]) * (int(u.q[r, i]) - 32) for i in range(K)]
            for r in range(len(raw))]


def _value(scale, n) -> Fraction:
    return Fraction(int(scale[0])) * Fraction(2) ** int(scale[1]) * int(n)


@pytest.mark.parametrize("wtype", [Q4_K, Q6_K], ids=lambda t: WEIGHT_TYPES[t].name)
def test_a_coded_row_holds_every_k_quant_weight_exactly_as_a_coef_plus_b_offs(wtype):
    raw = _kquant_raw(wtype, 3, np.random.default_rng(wtype))
    cr = coded.coded_rows(raw, wtype, K)
    want = _exact_kquant(raw, wtype)
    assert cr.seg == 256 and np.abs(cr.coef).max() <= coded.COEF_BOUND
    for r in range(3):
        for j in range(K // 256):
            s = cr.segment(r, j)
            for i in range(256):
                w = _value(s.a, s.coef[i]) + (_value(s.b, s.offs[i]) if s.b else 0)
                assert w == want[r][256 * j + i]


def test_coef_bound_is_q6_k_s_minus_128_times_minus_32():
    raw = np.zeros((1, 210), np.uint8)
    b = raw.view(q6_k.DTYPE)
    b["scales"][0, 0], b["d"] = -128, np.float16(1.0)                    # codes 0: q - 32 = -32
    cr = coded.coded_rows(raw, Q6_K, 256)
    assert cr.coef[0, 0] == coded.COEF_BOUND == 4096
    q4 = np.full((1, 144), 255, np.uint8)                                # Q4_K's largest: 63·15, offs -63
    q4.view(q4_k.DTYPE)["d"] = q4.view(q4_k.DTYPE)["dmin"] = np.float16(1.0)
    c4 = coded.coded_rows(q4, Q4_K, 256)
    assert np.abs(c4.coef).max() == 945 and np.abs(c4.offs).max() == 63


@pytest.mark.parametrize("wtype", [Q4_K, Q6_K], ids=lambda t: WEIGHT_TYPES[t].name)
@pytest.mark.parametrize("scaling", ["SUB32", "PER_BLOCK"])
def test_k_quant_dot_is_exact_per_rounding_unit_units_added_in_order(wtype, scaling):
    """Sub32: each group of 256 exact, rounded once; PerBlock: each 256-element weight block
    under one wide activation scale exact, rounded once; the pieces added in order."""
    rng = np.random.default_rng(wtype + 7)
    raw = _kquant_raw(wtype, 3, rng)
    x = (rng.standard_normal((2, K)) * np.exp2(rng.integers(-6, 6, (2, K // 32)).repeat(32, 1))).astype(F32)
    sc = quant.ActScaling[scaling]
    got = coded.dot(raw, wtype, x, sc)
    a = quant.quantize_blocks(x, 256) if scaling == "PER_BLOCK" else quant.quantize_act(x)
    blk = 256 if scaling == "PER_BLOCK" else 32
    w = _exact_kquant(raw, wtype)
    for t in range(2):
        act = [Fraction(int(a.q[t, i])) * int(a.m[t, i // blk]) * Fraction(2) ** int(a.e[t, i // blk])
               for i in range(K)]
        for r in range(3):
            acc = None
            for g0 in range(0, K, 256):
                part = to_f32(sum(w[r][i] * act[i] for i in range(g0, g0 + 256)))
                acc = part if acc is None else F32(arith.add(acc, part))
            assert got[t, r].view(np.uint32) == acc.view(np.uint32), (t, r)


@pytest.mark.parametrize("wtype", [Q8_0, Q4_1, Q1_0, Q2_0], ids=lambda t: WEIGHT_TYPES[t].name)
def test_legacy_coded_rows_give_the_group_dots_bits(wtype):
    rng = np.random.default_rng(wtype)
    mod = WEIGHT_TYPES[wtype]
    raw = rng.integers(0, 256, (5, K // mod.block * mod.block_bytes)).astype(np.uint8)
    d = raw.reshape(5, -1, mod.block_bytes)[:, :, :2].copy().view(np.float16)
    d[:] = (rng.standard_normal(d.shape) * np.exp2(rng.integers(-16, 2, d.shape))).astype(np.float16)
    raw.reshape(5, -1, mod.block_bytes)[:, :, :2] = d.view(np.uint8)
    if wtype == Q4_1:                                                    # the min: bytes 2..3
        m = (rng.standard_normal(d.shape) * np.exp2(rng.integers(-16, 2, d.shape))).astype(np.float16)
        raw.reshape(5, -1, mod.block_bytes)[:, :, 2:4] = m.view(np.uint8)
    x = (rng.standard_normal((3, K)) * np.exp2(rng.integers(-30, 30, (3, K // 32)).repeat(32, 1))).astype(F32)
    assert np.array_equal(coded.dot(raw, wtype, x).view(np.uint32),
                          quant.mul_mat(raw, wtype, quant.quantize_act(x)).view(np.uint32))


def test_an_infinite_scale_is_unreadable():
    raw = _kquant_raw(Q4_K, 2, np.random.default_rng(0))
    raw.view(q4_k.DTYPE)["dmin"][1, 1] = np.inf
    with pytest.raises(quant.Unreadable, match="row 1, block 1"):
        coded.coded_rows(raw, Q4_K, K)


@pytest.mark.parametrize("wtype", [Q4_0, Q5_0, Q5_1], ids=lambda t: WEIGHT_TYPES[t].name)
def test_a_coded_row_holds_every_q4_0_q5_0_q5_1_weight_exactly(wtype):
    """Q4_0 d·(q - 8), Q5_0 d·(code - 16), Q5_1 d·code + m, each as a·coef + b·offs exactly."""
    rng = np.random.default_rng(wtype)
    mod = WEIGHT_TYPES[wtype]
    raw = rng.integers(0, 256, (3, mod.row_bytes(K)), dtype=np.uint8)
    blocks = raw.reshape(3, -1, mod.block_bytes)
    for at in (0, 2) if wtype == Q5_1 else (0,):
        d = (rng.standard_normal(blocks.shape[:2]) * 0.1).astype(np.float16)
        blocks[:, :, at:at + 2] = d[..., None].view(np.uint8)
    u = mod.unpack(raw, K)
    cr = coded.coded_rows(raw, wtype, K)
    assert cr.seg == 32 and (cr.b is not None) == (wtype == Q5_1)
    for r in range(3):
        for i in range(K):
            s = cr.segment(r, i // 32)
            w = _value(s.a, s.coef[i % 32]) + (_value(s.b, s.offs[i % 32]) if s.b else 0)
            m = Fraction(float(u.m[r, i // 32])) if u.m is not None else 0
            assert w == Fraction(float(u.d[r, i // 32])) * int(u.q[r, i]) + m


def test_k_quant_scales_that_are_inf_or_nan_are_unreadable():
    raw = _kquant_raw(Q4_K, 3, np.random.default_rng(4))
    b = raw.view(q4_k.DTYPE).reshape(3, -1)
    coded.check_readable(raw, Q4_K)
    b["dmin"][2, 1] = np.float16(np.nan)
    with pytest.raises(quant.Unreadable, match="row 2, block 1: an infinite or NaN scale"):
        coded.check_readable(raw, Q4_K)
    assert coded.reads(Q4_K) and coded.reads(Q6_K) and coded.reads(Q5_1)
