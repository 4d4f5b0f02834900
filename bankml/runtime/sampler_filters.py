"""The stateless samplers of llama.cpp's chain and what they share: llama_token_data_array
(Candidates), std::mt19937, the sorts, softmax; top-k, top-p, min-p, temperature, dist, typical,
top-n-sigma, XTC, dynamic temperature. bankml/runtime/sampler.py chains them.

Each step follows src/llama-sampler.cpp: float32 math in llama.cpp's order, glibc's expf/logf,
libstdc++'s std::partial_sort and std::sort (their heap and introsort moves decide the order of
equal logits) and std::mt19937 with std::uniform_real_distribution<double> (generate_canonical,
two 32-bit draws).

Per token only the sorts touch the whole row, and they run as native code over all of it
(bankml/backends/llvm/stdsort.py: the heap's layout depends on every element that entered it, so
no pre-selection of the top k gives the same order of ties). What follows works on the k kept
candidates with numpy: elementwise f32 operations round as C's, and numpy's cumsum (add.accumulate)
is the running sum `s += x[i]` in order, f32 or double as llama.cpp declares it.
"""
from __future__ import annotations

import functools
import random

import numpy as np

from bankml.backends.llvm import stdsort as native
from bankml.numerics import libm

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
f32 = np.float32


class MT19937:
    """std::mt19937(seed): Python's Mersenne Twister with the state std::seed_seq-free seeding gives."""

    def __init__(self, seed: int):
        mt = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
        self._r = random.Random()
        self._r.setstate((3, (*mt, 624), None))

    def __call__(self) -> int:
        return self._r.getrandbits(32)

    def canonical(self) -> float:
        """std::generate_canonical<double, 53>: (g1 + g2 * 2^32) / 2^64 in double."""
        s = float(self()) + float(self()) * 4294967296.0
        r = s / 18446744073709551616.0
        return r if r < 1.0 else float(np.nextafter(1.0, 0.0))


def bucket_partial_sort(logits: np.ndarray, npartial: int) -> np.ndarray:
    """llama_token_data_array_partial_sort (src/llama-sampler.cpp): positions (i32) of the top
    npartial, in its order. The logits are bucketed in 128 buckets over [-10, 10] (f32 mul then
    add: libllama has no FMA) down to the first bucket that reaches npartial, each bucket gathered
    in index order; then std::sort of each bucket and std::partial_sort of the last (native:
    backends/llvm/stdsort.py). The histogram and the gathering are numpy (a stable sort by
    bucket keeps index order within one)."""
    lg = np.ascontiguousarray(logits, np.float32)
    f = np.float32(6.4) * lg + np.float32(64.0)       # bucket_scale * val + bucket_inter, in f32
    # int(f) truncates; NaN and f >= 2^31 give INT_MIN on x86 (cvttss2si), clamped to bucket 0
    fits = f < np.float32(2.0 ** 31)
    ib_all = np.clip(np.trunc(np.where(fits, f, np.float32(0))), 0, 127).astype(np.uint8)
    histo = np.bincount(ib_all, minlength=128)
    have = np.cumsum(histo[::-1])
    ib = max(127 - int(np.searchsorted(have, npartial)), 0)    # the first bucket (from the top) reaching npartial
    pos = np.flatnonzero(ib_all >= ib)
    pos = pos[np.argsort(np.uint8(127) - ib_all[pos], kind="stable")].astype(np.int32)
    keys = lg[pos]
    native.sort_buckets(keys, pos, histo[::-1][:128 - ib], npartial)
    return pos[:npartial]



# ---------------------------------------------------------------- candidates

@functools.cache
def _positions(n: int) -> np.ndarray:
    ids = np.arange(n, dtype=np.int32)
    ids.flags.writeable = False
    return ids


