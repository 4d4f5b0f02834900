"""The sampler chain's pieces: libstdc++'s std::mt19937, generate_canonical, std::partial_sort."""
from __future__ import annotations

import random

import numpy as np

from bankml.runtime.sampler import GREEDY, MT19937, Candidates, Sampler, SamplerParams, partial_sort


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
