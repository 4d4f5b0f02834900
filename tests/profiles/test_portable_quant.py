"""Activation blocks at m*2^e scales, and the mat-mul of every weight type as exact group sums
rounded once, against the same sums in Python's exact rationals."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from bankml.profiles.portable import arith, coded, quant
from bankml.profiles.portable.tables import to_f32
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES, q1_0, q2_0, q4_1, q8_0

F32 = np.float32


def test_act_scale_is_the_least_m_2e_over_every_significand():
    # every 24-bit significand at one exponent (the rule is the same at every exponent)
    c = np.arange(1 << 23, 1 << 24, dtype=np.int64)
    amax = np.ldexp(c.astype(np.float64), -23).astype(F32)                # [1, 2)
    m, e = quant.act_scale(amax)
    assert m.min() == 8 and m.max() == 15
    s = np.ldexp(m.astype(np.float64), e)
    assert np.all(127 * s >= amax)
    prev = np.where(m == 8, 15 * np.ldexp(1.0, e - 1), (m - 1) * np.ldexp(1.0, e))    # the next smaller scale
    assert np.all(127 * prev < amax)


def test_codes_round_half_to_even_and_zero_blocks_have_no_scale():
    s = 9 * 2.0 ** -10                                          # amax = 127 s: the scale is s
    x = np.zeros((1, 64), F32)
    x[0, :6] = np.array([127, 2.5, 3.5, -2.5, -3.5, 0.49999997], np.float64) * s
    a = quant.quantize_act(x)
    assert a.m.tolist() == [[9, 0]] and a.e.tolist() == [[-10, 0]]
    assert a.q[0, :6].tolist() == [127, 2, 4, -2, -4, 0]
    assert not a.q[0, 32:].any() and not a.bad.any()


def test_a_block_with_nan_or_inf_is_bad_and_poisons_its_dots():
    x = np.ones((2, 64), F32)
    x[0, 3], x[1, 40] = np.nan, np.inf
    a = quant.quantize_act(x)
    assert a.bad.tolist() == [[True, False], [False, True]]
    raw = _random_raw(Q8_0, 3, 64, np.random.default_rng(0))
    assert np.isnan(quant.mul_mat(raw, Q8_0, a)).all()


def _random_raw(wtype: int, rows: int, k: int, rng) -> np.ndarray:
    """Random weight bytes of a type; scales spread over many binades, as real models do not."""
    if wtype == F16:
        v = rng.standard_normal((rows, k)) * np.exp2(rng.integers(-20, 8, (rows, k)))
        return v.astype(np.float16).view(np.uint8)
    mod = {Q8_0: q8_0, Q4_1: q4_1, Q1_0: q1_0, Q2_0: q2_0}[wtype]
    b = np.zeros((rows, k // mod.BLOCK), mod.DTYPE)
    b["d"] = (rng.standard_normal(b.shape) * np.exp2(rng.integers(-16, 2, b.shape))).astype(np.float16)
    if wtype == Q4_1:
        b["m"] = (rng.standard_normal(b.shape) * np.exp2(rng.integers(-16, 2, b.shape))).astype(np.float16)
    b["qs"] = rng.integers(-128 if wtype == Q8_0 else 0, 128 if wtype == Q8_0 else 256, b["qs"].shape)
    return b.view(np.uint8).reshape(rows, -1)


def _exact_weights(raw: np.ndarray, wtype: int, k: int) -> list[list[Fraction]]:
    if wtype == F16:
        return [[Fraction(float(v)) for v in row] for row in raw.view(np.float16)]
    u = WEIGHT_TYPES[wtype].unpack(raw, k)
    blk = WEIGHT_TYPES[wtype].block
    out = []
    for r in range(len(raw)):
        row = []
        for i in range(k):
            w = Fraction(float(u.d[r, i // blk])) * int(u.q[r, i])
            if wtype == Q4_1:
                w += Fraction(float(u.m[r, i // blk]))
            row.append(w)
        out.append(row)
    return out


def _exact_mul_mat(raw, wtype, a: quant.ActBlocks) -> np.ndarray:
    T, k = a.q.shape
    w = _exact_weights(raw, wtype, k)
    act = [[Fraction(int(a.q[t, i])) * int(a.m[t, i // 32]) * Fraction(2) ** int(a.e[t, i // 32]) for i in range(k)]
           for t in range(T)]
    out = np.zeros((T, len(raw)), F32)
    for t in range(T):
        for r in range(len(raw)):
            acc = None
            for g0 in range(0, k, 256):
                part = to_f32(sum(w[r][i] * act[t][i] for i in range(g0, min(g0 + 256, k))))
                acc = part if acc is None else F32(arith.add(acc, part))
            out[t, r] = acc
    return out


@pytest.mark.parametrize("wtype", [F16, Q8_0, Q4_1, Q1_0, Q2_0], ids=lambda t: WEIGHT_TYPES[t].name)
@pytest.mark.parametrize("k", [256, 640])
def test_mul_mat_is_each_group_exact_rounded_once_groups_in_order(wtype, k):
    if k % WEIGHT_TYPES[wtype].block:
        k = 768
    rng = np.random.default_rng(k + wtype)
    raw = _random_raw(wtype, 5, k, rng)
    x = rng.standard_normal((3, k)) * np.exp2(rng.integers(-30, 30, (3, k // 32)).repeat(32, axis=1))
    a = quant.quantize_act(x.astype(F32))
    got = quant.mul_mat(raw, wtype, a, rows_per_chunk=2)
    want = _exact_mul_mat(raw, wtype, a)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_wide_scale_is_the_least_m_2e_with_an_8_bit_m_over_every_significand():
    c = np.arange(1 << 23, 1 << 24, dtype=np.int64)
    amax = np.ldexp(c.astype(np.float64), -23).astype(F32)                # [1, 2)
    m, e = quant.wide_scale(amax)
    assert m.min() == 128 and m.max() == 255 and quant.WIDE_BITS == 8
    s = np.ldexp(m.astype(np.float64), e)
    assert np.all(127 * s >= amax)
    prev = np.where(m == 128, 255 * np.ldexp(1.0, e - 1), (m - 1) * np.ldexp(1.0, e))
    assert np.all(127 * prev < amax)
    assert quant.wide_scale(np.array([0, 1e-30, 3e38], F32))[0].tolist()[0] == 0


@pytest.mark.parametrize("block", [32, 64, 128, 256])
def test_quantize_blocks_codes_are_the_nearest_integers_of_x_over_the_wide_scale(block):
    rng = np.random.default_rng(block)
    x = (rng.standard_normal((3, 512)) * np.exp2(rng.integers(-40, 40, (3, 512 // block)).repeat(block, 1))).astype(F32)
    x[1, 5] = np.nan
    x[2, :block] = 0
    a = quant.quantize_blocks(x, block)
    assert a.m.shape == (3, 512 // block) and a.bad[1, 0] and not a.bad[0].any()
    assert a.m[2, 0] == 0 and not a.q[2, :block].any()
    for t, j in [(0, 0), (0, 512 // block - 1), (2, 1)]:
        s = Fraction(int(a.m[t, j])) * Fraction(2) ** int(a.e[t, j])
        for i in range(j * block, (j + 1) * block):
            v = Fraction(float(x[t, i])) / s
            n = round(v)                                                # Python rounds ties to even
            assert int(a.q[t, i]) == max(-127, min(127, n))
    s = 200 * 2.0 ** -8                                                 # ties: amax = 127 s
    y = np.zeros((1, 32), F32)
    y[0, :5] = np.array([127, 2.5, 3.5, -2.5, -0.5]) * s
    assert quant.quantize_blocks(y, 32).q[0, :5].tolist() == [127, 2, 4, -2, 0]


@pytest.mark.parametrize("wtype", [Q8_0, Q4_1, Q1_0, Q2_0], ids=lambda t: WEIGHT_TYPES[t].name)
def test_per_block_dot_is_each_weight_block_exact_rounded_once_blocks_in_order(wtype):
    k = 512
    rng = np.random.default_rng(wtype)
    raw = _random_raw(wtype, 4, k, rng)
    block = WEIGHT_TYPES[wtype].block
    x = (rng.standard_normal((2, k)) * np.exp2(rng.integers(-30, 30, (2, k // 32)).repeat(32, axis=1))).astype(F32)
    got = coded.dot(raw, wtype, x, quant.ActScaling.PER_BLOCK)
    a = quant.quantize_blocks(x, block)
    w = _exact_weights(raw, wtype, k)
    want = np.zeros((2, 4), F32)
    for t in range(2):
        act = [Fraction(int(a.q[t, i])) * int(a.m[t, i // block]) * Fraction(2) ** int(a.e[t, i // block])
               for i in range(k)]
        for r in range(4):
            acc = None
            for b0 in range(0, k, block):
                part = to_f32(sum(w[r][i] * act[i] for i in range(b0, b0 + block)))
                acc = part if acc is None else F32(arith.add(acc, part))
            want[t, r] = acc
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(coded.dot(raw, wtype, x).view(np.uint32),
                          quant.mul_mat(raw, wtype, quant.quantize_act(x)).view(np.uint32))
    with pytest.raises(ValueError, match="F16"):
        coded.dot(_random_raw(F16, 2, 64, rng), F16, x[:, :64], quant.ActScaling.PER_BLOCK)


@pytest.mark.parametrize("wtype", [F16, Q8_0, Q4_1, Q1_0, Q2_0], ids=lambda t: WEIGHT_TYPES[t].name)
def test_get_rows_is_each_weight_rounded_once(wtype):
    k = 256
    raw = _random_raw(wtype, 4, k, np.random.default_rng(wtype))
    got = quant.get_rows(raw, wtype, k)
    want = np.array([[to_f32(v) for v in row] for row in _exact_weights(raw, wtype, k)], F32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_f16_parts_are_exact_for_every_half():
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    sig, exp, bad = quant.f16_parts(h)
    ok = ~bad
    assert np.array_equal(np.ldexp(sig[ok].astype(np.float64), exp[ok]), h[ok].astype(np.float64))
    assert bad.sum() == 2 * 1024                           # the infinities and NaNs


def test_the_documents_small_names():
    """ftz flushes a denormal to a zero of its sign and keeps NaN payloads (canon makes them one);
    rne rounds ties to even; f32_to_f16 keeps subnormals and overflows to inf; NAN is 0x7FC00000;
    INV_127 is 1/127 rounded once; act_scale/wide_scale give an ActScale; ActRow is ActBlocks."""
    import bankml.profiles.portable as P
    den = np.array([1, 0x80000001, 0x7FC00001, 0x00800000], np.uint32).view(np.float32)
    assert P.ftz(den).view(np.uint32).tolist() == [0, 0x80000000, 0x7FC00001, 0x00800000]
    assert P.rne([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999]).tolist() == [0, 2, 2, 0, -2, 2]
    h = P.f32_to_f16(np.array([6e-8, 2.0 ** -25, 65520.0, 65519.0, 1 + 2.0 ** -11], np.float32))
    assert h.view(np.uint16).tolist() == [1, 0, 0x7C00, 0x7BFF, 0x3C00]
    assert P.NAN.view(np.uint32) == 0x7FC00000
    assert P.INV_127 == np.float32(1 / 127)
    s = P.block_scale(np.array([127 * 8 * 2.0 ** -3], np.float32))
    assert isinstance(s, P.ActScale) and (s.m.tolist(), s.e.tolist()) == ([8], [-3])
    assert P.ActRow is quant.ActBlocks


DOCUMENT_NAMES = """ActRow ActScale CodedRow Logged Scale Segment Unreadable ActScaling FpUnit Words ACT_BLOCK
    COEF_BOUND GROUP INV_127 LANES NAN SUM_WINDOW VALUE_BLOCK WIDE_BITS absmax argmax attend_int8 attend_vector
    block_scale cache_row conv dot exact_sum exp f32_to_f16 fadd fdot fmax fmul fsub fsum ftz gdn_flush gdn_fold
    gdn_fold_trailing gdn_read gdn_row gdn_update hadamard int8_codes int8_score l2norm ldexp ln ln1p quantize
    quantize_blocks quantize_head reads recip rmsnorm rne rne_div rope rsqrt scaled_to_f32 sigmoid silu softmax
    softplus tree weighted_int8 wide_scale""".split()


def test_every_name_of_the_document_is_importable_as_what_it_names():
    """Each struct, enum, constant and function the document lists is in bankml.profiles.portable
    under its name (rope the function, not a module); the two enums whose variants the document
    leaves unstated hold bankml's choices (docs/PORTABLE.md, "FpUnit and Words")."""
    import enum
    import inspect

    import bankml.profiles.portable as P
    assert set(DOCUMENT_NAMES) <= set(P.__all__)
    for name in DOCUMENT_NAMES:
        obj = getattr(P, name)
        assert not inspect.ismodule(obj), name
        assert inspect.isclass(obj) or callable(obj) or isinstance(obj, (int, float, np.floating)), name
    assert issubclass(P.FpUnit, enum.Enum) and [u.name for u in P.FpUnit] == ["VECTOR", "CARD"]
    assert issubclass(P.Words, enum.Enum) and [w.name for w in P.Words] == ["I8"]
    x = np.array([1.5, -2.25, 3.0, 0.5], np.float32)
    cos, sin = P.rotary.rope_table([3], 4, 10000.0, 1.0)
    assert P.rope(x[None], cos, sin, "neox").shape == (1, 4)


