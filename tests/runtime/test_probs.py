"""Token probabilities (bankml/runtime/probs.py) as llama-server computes them: get_token_probabilities'
partial sort and softmax against that function's own C++ (tools/server/server-common.cpp, compiled
here with g++ and libstdc++), and the post-sampling list from the chain's candidates. The answers
of the two servers are compared in tests/server/test_oracle_sampling.py."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from bankml.numerics import stdsort
from bankml.runtime import probs as P

# get_token_probabilities without the llama_context: the row from a file, the same body after it
GET_TOKEN_PROBABILITIES = r"""
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>
struct llama_token_data { int id; float logit; float p; };
int main(int argc, char ** argv) {
    FILE * f = fopen(argv[1], "rb"); size_t n_top = atoi(argv[2]);
    std::vector<float> logits; float v;
    while (fread(&v, 4, 1, f) == 1) logits.push_back(v);
    fclose(f);
    const int n_logits = logits.size();
    std::vector<llama_token_data> cur(n_logits);
    for (int token_id = 0; token_id < n_logits; token_id++) cur[token_id] = llama_token_data{token_id, logits[token_id], 0.0f};
    if (n_top > cur.size()) n_top = cur.size();
    if (n_top > 0) {
        std::partial_sort(cur.begin(), cur.begin() + n_top, cur.end(),
            [](const llama_token_data & a, const llama_token_data & b) { return a.logit > b.logit; });
    }
    float max_l = -std::numeric_limits<float>::infinity();
    if (n_top > 0) { max_l = cur[0].logit; } else { for (const auto & t : cur) max_l = std::max(max_l, t.logit); }
    float cum_sum = 0.0f;
    for (auto & t : cur) { float p = expf(t.logit - max_l); t.p = p; cum_sum += p; }
    for (auto & t : cur) t.p /= cum_sum;
    FILE * o = fopen(argv[3], "wb");
    for (auto & t : cur) { fwrite(&t.id, 4, 1, o); fwrite(&t.p, 4, 1, o); }
    fclose(o);
}
"""


@pytest.fixture(scope="module")
def cpp(tmp_path_factory):
    d = tmp_path_factory.mktemp("probs")
    (d / "p.cpp").write_text(GET_TOKEN_PROBABILITIES)
    subprocess.run(["g++", "-O2", "-o", str(d / "p"), str(d / "p.cpp")], check=True)

    def run(row: np.ndarray, n_top: int):
        row.astype(np.float32).tofile(d / "row")
        subprocess.run([str(d / "p"), str(d / "row"), str(n_top), str(d / "out")], check=True)
        out = np.fromfile(d / "out", dtype=np.int32).reshape(-1, 2)
        return out[:, 0].copy(), out[:, 1].copy().view(np.float32)
    return run


def rows():
    rng = np.random.default_rng(7)
    yield rng.normal(0, 3, 49152).astype(np.float32)
    yield (rng.integers(-40, 40, 49152) / 4).astype(np.float32)          # many ties
    yield np.zeros(1000, np.float32)                                         # all tied


@pytest.mark.oracle
@pytest.mark.parametrize("n_top", [1, 5, 20, 200])
def test_token_probabilities_equal_get_token_probabilities(cpp, n_top):
    for row in rows():
        ids, p = P.token_probabilities(row, n_top)
        want_ids, want_p = cpp(row, n_top)
        assert np.array_equal(ids, want_ids[:len(ids)]) and len(ids) == len(want_ids)
        assert np.array_equal(p.view(np.uint32), want_p.view(np.uint32))


def test_partial_sort_order_is_libstdcxx_partial_sort_whole():
    """The whole array after std::partial_sort (the evicted heap tops in the tail included), as
    bankml/numerics/stdsort.py spells the algorithm."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 3000))
        m = int(rng.integers(0, min(n, 60) + 1))
        x = (rng.integers(-20, 20, n) / 4).astype(np.float32)
        want = list(range(n))
        stdsort.partial_sort(want, m, lambda i: x[i])
        assert P.partial_sort_order(x, m, chunk=int(rng.integers(1, 600))).tolist() == want


def test_softmax_sum_follows_the_tail_order():
    """Why the tail's order is rebuilt: the same values summed in float in another order (the
    fully sorted one) give another sum, so every p would differ."""
    row = np.random.default_rng(3).normal(0, 3, 49152).astype(np.float32)
    order = P.partial_sort_order(row, 5)
    x = row[order]
    from bankml.numerics import libm
    e = libm.expf(x - x[0])
    assert e.cumsum(dtype=np.float32)[-1] != np.sort(e)[::-1].cumsum(dtype=np.float32)[-1]


class FakeSampler:
    def __init__(self, ids, p):
        self.ids, self.p = np.array(ids, np.int32), np.array(p, np.float32)

    def candidates(self):
        return self.ids, self.p


def test_post_sampling_stops_at_the_first_zero():
    tp = P.post_sampling(FakeSampler([4, 9, 2, 7], [0.75, 0.25, 0.0, 0.0]), 9, 3)
    assert (tp.prob, tp.top) == (0.25, [(4, 0.75), (9, 0.25)])


def test_post_sampling_prob_is_one_when_the_candidates_lack_the_token():
    assert P.post_sampling(FakeSampler([4], [1.0]), 8, 5).prob == 1.0


def test_pre_sampling_gives_the_sampled_tokens_p_anywhere_in_the_row():
    row = np.array([0.0, 3.0, 1.0, 2.0], np.float32)
    tp = P.pre_sampling(row, 0, 2)
    ids, p = P.token_probabilities(row, 2)
    assert tp.top == [(1, float(p[0])), (3, float(p[1]))] and tp.prob == float(p[ids.tolist().index(0)])


def test_logarithm_of_zero_is_the_lowest_float():
    assert P.logarithm(0.0) == -3.4028234663852886e38
    assert P.logarithm(0.5) == float(np.float32(np.log(np.float32(0.5))))
