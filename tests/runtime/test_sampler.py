"""The sampler chain's pieces: libstdc++'s std::mt19937, generate_canonical, std::partial_sort."""
from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from bankml.runtime.sampler import GREEDY, MT19937, Candidates, Sampler, SamplerParams, top_k
from bankml.numerics.stdsort import partial_sort


def test_mt19937_matches_std_reference_values():
    g = MT19937(5489)                               # the C++ standard's default seed
    assert g() == 3499211612
    g = MT19937(5489)
    for _ in range(9999):
        g()
    assert g() == 4123659995                        # [rand.predef]: 10000th value of mt19937


def test_canonical_uses_two_draws_and_stays_below_one():
    a, b = MT19937(3), MT19937(3)
    u = a.canonical()
    g1, g2 = b(), b()
    assert u == (g1 + g2 * 2.0 ** 32) / 2.0 ** 64 and 0.0 <= u < 1.0


def test_partial_sort_keeps_the_top_in_descending_order():
    r = random.Random(0)
    for n, k in [(1, 1), (10, 3), (100, 40), (1000, 40), (57, 57)]:
        xs = [r.random() for _ in range(n)]
        idx = list(range(n))
        partial_sort(idx, k, xs.__getitem__)
        assert [xs[i] for i in idx[:k]] == sorted(xs, reverse=True)[:k]


# std::partial_sort with comp = a.logit > b.logit, from a g++ 12 / libstdc++ build: (logits, k, ids)
TIES = [([1, 2, 2, 2, 0.5], 2, [2, 1]), ([1, 2, 2, 2, 0.5], 3, [3, 1, 2]), ([1, 2, 2, 2, 0.5], 4, [1, 3, 2, 0]),
        ([3] * 8, 3, [0, 1, 2]), ([3] * 8, 4, [1, 3, 0, 2]),
        ([1, 5, 5, 2, 5, 1, 5, 0, 5, 5, 3, 5], 3, [4, 1, 2]), ([1, 5, 5, 2, 5, 1, 5, 0, 5, 5, 3, 5], 4, [4, 1, 6, 2])]


def test_top_k_ties_follow_libstdcxx_heap_order():
    for logits, k, want in TIES:
        c = Candidates(np.array(logits, np.float32))
        c.sort_top(k)
        assert c.ids.tolist() == want, (logits, k)


def test_greedy_picks_the_highest_logit():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert Sampler(GREEDY, seed=1).sample(logits) == int(np.argmax(logits))


def test_same_seed_same_tokens():
    logits = np.random.default_rng(1).standard_normal(500).astype(np.float32)
    a, b = Sampler(SamplerParams(), 9), Sampler(SamplerParams(), 9)
    assert [a.sample(logits) for _ in range(20)] == [b.sample(logits) for _ in range(20)]


class _TokenData(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int32), ("logit", ctypes.c_float), ("p", ctypes.c_float)]


class _TokenDataArray(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(_TokenData)), ("size", ctypes.c_size_t), ("selected", ctypes.c_int64),
                ("sorted", ctypes.c_bool)]


def _llama_top_k(logits: np.ndarray, k: int) -> list[int]:
    """The ids llama.cpp's own top-k sampler keeps, in its order (libllama of the oracle build)."""
    from bankml.oracle.paths import bin_dir
    lib = ctypes.CDLL(str(bin_dir() / "libllama.so"))
    lib.llama_sampler_init_top_k.restype = ctypes.c_void_p
    lib.llama_sampler_apply.argtypes = [ctypes.c_void_p, ctypes.POINTER(_TokenDataArray)]
    lib.llama_sampler_free.argtypes = [ctypes.c_void_p]
    data = (_TokenData * len(logits))(*[_TokenData(i, float(x), 0.0) for i, x in enumerate(logits)])
    arr = _TokenDataArray(data, len(logits), -1, False)
    smpl = lib.llama_sampler_init_top_k(k)
    try:
        lib.llama_sampler_apply(smpl, ctypes.byref(arr))
    finally:
        lib.llama_sampler_free(smpl)
    return [arr.data[i].id for i in range(arr.size)]


@pytest.mark.oracle
@pytest.mark.parametrize("k", [129, 200, 1000, 49152])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_k_above_128_orders_ties_as_llama_cpp(k, seed):
    """Above 128 candidates llama.cpp buckets the logits and std::sorts each bucket: equal logits
    come out in libstdc++'s introsort order, which a stable sort does not give."""
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(0, 4, 49152) * 8).astype(np.float32) / np.float32(8)   # many ties
    c = Candidates(logits)
    top_k(c, k)
    want = _llama_top_k(logits, k)
    assert c.ids.tolist() == want
    stable = np.argsort(-logits, kind="stable")[:k].tolist()
    assert stable != want                       # the case is one where tie order matters
