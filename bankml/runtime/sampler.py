"""llama.cpp's sampler chain, bit for bit: common/sampling.cpp's common_sampler.

    s = Sampler(SamplerParams(temp=0.8), seed=42, tokenizer=tok)
    s.accept(prompt_ids)                # the history penalties and DRY look at
    tok = s.sample(logits_row)          # one token id, accepted; the RNG state carries to the next call

The chain (common_sampler_init) is logit bias, then params.samplers in order (common.h's
default: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature (temp_ext:
dynamic temperature)), then dist; or, with mirostat 1 or 2, temperature and mirostat alone. At
their off values the samplers are llama.cpp's empty samplers and are skipped here too. The
history samplers (logit bias, penalties, DRY) are in sampler_history.py.
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
from dataclasses import dataclass

import numpy as np

from bankml.backends.llvm import stdsort as native
from bankml.numerics import libm
from bankml.runtime import sampler_history as history

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
f32 = np.float32


# common_sampler_type_to_str names, in common_params_sampling.samplers' default order
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
OTHER_SAMPLERS = ("infill", "adaptive_p")      # common knows them; bankml does not implement them


@dataclass(frozen=True)
class SamplerParams:
    """common_params_sampling's fields that the chain reads (defaults as in common/common.h)."""
    temp: float = 0.8           # <= 0: the highest logit (greedy)
    dynatemp_range: float = 0.0     # <= 0: off (plain temp)
    dynatemp_exponent: float = 1.0
    top_k: int = 40             # <= 0: off
    top_p: float = 0.95         # 1.0: off
    min_p: float = 0.05         # 0.0: off
    min_keep: int = 0           # the samplers take it as a size_t (a negative one keeps everything)
    typical_p: float = 1.0      # >= 1.0: off
    top_n_sigma: float = -1.0   # <= 0: off
    xtc_probability: float = 0.0    # <= 0: off
    xtc_threshold: float = 0.1      # > 0.5: off
    repeat_last_n: int = 64         # penalty_last_n; <= 0: off (llama_sampler_init_penalties: max(n, 0))
    repeat_penalty: float = 1.0     # penalty_repeat; 1.0 (with freq and present 0): off
    frequency_penalty: float = 0.0  # penalty_freq
    presence_penalty: float = 0.0   # penalty_present
    dry_multiplier: float = 0.0     # 0.0: off
    dry_base: float = 1.75          # < 1.0: off
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64    # <= 0: off (llama_sampler_init_dry: max(n, 0))
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    mirostat: int = 0               # 0 off, 1 mirostat, 2 mirostat 2.0 (then only temp and it run)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: tuple[tuple[int, float], ...] = ()     # (token, bias), in order; -inf bans
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS

    def __post_init__(self):
        """What common_sampler_init refuses (throws or asserts on), as ValueError."""
        for name in ("dry_sequence_breakers", "samplers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias))
        with np.errstate(all="ignore"):
            rp = f32(self.repeat_penalty)
            if not (np.isfinite(rp) and rp > 0 and np.isfinite(f32(1) / rp)):
                raise ValueError(f"sampler repeat_penalty={self.repeat_penalty}: must be finite and greater than 0")
            for name in ("frequency_penalty", "presence_penalty"):
                if not np.isfinite(f32(getattr(self, name))):
                    raise ValueError(f"sampler {name}={getattr(self, name)}: must be finite")
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"sampler mirostat={self.mirostat}: llama.cpp knows 0 (off), 1 and 2")
        for name in self.samplers:
            if name in OTHER_SAMPLERS:
                raise ValueError(f"sampler {name!r}: bankml does not implement it; use {' '.join(DEFAULT_SAMPLERS)}")
            if name not in DEFAULT_SAMPLERS:
                raise ValueError(f"sampler {name!r}: unknown; llama.cpp's are {' '.join(DEFAULT_SAMPLERS + OTHER_SAMPLERS)}")


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


