"""The portable profile's remaining functions as SPIR-V kernels on Vulkan (lavapipe in CI) equal
their numpy definitions (bankml/profiles/portable/funcs.py) bit for bit: the row reductions
fmax, absmax, argmax, l2norm and hadamard, ln, ln1p, sigmoid, silu and softplus of every
element, and attend_vector; on the device and as the worst denormal-flushing device
(`flushing`)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from bankml.backends.spirv import builder as B
from bankml.backends.spirv.portable import kernels as PK
from bankml.profiles.portable import arith, funcs
from tests.backends.spirv.test_portable_vulkan import _diff, _same, kern  # noqa: F401 (kern: the device fixture)

F32 = np.float32
ELEMENTWISE = ("ln", "ln1p", "sigmoid", "silu", "softplus")


MODULES = {"fmax": PK.emit_fmax, "absmax": PK.emit_absmax, "argmax": PK.emit_argmax, "l2norm": PK.emit_l2norm,
           "hadamard": PK.emit_hadamard, "l2norm-flushing": lambda: PK.emit_l2norm(True)}
MODULES |= {f"unary-{fn}": (lambda fn=fn: PK.emit_unary(fn)) for fn in ELEMENTWISE}


@pytest.mark.parametrize("name", list(MODULES))
def test_module_passes_spirv_val_and_no_float_op_may_contract(name):
    words = list(MODULES[name]())
    B.validate(words)
    text = B.disassemble(words)
    float_ops = set(re.findall(r"^\s*(%\S+) = Op(?:FAdd|FSub|FMul) ", text, re.M))
    assert float_ops <= set(re.findall(r"OpDecorate (%\S+) NoContraction", text))
    assert bool(float_ops) == (name not in ("fmax", "absmax", "argmax"))
    assert "OpExtInst" not in text and "Fma" not in text and "Float64" not in text and "OpFDiv" not in text


# ---- fmax, absmax, argmax
def _max_edge_rows(n: int) -> np.ndarray:
    """Rows of n: NaNs passed over, all NaN, -inf (with NaNs), +0/-0 ties, denormals, infs."""
    rng = np.random.default_rng(n)
    rows = rng.standard_normal((14, n)).astype(F32)
    rows[0, ::2] = np.nan                                              # NaNs passed over
    rows[1] = np.nan                                                   # all NaN: -inf, 0, index 0
    rows[2] = -np.inf                                                  # all -inf: index 0
    rows[3] = -np.inf
    rows[3, ::3] = np.nan                                              # -inf and NaN: the first -inf
    rows[4] = -0.0
    rows[4, n // 2] = 0.0                                              # fmax +0; argmax index 0
    rows[5] = -1.0
    rows[5, n - 1] = 0.0
    rows[5, n // 3] = -0.0                                             # -0 first, +0 later: argmax the -0
    rows[6] = -rng.random(n).astype(F32)
    rows[6, n - 1] = -0.0                                              # a -0 maximum: fmax +0
    rows[7] = np.array([1e-40, -1e-42, 1e-45, -3e-39, 2e-38] * n, F32)[:n] * rng.choice([1, -1], n)   # denormals: 0
    rows[8] = -np.abs(rows[8])
    rows[8, -1] = 1e-40                                                # a denormal maximum reads as +0
    rows[9, n - 1] = np.inf                                            # the last element the largest
    rows[10, 0] = -np.inf                                              # absmax: the first element's inf
    rows[11] = 3.0
    rows[11, 0] = np.nan                                               # a tie after a NaN: the first 3
    rows[12] = rng.integers(-3, 4, n).astype(F32)                      # ties everywhere
    rows[13] = np.float32(3.4e38) * rng.choice([1, -1], n)
    return rows


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 100, 577])
def test_fmax_absmax_argmax(kern, n):
    rng = np.random.default_rng(n + 11)
    x = np.concatenate([rng.standard_normal((6, n)).astype(F32) * F32(40), _max_edge_rows(n)])
    with np.errstate(invalid="ignore"):
        for fn in ("fmax", "absmax"):
            got, want = getattr(kern, fn)(x), getattr(funcs, fn)(x)
            assert _same(got, want), (fn, _diff(got, want))
        got, want = kern.argmax(x), funcs.argmax(x)
    assert got.dtype == np.int64 and np.array_equal(got, want), (np.flatnonzero(got != want), got, want)


def test_row_reductions_of_named_cases(kern):
    x = np.array([[np.nan, -0.0, 0.0, np.nan], [np.nan] * 4, [-np.inf, np.nan, -np.inf, 1e-40],
                  [np.nan, -np.inf, np.nan, -np.inf], [1e-40, -1e-39, -0.0, np.nan],
                  [-5.0, np.inf, -np.inf, np.inf]], F32)
    with np.errstate(invalid="ignore"):
        assert _same(kern.fmax(x), F32([0.0, -np.inf, 0.0, -np.inf, 0.0, np.inf]))
        assert _same(kern.absmax(x), F32([0.0, 0.0, np.inf, np.inf, 0.0, np.inf]))
        assert kern.argmax(x).tolist() == [1, 0, 3, 1, 0, 1]
        for fn in ("fmax", "absmax", "argmax"):
            assert np.array_equal(getattr(kern, fn)(x).view(np.uint32 if fn != "argmax" else np.int64),
                                  np.asarray(getattr(funcs, fn)(x)).view(np.uint32 if fn != "argmax" else np.int64))
    assert kern.fmax(x[:, :1]).shape == (6,) and kern.fmax(x[0]).shape == ()


# ---- l2norm
def _norm_edge_rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(n + 3)
    rows = rng.standard_normal((12, n)).astype(F32)
    rows[0] = 0.0                                                      # a zero row: rsqrt(eps)
    rows[1, ::2] = -0.0
    rows[1, 1::2] = 0.0
    rows[2, :5] = [1e-40, -1e-42, 1e-45, -3e-39, 2e-38][:n]            # denormals read as signed zeros
    rows[3, 7 % n] = np.nan
    rows[4, 1 % n] = np.inf
    rows[5] *= F32(1e19)                                               # squares overflow: inf sum, y 0
    rows[6] *= F32(1e-20)                                              # squares flush
    rows[7] = F32(1.5)                                                 # ties in the sums
    rows[8, 3 % n] = -np.inf
    rows[9] = F32(3e38) * rng.choice([1, -1], n)                       # huge values
    rows[10] *= F32(1.7e19) / np.sqrt(F32(n))                          # the sum near the f32 top
    rows[11] = np.ldexp(1 + rng.random(n), -63).astype(F32)            # squares just above 2^-126
    return rows


@pytest.mark.parametrize("n", [1, 5, 8, 13, 100, 576])
def test_l2norm(kern, n):
    rng = np.random.default_rng(n)
    x = np.concatenate([rng.standard_normal((4, n)).astype(F32) * F32(5), _norm_edge_rows(n)])
    with np.errstate(all="ignore"):
        for eps in (1e-6, 1e-12, 0.0, 1e-40, 3.0):
            got, want = kern.l2norm(x, eps), funcs.l2norm(x, eps)
            assert _same(got, want), (eps, _diff(got, want))


# ---- hadamard
@pytest.mark.parametrize("n", [2 ** j for j in range(11)])
def test_hadamard(kern, n):
    rng = np.random.default_rng(n + 5)
    x = rng.standard_normal((6, n)).astype(F32) * F32(3)
    x[1] = rng.integers(-4, 5, n).astype(F32)                          # exact cancellations: signed zeros
    x[2, :5] = [1e-40, -1e-42, np.nan, -3e-39, 2e-38][:n]
    x[3, n // 2] = np.inf
    x[3, 0] = -np.inf
    x[4] = F32(3e38) * rng.choice([1, -1], n)                          # overflow to +-inf and inf - inf
    x[5] = np.ldexp(1 + rng.integers(0, 16, n) / 16, -126).astype(F32) * rng.choice([1, -1], n)  # +-denormal
    with np.errstate(all="ignore"):
        got, want = kern.hadamard(x), funcs.hadamard(x)
    assert _same(got, want), _diff(got, want)


def test_hadamard_refuses_a_length_not_a_power_of_two(kern):
    from bankml.errors import BankmlError
    with pytest.raises(BankmlError):
        kern.hadamard(np.ones((2, 6), F32))


# ---- ln, ln1p, sigmoid, silu, softplus
def _elementwise_inputs() -> np.ndarray:
    """Bit patterns spread over all of f32, the specials, ln's table edges (m·64 half-way between
    points, both neighbours), ln1p near u = 2^24, softplus at and around 16, and the bands where
    exp and the products reach 2^-126."""
    bits = np.arange(0, 2 ** 32, 48611, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 1, 0x807FFFFF,
                         0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000], np.uint32)
    i = np.arange(47, 98)
    ln_edges = np.concatenate([np.ldexp((i + 0.5) / 64, k) for k in (-126, -20, -1, 0, 1, 23, 127)]).astype(F32)
    near = [F32(16), F32(-16), F32(2.0 ** 24), F32(2.0 ** 24 - 1), F32(2.0 ** 25), F32(1.0), F32(0.5), F32(-1.0),
            F32(-0.5), F32(88.72), F32(-87.3), F32(89), F32(-104), F32(104)]
    e = np.concatenate([ln_edges, np.array(near, F32)])
    rng = np.random.default_rng(17)
    bands = [np.linspace(-104, -80, 3001, dtype=F32), np.linspace(80, 104, 3001, dtype=F32),
             np.ldexp(rng.random(3000) + 1, rng.integers(-126, -100, 3000)).astype(F32),
             (rng.standard_normal(3000) * 20).astype(F32), np.linspace(15.9, 16.1, 801, dtype=F32),
             np.ldexp(rng.random(2000) + 1, rng.integers(20, 30, 2000)).astype(F32)]
    x = np.concatenate([bits.view(F32), specials.view(F32), e, np.nextafter(e, F32(np.inf)),
                        np.nextafter(e, -F32(np.inf))] + bands)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_over_the_f32_bit_patterns_and_edges(kern, fn):
    x = _elementwise_inputs()
    with np.errstate(all="ignore"):
        got, want = kern.unary(fn, x), getattr(funcs, fn)(x)
    assert _same(got, want), (fn, _diff(got, want))


def test_elementwise_named_cases(kern):
    """The specials funcs.py states: ln(+-0) -inf, ln(x < 0) NaN, ln(+inf) +inf; ln1p(+inf) +inf;
    softplus past 16 is u + exp(-u), at 16 ln1p(exp(16)); silu(-inf) NaN; NaN stays the one NaN."""
    inf, nan = F32(np.inf), F32(np.nan)
    x = np.array([0.0, -0.0, 1e-40, -1.0, -inf, inf, nan, 1.0, 16.0, np.nextafter(F32(16), inf), 100.0, -100.0], F32)
    with np.errstate(all="ignore"):
        for fn in ELEMENTWISE:
            got, want = kern.unary(fn, x), getattr(funcs, fn)(x)
            assert _same(got, want), (fn, _diff(got, want))
        got = {fn: kern.unary(fn, x) for fn in ELEMENTWISE}
    assert np.all(np.isneginf(got["ln"][:3])) and np.all(np.isnan(got["ln"][3:5])) and got["ln"][5] == inf
    assert got["ln1p"][5] == inf and got["softplus"][5] == inf and np.isnan(got["silu"][4])
    assert got["softplus"][10] == F32(100.0) and got["softplus"][11] == 0.0
    assert all(got[fn].view(np.uint32)[6] == 0x7FC00000 for fn in ELEMENTWISE)
    big = np.array([16.0, np.nextafter(F32(16), inf)], F32)
    assert _same(kern.unary("softplus", big), [funcs.ln1p(funcs.exp(F32(16))), arith.add(big[1], funcs.exp(-big[1]))])


def test_rmsnorm_reads_a_denormal_eps_as_zero(kern):
    """eps is an operand of the profile's add: a denormal one reads as 0 (rows whose mean square
    is near 2^-124 show it), as in emit_l2norm."""
    x = (np.random.default_rng(1).standard_normal((4, 64)) * np.float32(2.0 ** -62)).astype(np.float32)
    for eps in (1e-40, 3e-41):
        assert _same(kern.rmsnorm(x, None, eps), funcs.rmsnorm(x, None, eps)), eps


# ---- attend_vector (attention over f32 rows)
def _attend_inputs(H: int, n: int, D: int, seed: int):
    """q [H, D], k and v [H, n, D]: head 0 plain, then a denormal in q, a NaN in v, one position
    far above the rest (the other exps flush to 0), an inf in k, and denormal/zero rows."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((H, D)).astype(F32)
    k = rng.standard_normal((H, n, D)).astype(F32)
    v = (rng.standard_normal((H, n, D)) * 3).astype(F32)
    specials = [
        lambda: q.__setitem__((1, D // 3), F32(1e-40)),               # a denormal in q reads as 0
        lambda: v.__setitem__((2, n // 2, D - 1), F32(np.nan)),       # a NaN value: its element NaN
        lambda: k.__setitem__((3, n - 1), k[3, n - 1] + F32(60) * np.sign(q[3])),   # one far above
        lambda: k.__setitem__((4, n // 3, D // 2), F32(np.inf)),      # a score of +-inf or NaN
        lambda: (k.__setitem__(5, k[5] * F32(1e-22)),                 # flushed products
                 v.__setitem__((5, 0), F32(-0.0))),
        lambda: q.__setitem__(6, F32(0.0)),                           # every score 0: ties
    ]
    for f in specials[:H - 1]:
        f()
    return q, k, v


@pytest.mark.parametrize("H,n,D", [(1, 1, 8), (7, 1, 64), (7, 13, 64), (7, 13, 20), (4, 40, 20), (2, 8, 3),
                                   (3, 70, 64)])
def test_attend_vector(kern, H, n, D):
    from bankml.profiles.portable import attention
    q, k, v = _attend_inputs(H, n, D, H * 100 + n * 10 + D)
    for scale in (0.125, 1 / np.sqrt(D), 30.0):
        with np.errstate(all="ignore"):
            want = np.stack([attention.attend_vector(q[h], k[h], v[h], scale) for h in range(H)])
            got = kern.attend_vector(q, k, v, scale)
        assert _same(got, want), (scale, _diff(got, want))


def test_attend_vector_named_cases(kern):
    """The specials pinned: a score of +inf (inf - inf) or a NaN score makes the head NaN; a NaN in
    v only its element; one position far above the rest takes the weight 1 exactly."""
    from bankml.profiles.portable import attention
    D, n = 16, 9
    q = np.ones((4, D), F32)
    k = np.zeros((4, n, D), F32)
    v = np.arange(4 * n * D, dtype=F32).reshape(4, n, D)
    k[0, 3, 5] = np.inf                                               # s_3 = +inf: every p NaN
    v[1, 2, 7] = np.nan                                               # out[1, 7] NaN, the rest finite
    k[2, 6] = 100.0                                                   # p = one-hot at 6
    k[3, 4, 0] = np.nan
    with np.errstate(all="ignore"):
        got = kern.attend_vector(q, k, v, 0.25)
        want = np.stack([attention.attend_vector(q[h], k[h], v[h], 0.25) for h in range(4)])
    assert _same(got, want), _diff(got, want)
    assert np.all(got.view(np.uint32)[[0, 3]] == 0x7FC00000)
    assert np.isnan(got[1, 7]) and np.isfinite(np.delete(got[1], 7)).all()
    assert _same(got[2], v[2, 6])
    from bankml.errors import BankmlError
    for bad in ((q, k[:, :0], v[:, :0]), (q[:, :8], k, v), (q, k, v[:, :5])):
        with pytest.raises(BankmlError):
            kern.attend_vector(*bad, 0.25)


def test_attend_vector_module_passes_spirv_val():
    words = list(PK.emit_attend_vector())
    B.validate(words)
    text = B.disassemble(words)
    float_ops = set(re.findall(r"^\s*(%\S+) = Op(?:FAdd|FSub|FMul) ", text, re.M))
    assert float_ops and float_ops <= set(re.findall(r"OpDecorate (%\S+) NoContraction", text))
    assert "OpExtInst" not in text and "Fma" not in text and "OpFDiv" not in text
