"""llama.cpp's samplers with a history or a state: logit bias, penalties, DRY, mirostat 1 and 2.

Each is a step of Sampler's chain (bankml/runtime/sampler.py) with llama_sampler's calls:
apply(c) on the Candidates, reset(), and, for penalties and DRY (the two that keep a history),
accept(token) for every token the chain accepts (the prompt's and the sampled ones). They
touch only c.ids, c.logit and c.sorted, and write new arrays (the first logits are the
caller's row). Float math is f32 in src/llama-sampler.cpp's order; the
history is llama.cpp's ring_buffer (a deque with maxlen) and its token counts. Mirostat picks the
token itself, with its own RNG.
"""
from __future__ import annotations

import functools
import weakref
from collections import Counter, deque

import numpy as np

from bankml.numerics import libm
from bankml.runtime.sampler_filters import MT19937, Candidates, _cumsum_f32, _first, _rng_seed, _softmax_sorted, top_k

f32 = np.float32


def _positions_of(ids: np.ndarray, tokens) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ids, index into tokens) of the candidates whose id is one of tokens."""
    keys = np.fromiter(tokens, np.int64, len(tokens))
    order = np.argsort(keys)
    srt = keys[order]
    at = np.minimum(np.searchsorted(srt, ids), len(srt) - 1)
    pos = np.flatnonzero(srt[at] == ids)
    return pos, order[at[pos]]


class LogitBias:
    """llama_sampler_logit_bias: each (token, bias) in order adds bias (f32) to the candidate at
    position token when its id is token (twice listed, twice added); the others are searched for
    over the candidates, and there only the first entry for a token is added."""

    def __init__(self, biases):
        self.biases = [(int(t), f32(b)) for t, b in biases]

    def apply(self, c) -> None:
        logit, to_search = c.logit.copy(), []
        for token, bias in self.biases:
            if 0 <= token < len(c.ids) and c.ids[token] == token:
                logit[token] = logit[token] + bias
            else:
                to_search.append((token, bias))
        first = {}
        for token, bias in to_search:
            first.setdefault(token, bias)
        if first:
            pos, which = _positions_of(c.ids, list(first))
            logit[pos] = logit[pos] + np.array(list(first.values()), f32)[which]
        c.logit = logit

    def reset(self) -> None:
        pass


class Penalties:
    """llama_sampler_penalties over the last `last_n` accepted tokens: a candidate seen `count`
    times gets logit * repeat when logit <= 0, else logit / repeat (f32), then minus
    (f32(count) * freq + f32(1) * present), each step rounded to f32. Applying marks the
    candidates unsorted."""

    def __init__(self, last_n: int, repeat: float, freq: float, present: float):
        self.last_n, self.repeat, self.freq, self.present = last_n, f32(repeat), f32(freq), f32(present)
        self.prev: deque[int] = deque(maxlen=last_n)
        self.count: Counter[int] = Counter()

    @staticmethod
    def disabled(last_n: int, repeat: float, freq: float, present: float) -> bool:
        """llama_sampler_penalties::is_disabled (llama_sampler_init_penalties then makes an empty sampler)."""
        return last_n == 0 or (f32(repeat) == 1 and f32(freq) == 0 and f32(present) == 0)

    def accept(self, token: int) -> None:
        self.count[token] += 1
        if len(self.prev) >= self.last_n:
            old = self.prev[0]
            self.count[old] -= 1
            if self.count[old] == 0:
                del self.count[old]
        self.prev.append(token)

    def apply(self, c) -> None:
        if self.count:
            pos, which = _positions_of(c.ids, list(self.count))
            counts = np.fromiter(self.count.values(), np.int64, len(self.count))[which]
            x = c.logit[pos]
            x = np.where(x <= 0, x * self.repeat, x / self.repeat)
            x = x - (counts.astype(f32) * self.freq + f32(1) * self.present)
            logit = c.logit.copy()
            logit[pos] = x
            c.logit = logit
        c.sorted = False

    def reset(self) -> None:
        self.prev.clear()
        self.count.clear()


# ---------------------------------------------------------------- DRY

DRY_MAX_CHAR_LEN, DRY_MAX_SEQ_LEN = 40, 20     # llama_sampler_init_dry
FLOAT_MAX_LOG = f32(88.7228391)


def _token_texts(tokenizer) -> list[bytes]:
    """llama_vocab::detokenize({id}, special=true) of every token, once per tokenizer."""
    texts = _TEXTS.get(tokenizer)
    if texts is None:
        texts = _TEXTS[tokenizer] = [tokenizer.detokenize_bytes([i], False, True) for i in range(tokenizer.n_vocab)]
    return texts


_TEXTS: "weakref.WeakKeyDictionary[object, list[bytes]]" = weakref.WeakKeyDictionary()


def dry_breakers(tokenizer, breakers) -> dict[int, list[tuple[int, ...]]]:
    """The processed breakers of dry_breakers_of, once per tokenizer and breakers (read only)."""
    made = _BREAKERS.setdefault(tokenizer, {})
    key = tuple(breakers)
    if key not in made:
        made[key] = dry_breakers_of(tokenizer, key)
    return made[key]


_BREAKERS: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def dry_breakers_of(tokenizer, breakers) -> dict[int, list[tuple[int, ...]]]:
    """llama_sampler_init_dry's sequence-breaker processing (get_overlapping_token_sequences):
    per head token, the tails that complete a breaker. A token whose text holds a breaker is a head
    with the empty tail; one whose text ends with a proper prefix of it has the tokenization
    (add_special, parse_special off) of the rest, cut to 20 tokens, once per distinct tail.
    Empty breakers are skipped, long ones cut to 40 bytes."""
    out: dict[int, list[tuple[int, ...]]] = {}
    texts = _token_texts(tokenizer)
    tails: dict[bytes, tuple[int, ...]] = {}
    for s in breakers:
        s = s.encode("utf-8")[:DRY_MAX_CHAR_LEN] if isinstance(s, str) else bytes(s)[:DRY_MAX_CHAR_LEN]
        if not s:
            continue
        for tid, word in enumerate(texts):
            if s in word:
                seqs = out.setdefault(tid, [])
                seqs.append(())
                continue
            for k in range(1, min(len(s) - 1, len(word)) + 1):     # word ends with s[:k]: the tail s[k:]
                if not word.endswith(s[:k]):
                    continue
                rest = s[k:]
                if rest not in tails:
                    tails[rest] = tuple(tokenizer.encode_bytes(rest, False, False)[:DRY_MAX_SEQ_LEN])
                seqs = out.setdefault(tid, [])
                if tails[rest] not in seqs:
                    seqs.append(tails[rest])
    return out


class Dry:
    """llama_sampler_dry (ported from koboldcpp in src/llama-sampler.cpp): over the last
    `last_n` tokens, the longest repeat each candidate would extend (the reverse Z-algorithm,
    capped by the nearest restart sequence) costs multiplier * pow(base, len - allowed) (double
    pow, rounded to f32), the exponent clamped to FLOAT_MAX_LOG / logf(base); single-token
    breakers are never penalised."""

    def __init__(self, multiplier: float, base: float, allowed_length: int, last_n: int, breakers):
        self.multiplier, self.base, self.allowed, self.last_n = f32(multiplier), f32(base), allowed_length, last_n
        self.breakers = breakers
        self.last: deque[int] = deque(maxlen=last_n)
        self.max_exponent = 0
        if self.base > f32(1.000001):
            self.max_exponent = int(FLOAT_MAX_LOG / libm.logf(np.array([self.base]))[0])

    @staticmethod
    def disabled(multiplier: float, base: float, last_n: int) -> bool:
        return not (f32(multiplier) != 0 and f32(base) >= 1 and last_n != 0)

    def accept(self, token: int) -> None:
        self.last.append(token)

    def reset(self) -> None:
        self.last.clear()

    def _rep_limit(self, rat: list[int], n: int) -> int:
        """Step 1: the distance to the nearest token that ends a restart sequence (its longest)."""
        for i in range(n):
            seqs = self.breakers.get(rat[i])
            if seqs is None:
                continue
            longest = -1
            for seq in seqs:
                if longest < len(seq) <= i and all(seq[o] == rat[i - o - 1] for o in range(len(seq))):
                    longest = len(seq)
            if longest >= 0:
                return i - longest
        return n

    def apply(self, c) -> None:
        n = min(len(self.last), self.last_n)
        if n <= self.allowed:
            return
        rat = list(reversed(self.last))                 # rat[i]: the i-th token from the end
        rep_limit = self._rep_limit(rat, n)
        if rep_limit < self.allowed:
            return
        repeat = [0] * n                                # Step 2: reverse Z-algorithm
        last, lt, rt = n - 1, 0, 0
        for k in range(1, n):
            if k > rt:
                m = 0
                while m + k < n and rat[m] == rat[m + k]:
                    m += 1
                repeat[last - k] = min(m, rep_limit)
                if m > 0:
                    lt, rt = k, k + m - 1
            else:
                p, right_part_len = k - lt, rt - k + 1
                if repeat[last - p] < right_part_len:
                    repeat[last - k] = min(repeat[last - p], rep_limit)
                else:
                    i = rt + 1
                    while i < n and rat[i] == rat[i - k]:
                        i += 1
                    repeat[last - k] = min(i - k, rep_limit)
                    lt, rt = k, i - 1
        max_repeat: dict[int, int] = {}                 # Step 3: the longest repeat each token extends
        for i in range(n - 1):
            if repeat[i] >= self.allowed:
                token = rat[n - 2 - i]
                if max_repeat.get(token, repeat[i] - 1) < repeat[i]:
                    max_repeat[token] = repeat[i]
        penalised = {t: r for t, r in max_repeat.items() if () not in self.breakers.get(t, [])}
        if penalised:                                   # Step 4
            pos, which = _positions_of(c.ids, list(penalised))
            pen = np.array([self._penalty(r) for r in penalised.values()], f32)
            logit = c.logit.copy()
            logit[pos] = logit[pos] - pen[which]
            c.logit = logit
        c.sorted = False

    def _penalty(self, repeat_len: int) -> np.float32:
        exp = repeat_len - self.allowed
        if self.max_exponent > 0 and exp > self.max_exponent:
            exp = self.max_exponent
        return f32(float(self.multiplier) * libm.pow(float(self.base), float(exp)))


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