# ---------------------------------------------------------------- the chain

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
    the sort that was current when the sum stopped."""
    if p >= 1.0:
        return
    _softmax(c)
    n = len(c.ids)
    first = None                                    # positions of the adaptive top-256 sort
    if not c.sorted and n > 1024:
        first = bucket_partial_sort(c.logit, min(256, n))
    elif not c.sorted:
        c.sort_top(n)
    p32 = np.float32(p)
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
    when that keeps too few) the first ones down to the first below the cut past min_keep."""
    if p <= 0.0 or not len(c.ids):
        return
    log_p = _logf(p)
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
    (a later one only when strictly higher; NaN never is) and sets every other to -inf."""
    if temp == 1.0 or not len(c.ids):
        return
    if temp <= 0.0:
        best = 0 if np.isnan(c.logit[0]) else int(np.argmax(np.where(np.isnan(c.logit), -np.inf, c.logit)))
        out = np.full(len(c.ids), -np.inf, np.float32)
        out[best] = c.logit[best]
        c.logit = out
        return
    c.logit = c.logit / np.float32(temp)


def dist(c: Candidates, rng: MT19937) -> int:
    """llama_sampler_dist_apply: c.selected, and its token, is the one whose running double sum of expf(l - max) (f32 values)
    first reaches sum * U[0, 1); U is drawn even for a single candidate. Each p becomes the f32
    value divided by that double sum (1 for a single candidate): c.weights and c.total hold them
    until Sampler.candidates() asks."""
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


# ---------------------------------------------------------------- mirostat

def discrete(p: np.ndarray, rng: MT19937) -> int:
    """llama_sample_dist: std::discrete_distribution<int> over the f32 p (libstdc++): fewer than
    two weights give 0 without a draw; else each weight in double over their in-order double sum,
    the running sums of those (the last set to 1), and the first that reaches U[0, 1)."""
    if len(p) < 2:
        return 0
    w = p.astype(np.float64)
    cp = (w / w.cumsum()[-1]).cumsum()
    cp[-1] = 1.0
    return int(np.searchsorted(cp, rng.canonical(), side="left"))


def c_int(x: np.float32) -> int:
    """int(float) on x86 (cvttss2si): truncation; NaN and values out of int32 give INT_MIN."""
    return int(x) if np.isfinite(x) and -2.0 ** 31 <= x < 2.0 ** 31 else -2 ** 31


@functools.cache
def _mirostat_t(m: int) -> np.ndarray:
    """t_i = logf(float(i + 2) / float(i + 1)) for i < m - 1."""
    i = np.arange(max(m - 1, 0), dtype=np.float32)
    t = libm.logf((i + f32(2)) / (i + f32(1)))
    t.flags.writeable = False
    return t


class Mirostat:
    """llama_sampler_mirostat (v1) and llama_sampler_mirostat_v2: they pick the token (cur_p->selected)
    with their own RNG, and mu (2 * tau at the start and on reset) follows the surprise of each
    pick: mu - eta * (-log2f(p) - tau), in f32. Mirostat 1's n_vocab (llama_vocab_n_tokens) is the
    row's length: set_logits makes one candidate per vocabulary token, and temp before it keeps them all."""

    def __init__(self, version: int, seed: int, tau: float, eta: float, m: int = 100):
        self.version, self.m = version, m
        self.seed, self.tau, self.eta = seed, f32(tau), f32(eta)
        self.reset()

    def reset(self) -> None:
        self.mu = f32(2) * self.tau
        self.rng = MT19937(_rng_seed(self.seed))

    def accept(self, token: int) -> None:
        pass

    def apply(self, c: Candidates) -> None:
        _softmax_sorted(c)
        if self.version == 1:
            self._top_k(c)
        else:
            surprise = -libm.log2f(c.p)
            cut = _first(surprise > self.mu)
            c.keep(slice(0, max(len(c.ids) if cut is None else cut, 1)))
        _softmax_sorted(c)
        idx = discrete(c.p, self.rng)
        c.selected, c.weights, c.total = idx, c.p, 1.0
        e = -libm.log2f(c.p[idx:idx + 1])[0] - self.tau
        self.mu = f32(self.mu - self.eta * e)

    def _top_k(self, c: Candidates) -> None:
        """Mirostat 1: s_hat from the top m p (f32 sums of t_i * b_i and t_i^2, b_i = logf(p_i /
        p_i+1)), k = powf(eps * powf(2, mu) / (1 - powf(n_vocab, -eps)), 1 / s_hat) with eps =
        s_hat - 1, then llama_sampler_top_k_impl(max(int(k), 1))."""
        n_vocab, n = len(c.ids), min(self.m - 1, len(c.ids) - 1)
        t = _mirostat_t(self.m)[:n]
        with np.errstate(all="ignore"):
            b = libm.logf(c.p[:n] / c.p[1:n + 1])
            sum_ti_bi = _cumsum_f32(t * b)[-1] if n else f32(0)
            sum_ti_sq = _cumsum_f32(t * t)[-1] if n else f32(0)
            s_hat = f32(sum_ti_bi / sum_ti_sq)
            eps = f32(s_hat - f32(1))
            num = f32(eps * libm.powf(2.0, self.mu))
            den = f32(f32(1) - libm.powf(float(f32(n_vocab)), -eps))
            k = libm.powf(num / den, f32(1) / s_hat)
        top_k(c, max(c_int(k), 1))


# ---------------------------------------------------------------- the chain

