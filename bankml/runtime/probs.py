"""Token probabilities as llama-server b11434 reports them (n_probs, OpenAI logprobs).

    tp = pre_sampling(row, tok, n_probs=5)         # get_token_probabilities over the model's row
    tp = post_sampling(sampler, tok, n_probs=5)    # the chain's candidates (post_sampling_probs)
    tp.prob, tp.top                                # the sampled token's p; [(id, p), ...] best first

pre_sampling is get_token_probabilities (tools/server/server-common.cpp): the whole row as
llama_token_data, std::partial_sort of the first n_probs by logit (comp a.logit > b.logit), then
a softmax over the whole array in the order the sort left it: max = the first logit, expf(l - max)
(glibc) summed in float in array order, each divided by the sum. The order of the tail matters to
that sum, and std::partial_sort's __heap_select writes each evicted heap top where the element
that displaced it was, so the permutation is rebuilt here whole (partial_sort_order).
post_sampling is populate_token_probs(post_sampling=true) (server-context.cpp): the candidates
common_sampler_get_candidates gives after the sample (Sampler.candidates()), the first n_probs
down to the first p of 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bankml.numerics import libm
from bankml.numerics.stdsort import _adjust_heap


@dataclass
class TokenProbs:
    """completion_token_output: the token, its p (1.0 when the candidates lack it), the top ones."""
    tok: int
    prob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def partial_sort_order(x: np.ndarray, middle: int, chunk: int = 4096) -> np.ndarray:
    """The positions std::partial_sort(first, first + middle, last) with comp a > b leaves at each
    place of an array whose place i held element i: make_heap of the first `middle`, then each later
    element above the heap's top swaps into the heap and the top goes to its place (__pop_heap),
    then sort_heap. Only the elements above the top move, so numpy finds them a chunk at a time."""
    x = np.ascontiguousarray(x, np.float32)
    n = len(x)
    order = np.arange(n, dtype=np.int32)
    if middle <= 0:
        return order
    xs = x.tolist()
    key = xs.__getitem__
    heap = list(range(middle))
    if middle > 1:                                  # __make_heap
        for parent in range((middle - 2) // 2, -1, -1):
            _adjust_heap(heap, parent, middle, heap[parent], key)
    top = xs[heap[0]]
    for lo in range(middle, n, chunk):              # __heap_select
        for i in (np.flatnonzero(x[lo:lo + chunk] > top) + lo).tolist():
            if xs[i] > top:
                order[i] = heap[0]
                _adjust_heap(heap, 0, middle, i, key)
                top = xs[heap[0]]
    for last in range(middle - 1, 0, -1):           # __sort_heap
        v, heap[last] = heap[last], heap[0]
        _adjust_heap(heap, 0, last, v, key)
    order[:middle] = heap
    return order


def token_probabilities(row: np.ndarray, n_top: int) -> tuple[np.ndarray, np.ndarray]:
    """get_token_probabilities(ctx, idx, n_top): (ids i32, p f32) over the whole row, in the order
    the partial sort left them."""
    x = np.ascontiguousarray(row, np.float32)
    n_top = min(max(n_top, 0), len(x))
    order = partial_sort_order(x, n_top)
    logit = x[order]
    max_l = logit[0] if n_top > 0 else np.float32(np.max(x))
    e = libm.expf(logit - max_l)
    total = e.cumsum(dtype=np.float32)[-1]          # float cum_sum += p, in order
    return order, e / total


def pre_sampling(row: np.ndarray, tok: int, n_probs: int) -> TokenProbs:
    ids, p = token_probabilities(row, n_probs)
    hit = np.flatnonzero(ids == tok)
    prob = float(p[hit[0]]) if len(hit) else 1.0
    n = min(len(ids), n_probs)
    return TokenProbs(tok, prob, list(zip(ids[:n].tolist(), p[:n].tolist())))


def post_sampling(sampler, tok: int, n_probs: int) -> TokenProbs:
    ids, p = sampler.candidates()
    hit = np.flatnonzero(ids == tok)
    prob = float(p[hit[0]]) if len(hit) else 1.0
    top = []
    for i in range(min(len(ids), n_probs)):
        if p[i] == 0.0:
            break
        top.append((int(ids[i]), float(p[i])))
    return TokenProbs(tok, prob, top)


def logarithm(p: float) -> float:
    """completion_token_output::logarithm: std::log in float; 0 gives the lowest float (JSON has no -inf)."""
    if p == 0.0:
        return float(-np.finfo(np.float32).max)
    return float(libm.logf(np.array([p], np.float32))[0])