class Candidates:
    """llama_token_data_array: ids (i32), logits (f32), p (f32, once a softmax set it), sorted.
    The arrays are never written in place (the first logits are the caller's row)."""

    def __init__(self, logits: np.ndarray):
        self.logit = np.ascontiguousarray(logits, np.float32)
        self.ids = _positions(len(self.logit))
        self.p: np.ndarray | None = None
        self.sorted = False
        self.weights: np.ndarray | None = None      # dist's expf(l - max) and their double sum
        self.total = 0.0
        self.selected: int | None = None            # cur_p->selected: the position dist (or mirostat) picked

    def keep(self, order) -> None:
        self.ids, self.logit = self.ids[order], self.logit[order]
        if self.p is not None:
            self.p = self.p[order]

    def sort_top(self, n: int) -> None:
        """llama_token_data_array_partial_sort_inplace(cur_p, n)."""
        self.keep(top_positions(self.logit, n))
        self.sorted = True


def top_positions(logits: np.ndarray, n: int) -> np.ndarray:
    """The positions llama_token_data_array_partial_sort_inplace(cur_p, n) leaves first, in order:
    std::partial_sort up to 128, the bucketed sort above."""
    return native.partial_sort(logits, n) if n <= 128 else bucket_partial_sort(logits, n)


def _max_logit(x: np.ndarray, init=None) -> np.float32:
    """max_l = std::max(max_l, x[i]) from max_l = init (or x[0]): a NaN never replaces the max."""
    m = np.fmax.reduce(x)
    if init is None:
        return x[0] if np.isnan(x[0]) else m
    return init if not m > init else m


def _cumsum_f32(x: np.ndarray) -> np.ndarray:
    """The running f32 sums of `s += x[i]`: numpy's add.accumulate is that loop, in order
    (np.sum is pairwise, not this)."""
    return x.cumsum(dtype=np.float32)


def _softmax(c: Candidates) -> None:
    """llama_sampler_softmax_impl(cur_p, do_sort=false): expf(l - max) (glibc), their f32 sum in
    order, each divided by it."""
    max_l = c.logit[0] if c.sorted else _max_logit(c.logit)
    e = libm.expf(c.logit - max_l)
    c.p = e / _cumsum_f32(e)[-1]


def top_k(c: Candidates, k: int) -> None:
    """llama_sampler_top_k_impl."""
    if k <= 0:
        return
    k = min(k, len(c.ids))
    if not c.sorted:
        c.sort_top(k)
    c.keep(slice(0, k))


def _first(hit: np.ndarray) -> int | None:
    """The first index where hit is true, or None."""
    i = int(hit.argmax()) if len(hit) else 0
    return i if len(hit) and hit[i] else None


def _at_least(n: int, min_keep: int, start: int) -> np.ndarray | bool:
    """index + start >= min_keep over n indices (True when every one is)."""
    return True if min_keep <= start else np.arange(start, start + n) >= min_keep


def top_p(c: Candidates, p: float, min_keep: int) -> None:
    """llama_sampler_top_p_apply: keep the first tokens whose f32 running sum of p reaches p (and
    at least min_keep). Unsorted above 1,024 candidates it sorts the top 256 first (bucketed) and
    the whole array only when the sum gets past them: the p values in order are the same in both
    (the same sorted values), only the order of equal logits can differ, so the kept ids come from
    the sort that was current when the sum stopped. p is a float, as the sampler keeps it."""
    p32 = np.float32(p)
    if p32 >= 1:
        return
    _softmax(c)
    n = len(c.ids)
    first = None                                    # positions of the adaptive top-256 sort
    if not c.sorted and n > 1024:
        first = bucket_partial_sort(c.logit, min(256, n))
    elif not c.sorted:
        c.sort_top(n)
    head = c.p[first] if first is not None else c.p
    last = _first((_cumsum_f32(head) >= p32) & _at_least(len(head), min_keep, 1))
    if last is not None and first is not None:
        c.keep(first[:last + 1])
        c.sorted = True
        return
    if last is None and first is not None:          # past the top 256: the whole array, sorted
        c.sort_top(n)
        last = _first((_cumsum_f32(c.p) >= p32) & _at_least(n, min_keep, 1))
    c.keep(slice(0, n if last is None else last + 1))


@functools.cache
def _logf(p: float) -> np.float32:
    return libm.logf(np.array([p], np.float32))[0]