class _Filter:
    """A stateless llama_sampler of the chain: apply is fn(c, *args)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def apply(self, c: Candidates) -> None:
        self.fn(c, *self.args)

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class _Seeded(_Filter):
    """xtc and dist: their RNG is std::mt19937(get_rng_seed(seed)), made again on reset."""

    def __init__(self, fn, seed: int, *args):
        super().__init__(fn, *args)
        self.seed = seed
        self.reset()

    def apply(self, c: Candidates) -> None:
        self.fn(c, *self.args, self.rng)

    def reset(self) -> None:
        self.rng = MT19937(_rng_seed(self.seed))


def _chain(p: SamplerParams, seed: int, tokenizer) -> list:
    """common_sampler_init's chain: logit bias first (params.logit_bias, then -inf for each of the
    vocabulary's suppress tokens), then params.samplers in their order and dist, or temp and
    mirostat. Off samplers (llama.cpp's empty ones) are left out."""
    keep = p.min_keep % 2 ** 64                     # common_params_sampling's int32 as the size_t samplers take it
    steps: list = []
    biases = list(p.logit_bias) + [(t, -np.inf) for t in getattr(tokenizer, "suppress_tokens", ())]
    if biases:
        steps.append(history.LogitBias(biases))
    if p.mirostat:
        steps.append(_Filter(temperature, p.temp))
        steps.append(Mirostat(p.mirostat, seed, p.mirostat_tau, p.mirostat_eta))
        return steps
    for name in p.samplers:
        if name == "penalties":
            last_n = max(p.repeat_last_n, 0)
            if not history.Penalties.disabled(last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty):
                steps.append(history.Penalties(last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        elif name == "dry":
            last_n = max(p.dry_penalty_last_n, 0)
            if not history.Dry.disabled(p.dry_multiplier, p.dry_base, last_n):
                if tokenizer is None:
                    raise ValueError("sampler dry_multiplier: DRY needs the model's vocabulary; pass Sampler(..., tokenizer=)")
                breakers = history.dry_breakers(tokenizer, p.dry_sequence_breakers)
                steps.append(history.Dry(p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n, breakers))
        elif name == "top_n_sigma":
            steps.append(_Filter(top_n_sigma, p.top_n_sigma))
        elif name == "top_k":
            steps.append(_Filter(top_k, p.top_k))
        elif name == "typ_p":
            steps.append(_Filter(typical, p.typical_p, keep))
        elif name == "top_p":
            steps.append(_Filter(top_p, p.top_p, keep))
        elif name == "min_p":
            steps.append(_Filter(min_p, p.min_p, keep))
        elif name == "xtc":
            steps.append(_Seeded(xtc, seed, p.xtc_probability, p.xtc_threshold, keep))
        elif name == "temperature":
            steps.append(_Filter(temp_ext, p.temp, p.dynatemp_range, p.dynatemp_exponent))
    steps.append(_Seeded(dist, seed))
    return steps


class Sampler:
    """One generation's sampler chain, common/sampling.cpp's common_sampler: its samplers' RNGs
    and histories are its state.

        s = Sampler(params, seed, tokenizer=tok)     # tok: DRY's sequence breakers need the vocabulary
        s.accept(prompt_ids)                         # common_sampler_accept(tok, false) each
        tok = s.sample(row)                          # the chain, then the token accepted
        s.reset()                                    # llama_sampler_reset: RNGs re-seeded, history cleared

    n_ctx is taken for the server's sake and unused: b11434 never maps a negative last_n to the
    context size (llama_sampler_init_penalties and _dry make it 0, off)."""

    def __init__(self, params: SamplerParams = SamplerParams(), seed: int = LLAMA_DEFAULT_SEED, *,
                 tokenizer=None, n_ctx: int | None = None):
        self.params, self.seed = params, seed
        self.steps = _chain(params, seed, tokenizer)
        self._last: Candidates | None = None

    def accept(self, ids) -> None:
        """llama_sampler_accept of the chain for each token, in order."""
        for token in ids:
            token = int(token)
            for step in self.steps:
                step.accept(token)

    def sample(self, logits: np.ndarray) -> int:
        c = self._last = Candidates(logits)
        for step in self.steps:
            step.apply(c)
        token = int(c.ids[c.selected])
        self.accept([token])
        return token

    def reset(self) -> None:
        for step in self.steps:
            step.reset()

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """common_sampler_get_candidates(smpl, do_sort=true) after the last sample(): the candidates
        the chain left (ids i32) with the p dist (or mirostat) gave them (f32); when the chain left
        them unsorted, std::sort by p descending (the native introsort: equal p in its order)."""
        c = self._last
        if c is None or c.weights is None:
            raise ValueError("candidates(): no token sampled yet")
        p = (c.weights.astype(np.float64) / c.total).astype(np.float32)
        if c.sorted:
            return c.ids.copy(), p
        order = _positions(len(p)).copy()
        native.std_sort(p, order)
        return c.ids[order], p


def _rng_seed(seed: int) -> int:
    """get_rng_seed: LLAMA_DEFAULT_SEED draws one from std::random_device, each time it is asked."""
    return random.SystemRandom().getrandbits(32) if seed == LLAMA_DEFAULT_SEED else seed


def greedy(logits: np.ndarray) -> int:
    """The token llama.cpp's chain picks at temperature 0 (first of the highest logits after top-k)."""
    return Sampler(GREEDY, seed=0).sample(logits)
