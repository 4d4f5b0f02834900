"""The portable row functions on llvm (backends/llvm/portable/vector.py: fmax, absmax, argmax,
softmax, hadamard, attend_vector) give the numpy spec's bits (funcs.py) for 1, 2 and 3 threads: random rows
with every special, rows of one kind (all NaN, all -inf, zeros of both signs, denormals), tails
of fewer than 8."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.errors import BankmlError
from bankml.profiles.portable import attention, funcs
from tests.backends.llvm.test_llvm_portable_ops import _same, _values

F32 = np.float32
NAN, INF, DEN = F32(np.nan), F32(np.inf), np.uint32(1).view(F32)
LENGTHS = [1, 5, 8, 13, 64, 100]


@pytest.fixture(scope="module")
def vf():
    from bankml.backends.llvm.portable.vector import VectorFuncs
    return VectorFuncs()


def _rows(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """Seven rows of n: random with specials, all NaN, all -inf, NaN and -inf, signed zeros with
    denormals, one value among NaNs, and a row whose largest is repeated."""
    rng = np.random.default_rng(seed)
    rows = [_values(max(n, 16), seed, scale)[:n], np.full(n, NAN), np.full(n, -INF),
            np.where(np.arange(n) % 2, NAN, -INF).astype(F32),
            rng.choice(np.array([0.0, -0.0, DEN, -DEN], F32), n),
            np.full(n, NAN), (rng.integers(-3, 4, n) * F32(0.5)).astype(F32)]
    rows[5][n // 2] = F32(-2.5)
    return np.stack(rows)


def _each_nth(f, x):
    return [(nth, f(x, nth=nth)) for nth in (1, 2, 3)]


@pytest.mark.parametrize("name", ["fmax", "absmax", "argmax"])
@pytest.mark.parametrize("n", LENGTHS)
def test_reductions_bits_equal_spec(vf, name, n):
    x = _rows(n, n)
    want = getattr(funcs, name)(x)
    for nth, got in _each_nth(getattr(vf, name), x):
        if name == "argmax":
            assert got.tolist() == want.tolist(), f"nth={nth}"
        else:
            _same(got, want.astype(F32), f"{name} n={n} nth={nth}")


def test_reductions_on_their_edges(vf):
    """fmax of zeros only is +0 whichever came first; absmax reads a denormal as 0; argmax takes
    the first of equal largest (the two zeros equal) and 0 for a row of NaN."""
    x = np.array([[-0.0, 0.0, -0.0] + [-1.0] * 6, [-0.0] * 9, [DEN, -DEN] + [0.0] * 7,
                  [NAN, 0.0, -0.0, 0.0] + [-3.0] * 5, [NAN] * 9], F32)
    assert vf.fmax(x)[:2].view(np.uint32).tolist() == [0, 0]
    assert vf.absmax(x)[2].view(np.uint32) == 0
    assert vf.argmax(x).tolist() == funcs.argmax(x).tolist() == [0, 0, 0, 1, 0]
    _same(vf.fmax(x), funcs.fmax(x))
    _same(vf.absmax(x), funcs.absmax(x))


@pytest.mark.parametrize("n", LENGTHS + [256, 1000])
def test_softmax_bits_equal_spec(vf, n):
    x = np.concatenate([_rows(n, n + 1, 30.0), _values(4 * n, n, 8.0).reshape(4, n)])
    x[-1] = np.abs(x[-1])                              # a row without specials but its own
    with np.errstate(all="ignore"):
        want = funcs.softmax(x)
    for nth, got in _each_nth(vf.softmax, x):
        _same(got, want, f"softmax n={n} nth={nth}")


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 64, 1024])
def test_hadamard_bits_equal_spec(vf, n):
    x = np.concatenate([_values(6 * n, n, 1e3).reshape(6, n),
                        np.random.default_rng(n).standard_normal((3, n)).astype(F32) * F32(3e37)])
    with np.errstate(all="ignore"):
        want = funcs.hadamard(x)
    for nth, got in _each_nth(vf.hadamard, x):
        _same(got, want, f"hadamard n={n} nth={nth}")


def test_hadamard_refuses_a_length_not_a_power_of_two(vf):
    with pytest.raises(BankmlError, match="power of two"):
        vf.hadamard(np.zeros((2, 12), F32))


@pytest.mark.parametrize("H,n,D", [(3, 1, 64), (4, 13, 64), (2, 40, 128), (3, 9, 20)], ids=str)
def test_attend_vector_bits_equal_spec(vf, H, n, D):
    """Per head the scores (lanes by element), the softmax, the weighted sum (lanes by position),
    with specials in q, k and v; 1-3 threads split the heads."""
    rng = np.random.default_rng(H * n * D)
    q = rng.standard_normal((H, D)).astype(F32)
    k, v = (rng.standard_normal((H, n, D)).astype(F32) * F32(2) for _ in range(2))
    v.reshape(-1)[rng.choice(v.size, min(v.size, 12), replace=False)] = _values(64, n)[:min(v.size, 12)]
    q[0, 0] = DEN
    k[-1, 0, :] = F32(40)                                # a position far above the rest: others' e flush
    with np.errstate(all="ignore"):
        want = np.stack([attention.attend_vector(q[h], k[h], v[h], 0.125) for h in range(H)])
    for nth in (1, 2, 3):
        _same(vf.attend_vector(q, k, v, 0.125, nth=nth), want, f"attend_vector nth={nth}")


def test_attend_vector_refuses_shapes_that_do_not_agree(vf):
    with pytest.raises(BankmlError, match="do not agree"):
        vf.attend_vector(np.zeros((2, 8), F32), np.zeros((2, 3, 8), F32), np.zeros((2, 4, 8), F32), 1.0)