def min_p(c: Candidates, p: float, min_keep: int) -> None:
    """llama_sampler_min_p_apply: logits at least max + logf(p) (f32), in their order; sorted (or
    when that keeps too few) the first ones down to the first below the cut past min_keep. p is a
    float, as the sampler keeps it."""
    p32 = np.float32(p)
    if p32 <= 0 or not len(c.ids):
        return
    log_p = _logf(float(p32))
    if not c.sorted:
        cut = np.float32(_max_logit(c.logit, np.float32(-np.finfo(np.float32).max)) + log_p)
        mask = c.logit >= cut
        kept = int(np.count_nonzero(mask))
        if kept and kept >= min_keep:
            c.keep(np.flatnonzero(mask))
            return
        c.sort_top(len(c.ids))
    cut = np.float32(c.logit[0] + log_p)
    stop = _first((c.logit[1:] < cut) & _at_least(len(c.ids) - 1, min_keep, 1))
    c.keep(slice(0, len(c.ids) if stop is None else stop + 1))


def temperature(c: Candidates, temp: float) -> None:
    """llama_sampler_temp_impl: logits / temp in f32; temp <= 0 keeps the first of the highest
    (a later one only when strictly higher; NaN never is) and sets every other to -inf. temp is a
    float, as the sampler keeps it."""
    temp = np.float32(temp)
    if temp == 1 or not len(c.ids):
        return
    if temp <= 0:
        best = 0 if np.isnan(c.logit[0]) else int(np.argmax(np.where(np.isnan(c.logit), -np.inf, c.logit)))
        out = np.full(len(c.ids), -np.inf, np.float32)
        out[best] = c.logit[best]
        c.logit = out
        return
    c.logit = c.logit / temp


def dist(c: Candidates, rng: MT19937) -> int:
    """llama_sampler_dist_apply: c.selected, and its token, is the one whose running double sum of
    expf(l - max) (f32 values) first reaches sum * U[0, 1); U is drawn even for a single candidate.
    Each p becomes the f32 value divided by that double sum (1 for a single candidate): c.weights
    and c.total hold them until Sampler.candidates() asks."""
    if len(c.ids) == 0:
        raise ValueError("no candidate tokens left to sample")
    rnd = rng.canonical()
    if len(c.ids) == 1:
        c.weights, c.total, c.selected = np.ones(1, np.float32), 1.0, 0
        return int(c.ids[0])
    max_l = c.logit[0] if c.sorted else _max_logit(c.logit)
    e = libm.expf(c.logit - max_l)
    run = e.cumsum(dtype=np.float64)                # sum_cum += p, in order
    c.weights, c.total = e, run[-1]
    i = _first(run >= run[-1] * rnd)
    c.selected = len(c.ids) - 1 if i is None else i
    return int(c.ids[c.selected])


# ---------------------------------------------------------------- filters: typical, top-n-sigma, xtc, dynamic temperature

def _softmax_sorted(c: Candidates) -> None:
    """llama_sampler_softmax_impl(cur_p, do_sort=true): the whole array sorted first (the bucketed
    sort above 128 candidates), then the softmax."""
    if not c.sorted:
        c.sort_top(len(c.ids))
    _softmax(c)


def top_n_sigma(c: Candidates, n: float) -> None:
    """llama_sampler_top_n_sigma_apply: over the logits other than -inf (NaN counts), the max
    (std::max from the first logit, whatever it is), the f32 mean of their in-order f32 sum, and
    the f32 sum of (double)(l - mean)^2 (pow(float, 2) is in double, each add rounded to float);
    std = sqrt in double of that / count. Logits below max - n * std become -inf, in place."""
    n32 = f32(n)
    if n32 <= 0 or len(c.ids) <= 1:
        return
    x = c.logit
    finite = x != -np.inf
    xv = x if finite.all() else x[finite]
    count = len(xv)
    max_l, mean, std = x[0], f32(0), f32(0)
    if count:
        max_l = _max_logit(xv, x[0])
        mean = _cumsum_f32(xv)[-1] / f32(count)
        d = (xv - mean).astype(np.float64)
        std = f32(np.sqrt(np.float64(libm.sum_f32_of_f64(d * d) / f32(count))))
    cut = f32(max_l - n32 * std)
    below = x < cut
    if below.any():
        c.logit = np.where(below, f32(-np.inf), x)


