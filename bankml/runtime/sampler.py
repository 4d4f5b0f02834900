"""llama.cpp's sampler chain, bit for bit: greedy and common/sampling.cpp's default chain.

    s = Sampler(SamplerParams(temp=0.8), seed=42)
    tok = s.sample(logits_row)          # one token id; the RNG state carries to the next call

The default chain (common/common.h) is penalties, dry, top_n_sigma, top_k, typical_p, top_p,
min_p, xtc, temperature, then dist. At their defaults penalties, dry, top_n_sigma, typical_p and
xtc are llama.cpp's empty samplers; SamplerParams accepts only those off values for them.
Each step follows src/llama-sampler.cpp: float32 math in llama.cpp's order, glibc's expf/logf,
libstdc++'s std::partial_sort (its heap order decides ties) and std::mt19937 with
std::uniform_real_distribution<double> (generate_canonical, two 32-bit draws).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from bankml.numerics import libm
from bankml.numerics.stdsort import partial_sort, std_sort

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
f32 = np.float32


@dataclass(frozen=True)
class SamplerParams:
    """common_params_sampling's fields that the chain reads (defaults as in common/common.h)."""
    temp: float = 0.8           # <= 0: the highest logit (greedy)
    top_k: int = 40             # <= 0: off
    top_p: float = 0.95         # 1.0: off
    min_p: float = 0.05         # 0.0: off
    min_keep: int = 0
    typical_p: float = 1.0      # only 1.0 (off)
    repeat_penalty: float = 1.0  # only off values for penalties, dry, xtc, top_n_sigma
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    top_n_sigma: float = -1.0

    def __post_init__(self):
        off = {"typical_p": 1.0, "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
               "dry_multiplier": 0.0, "xtc_probability": 0.0}
        for name, value in off.items():
            if getattr(self, name) != value:
                raise ValueError(f"sampler {name}={getattr(self, name)}: bankml's sampler supports only "
                                 f"{name}={value} (off), llama.cpp's default")
        if self.top_n_sigma > 0:
            raise ValueError("sampler top_n_sigma: bankml's sampler supports only top_n_sigma <= 0 (off)")


GREEDY = SamplerParams(temp=0.0)


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
    """llama_token_data_array_partial_sort (src/llama-sampler.cpp): indices of the top npartial
    (and the rest of the last bucket they reach), bucketed by logit in 128 buckets over
    [-10, 10] (f32 mul then add: libllama has no FMA), each bucket gathered in index order,
    std::sort'ed, the last one std::partial_sort'ed. A bucket without equal logits sorts the
    same in any algorithm, so only those with ties run the libstdc++ port."""
    lg = np.asarray(logits, np.float32)
    f = np.float32(6.4) * lg + np.float32(64.0)       # bucket_scale * val + bucket_inter, in f32
    ib_all = np.clip(np.trunc(np.nan_to_num(f, nan=0.0, posinf=1e9, neginf=-1e9)), 0, 127).astype(np.int64)
    histo = np.bincount(ib_all, minlength=128)
    have = np.cumsum(histo[::-1])
    ib = 127 - int(np.searchsorted(have, npartial))   # the first bucket (from the top) reaching npartial
    ib = max(ib, 0)
    out, done = [], 0
    for j in range(127, ib - 1, -1):
        idx = np.flatnonzero(ib_all == j)             # gathered in index order
        vals = lg[idx]
        if j > ib:
            out.append(_sorted_like_std(idx, vals, None))
            done += len(idx)
        else:
            out.append(_sorted_like_std(idx, vals, npartial - done))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _sorted_like_std(idx: np.ndarray, vals: np.ndarray, middle: int | None) -> np.ndarray:
    """std::sort (middle None) or std::partial_sort(first, first + middle, last) of one bucket (a
    heap sort even when middle is the whole bucket); the caller keeps the first `middle`."""
    if len(np.unique(vals)) == len(vals):             # no ties: the order of the first `middle` is the sorted one
        return idx[np.argsort(-vals, kind="stable")]
    a = idx.tolist()
    key = dict(zip(a, vals.tolist())).__getitem__
    if middle is None:
        std_sort(a, key)
    else:
        partial_sort(a, middle, key)
    return np.asarray(a, np.int64)


# ---------------------------------------------------------------- the chain