def test_attend_int8_takes_words_and_scaling_and_refuses_others():
    """attend_int8(q, k, v, scale, words, scaling): Words.I8 gives the bits of the default call;
    anything that is not a Words or an ActScaling is refused, never read as one."""
    import bankml.profiles.portable as P
    rng = np.random.default_rng(3)
    q = rng.standard_normal(64).astype(np.float32)
    k = P.cache_row(rng.standard_normal((9, 64)).astype(np.float32))
    v = P.cache_row(rng.standard_normal((9, 64)).astype(np.float32))
    want = P.attend_int8(q, k, v, 0.125)
    for sc in P.ActScaling:
        got = P.attend_int8(q, k, v, 0.125, P.Words.I8, sc)
        assert got.view(np.uint32).tolist() == P.attend_int8(q, k, v, 0.125, scaling=sc).view(np.uint32).tolist()
    assert P.attend_int8(q, k, v, 0.125, P.Words.I8).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    for bad in ("i8", 8, P.ActScaling.SUB32):
        with pytest.raises(ValueError, match="attend_int8"):
            P.attend_int8(q, k, v, 0.125, bad)


def test_rne_div_is_the_nearest_integer_of_the_exact_quotient():
    """rne_div against Python's exact rationals on ties (k + 1/2)·m·2^e and their f32 neighbours, for
    every m of both scalings."""
    for m in list(range(8, 16)) + list(range(128, 256, 7)):
        for e in (-20, 0, 5):
            k = np.arange(-127, 127) + 0.5
            x = (k * m * 2.0 ** e).astype(np.float32)
            x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
            got = quant.rne_div(x, m, e)
            want = [round(Fraction(float(v)) / (m * Fraction(2) ** e)) for v in x]      # Python's round: ties to even
            assert got.tolist() == want, (m, e)