def typical(c: Candidates, p: float, min_keep: int) -> None:
    """llama_sampler_typical_apply: softmax (sorted), entropy as the f32 running sum of -p * logf(p)
    (NaN once a p is 0), shifted scores |-logf(p) - entropy|, std::sort of the indices by them
    (ascending: the native introsort on the negated scores, comp -a > -b being a < b for every
    float, NaN included), then the first tokens in that order whose f32 running sum of p passes p
    (and at least min_keep). The kept tokens are in score order: unsorted."""
    p32 = f32(p)
    if p32 >= 1.0:
        return
    _softmax_sorted(c)
    log_p = libm.logf(c.p)
    with np.errstate(invalid="ignore"):                 # -0 * logf(0) is NaN, as in C
        entropy = _cumsum_f32(-c.p * log_p)[-1]
    keys, order = -np.abs(-log_p - entropy), _positions(len(c.ids)).copy()
    native.std_sort(keys, order)
    last = _first((_cumsum_f32(c.p[order]) > p32) & _at_least(len(order), min_keep, 1))
    c.keep(order if last is None else order[:last + 1])
    c.sorted = False


def uniform_f32(rng: MT19937) -> np.float32:
    """std::uniform_real_distribution<float>(0, 1): generate_canonical<float, 24>, one 32-bit draw,
    float(g) * 2^-32 in float (a float(g) that rounds up to 2^32 gives the float below 1)."""
    r = f32(rng()) * f32(2.0 ** -32)
    return r if r < 1 else np.nextafter(f32(1), f32(0))


def xtc(c: Candidates, probability: float, threshold: float, min_keep: int, rng: MT19937) -> None:
    """llama_sample_xtc_apply: with two or more candidates, a draw from its own RNG; when it is at
    most the probability, softmax (sorted) and drop the leading tokens with p >= threshold but the
    last of them, unless that leaves fewer than min_keep."""
    if f32(probability) <= 0 or f32(threshold) > 0.5 or len(c.ids) < 2:
        return
    if uniform_f32(rng) > f32(probability):
        return
    _softmax_sorted(c)
    run = _first(~(c.p >= f32(threshold)))          # the leading run with p >= threshold
    run = len(c.ids) if run is None else run
    pos_last = max(run - 1, 0)
    if len(c.ids) - pos_last >= min_keep and pos_last > 0:
        c.keep(slice(pos_last, None))


def temp_ext(c: Candidates, temp: float, delta: float, exponent: float) -> None:
    """llama_sampler_temp_ext_apply: plain temperature when delta <= 0; else, with two or more
    candidates, softmax (sorted), entropy as the f32 running sum of -p * logf(p) over p > 0,
    normalised by -logf(1 / n), dyn_temp = min_temp + (max_temp - min_temp) * powf(that, exponent)
    in f32, that temperature (greedy at <= 0), and p again in double: exp(l - l[0]) (glibc exp),
    their in-order double sum, each f32 p divided by it."""
    t, d = f32(temp), f32(delta)
    if not d > 0:
        temperature(c, t)
        return
    low = t - d
    min_temp, max_temp = (low if low > 0 else f32(0)), t + d
    n = len(c.ids)
    if n <= 1:
        return
    max_entropy = -libm.logf(np.array([f32(1) / f32(n)]))[0]
    _softmax_sorted(c)
    p = c.p[c.p > 0]
    entropy = -_cumsum_f32(p * libm.logf(p))[-1] if len(p) else f32(0)
    dyn_temp = min_temp + (max_temp - min_temp) * libm.powf(entropy / max_entropy, f32(exponent))
    temperature(c, dyn_temp)
    e = libm.exp(c.logit.astype(np.float64) - np.float64(c.logit[0]))
    c.p = (e.astype(np.float32).astype(np.float64) / e.cumsum()[-1]).astype(np.float32)


def _rng_seed(seed: int) -> int:
    """get_rng_seed: LLAMA_DEFAULT_SEED draws one from std::random_device, each time it is asked."""
    return random.SystemRandom().getrandbits(32) if seed == LLAMA_DEFAULT_SEED else seed