class Candidates:
    """llama_token_data_array: ids, logits (f32), p (f32), sorted."""

    def __init__(self, logits: np.ndarray):
        self.ids = np.arange(len(logits), dtype=np.int64)
        self.logit = np.ascontiguousarray(logits, np.float32).copy()
        self.p = np.zeros(len(logits), np.float32)
        self.sorted = False

    def keep(self, order) -> None:
        self.ids, self.logit, self.p = self.ids[order], self.logit[order], self.p[order]

    def sort_top(self, n: int) -> None:
        """llama_token_data_array_partial_sort_inplace(cur_p, n)."""
        idx = list(range(len(self.ids)))
        lg = self.logit.tolist()
        if n <= 128:
            partial_sort(idx, n, lg.__getitem__)
            idx = idx[:n]
        else:                                       # the bucketed sort of larger selections
            idx = bucket_partial_sort(self.logit, n)[:n]
        self.keep(np.asarray(idx, np.int64))
        self.sorted = True


def _softmax(c: Candidates) -> None:
    """llama_sampler_softmax_impl(cur_p, do_sort=false) on sorted candidates."""
    e = libm.expf(c.logit - c.logit[0] if c.sorted else c.logit - c.logit.max())
    total = f32(0)
    for v in e:
        total = f32(total + v)
    c.p = (e / total).astype(np.float32)


def top_k(c: Candidates, k: int) -> None:
    if k <= 0:
        return
    k = min(k, len(c.ids))
    if not c.sorted:
        c.sort_top(k)
    c.keep(slice(0, k))


def top_p(c: Candidates, p: float, min_keep: int) -> None:
    if p >= 1.0:
        return
    _softmax(c)
    if not c.sorted:
        c.sort_top(len(c.ids))
    p32, total, last = f32(p), f32(0), len(c.ids)
    for i, v in enumerate(c.p):
        total = f32(total + v)
        if total >= p32 and i + 1 >= min_keep:
            last = i + 1
            break
    c.keep(slice(0, last))


def min_p(c: Candidates, p: float, min_keep: int) -> None:
    if p <= 0.0 or not len(c.ids):
        return
    log_p = libm.logf(np.array([p], np.float32))[0]
    if not c.sorted:
        cut = f32(c.logit.max() + log_p)
        mask = c.logit >= cut
        if mask.any() and mask.sum() >= min_keep:
            c.keep(np.nonzero(mask)[0])
            return
        c.sort_top(len(c.ids))
    cut = f32(c.logit[0] + log_p)
    i = 1
    while i < len(c.ids) and not (c.logit[i] < cut and i >= min_keep):
        i += 1
    c.keep(slice(0, i))


def temperature(c: Candidates, temp: float) -> None:
    """llama_sampler_temp_impl."""
    if temp == 1.0 or not len(c.ids):
        return
    if temp <= 0.0:
        best = 0
        for i in range(1, len(c.ids)):
            if c.logit[i] > c.logit[best]:
                c.logit[best] = -np.inf
                best = i
            else:
                c.logit[i] = -np.inf
        return
    c.logit = (c.logit / f32(temp)).astype(np.float32)


def dist(c: Candidates, rng: MT19937) -> int:
    """llama_sampler_dist_apply: the token whose running sum first reaches sum * U[0, 1)."""
    if len(c.ids) == 0:
        raise ValueError("no candidate tokens left to sample")
    rnd = rng.canonical()
    if len(c.ids) == 1:
        return int(c.ids[0])
    max_l = c.logit[0] if c.sorted else c.logit.max()
    e = libm.expf((c.logit - max_l).astype(np.float32)).tolist()   # exact f32 values as floats
    total = 0.0
    for v in e:
        total += v
    target, run = total * rnd, 0.0
    for i, v in enumerate(e):
        run += v
        if run >= target:
            return int(c.ids[i])
    return int(c.ids[-1])


class Sampler:
    """One generation's sampler chain (the dist RNG is its state)."""

    def __init__(self, params: SamplerParams = SamplerParams(), seed: int = LLAMA_DEFAULT_SEED):
        if seed == LLAMA_DEFAULT_SEED:
            seed = random.SystemRandom().getrandbits(32)   # llama.cpp: std::random_device
        self.params, self.seed, self.rng = params, seed, MT19937(seed)

    def sample(self, logits: np.ndarray) -> int:
        p = self.params
        c = Candidates(logits)
        top_k(c, p.top_k)
        top_p(c, p.top_p, p.min_keep)
        min_p(c, p.min_p, p.min_keep)
        temperature(c, p.temp)
        return dist(c, self.rng)


def greedy(logits: np.ndarray) -> int:
    """The token llama.cpp's chain picks at temperature 0 (first of the highest logits after top-k)."""
    return Sampler(GREEDY, seed=0).sample(logits)
