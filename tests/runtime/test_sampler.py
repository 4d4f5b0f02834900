"""The sampler chain's pieces: libstdc++'s std::mt19937, generate_canonical, std::partial_sort."""
from __future__ import annotations

import ctypes
import functools
import random

import numpy as np
import pytest

from bankml.backends.llvm import stdsort as native
from bankml.numerics import stdsort
from bankml.numerics.stdsort import partial_sort
from bankml.runtime.sampler import GREEDY, Sampler, SamplerParams
from bankml.runtime.sampler_filters import MT19937, Candidates, min_p, temperature, top_k, top_p


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


def test_native_partial_sort_is_the_libstdcxx_port():
    r = random.Random(0)
    for _ in range(2000):
        n = r.randint(1, 300)
        k = r.randint(1, n)
        xs = np.array([r.randint(0, r.choice([3, 10, 1000])) for _ in range(n)], np.float32)
        if r.random() < 0.1:
            xs[r.randrange(n)] = np.nan                 # compares false, as in C++
        want = list(range(n))
        partial_sort(want, k, xs.tolist().__getitem__)
        assert native.partial_sort(xs, k).tolist() == want[:k], (xs.tolist(), k)


def _introsort_adversary(n: int) -> list[float]:
    """McIlroy's adversary against the port's std::sort: keys that drive introsort past its depth
    limit, into the heap sort (std::__partial_sort(first, last, last))."""
    gas, val, state = n, [n] * n, {"solid": 0, "candidate": None}

    def gt(x, y):
        if val[x] == gas and val[y] == gas:
            z = x if x == state["candidate"] else y
            val[z], state["solid"] = state["solid"], state["solid"] + 1
        if val[x] == gas:
            state["candidate"] = x
        elif val[y] == gas:
            state["candidate"] = y
        return val[x] < val[y]

    class Deep(Exception):
        pass

    def deep(*_):
        raise Deep
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stdsort, "_gt", lambda key: gt)
        mp.setattr(stdsort, "partial_sort", deep)
        with pytest.raises(Deep):
            stdsort.std_sort(list(range(n)), None)
    for i in range(n):
        if val[i] == gas:
            val[i], state["solid"] = state["solid"], state["solid"] + 1
    return [-float(v) for v in val]


def test_native_std_sort_is_the_libstdcxx_port():
    r = random.Random(1)
    cases = [[float(r.randint(0, r.choice([2, 5, 100]))) for _ in range(r.randint(1, 400))] for _ in range(500)]
    cases += [_introsort_adversary(n) for n in (64, 200, 1000)]
    for xs in cases:
        want = list(range(len(xs)))
        stdsort.std_sort(want, xs.__getitem__)
        keys, ids = np.array(xs, np.float32), np.arange(len(xs), dtype=np.int32)
        native.std_sort(keys, ids)
        assert ids.tolist() == want
        assert np.array_equal(keys, np.array(xs, np.float32)[ids])


def test_numpy_preselection_would_reorder_ties():
    """Why the whole row goes through the heap: std::partial_sort of only the elements at least the
    k-th value, in index order, leaves equal ones elsewhere (elements that entered the heap and
    left it again shaped it)."""
    xs = [1.0, 2.0, 1.0, 0.0, 4.0, 2.0]
    full = list(range(6))
    partial_sort(full, 5, xs.__getitem__)
    sub = [i for i in range(6) if xs[i] >= xs[full[4]]]
    partial_sort(sub, 5, xs.__getitem__)
    assert full[:5] == [4, 1, 5, 0, 2] != sub[:5]
    assert native.partial_sort(np.array(xs, np.float32), 5).tolist() == full[:5]


def test_numpy_cumsum_is_the_running_f32_sum():
    """The sampler's f32 sums (softmax, top_p) are `s += x[i]` in order: numpy's add.accumulate is."""
    rng = np.random.default_rng(0)
    x = (rng.random(20000) * rng.choice([1e-4, 1, 1e4], 20000)).astype(np.float32)
    s, want = np.float32(0), np.empty_like(x)
    for i, v in enumerate(x):
        s = want[i] = np.float32(s + v)
    assert np.array_equal(np.cumsum(x, dtype=np.float32).view(np.uint32), want.view(np.uint32))


def test_greedy_picks_the_highest_logit():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert Sampler(GREEDY, seed=1).sample(logits) == int(np.argmax(logits))


def test_same_seed_same_tokens():
    logits = np.random.default_rng(1).standard_normal(500).astype(np.float32)
    a, b = Sampler(SamplerParams(), 9), Sampler(SamplerParams(), 9)
    assert [a.sample(logits) for _ in range(20)] == [b.sample(logits) for _ in range(20)]


# ---------------------------------------------------------------- libllama's own samplers

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])     # llama_token_data


class _TokenDataArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("selected", ctypes.c_int64),
                ("sorted", ctypes.c_bool)]


class LogitBiasC(ctypes.Structure):
    _fields_ = [("token", ctypes.c_int32), ("bias", ctypes.c_float)]          # llama_logit_bias


@functools.cache
def _libllama():
    """libllama of the oracle build, with the sampler API's signatures."""
    from bankml.oracle.paths import bin_dir
    lib = ctypes.CDLL(str(bin_dir() / "libllama.so"))
    P, F = ctypes.c_void_p, ctypes.c_float
    I, N, U = ctypes.c_int32, ctypes.c_size_t, ctypes.c_uint32
    for name, args in {"penalties": [I, I, F, F, F], "top_n_sigma": [F], "top_k": [I], "typical": [F, N],
                       "top_p": [F, N], "min_p": [F, N], "xtc": [F, F, N, U], "temp_ext": [F, F, F],
                       "temp": [F], "dist": [U], "logit_bias": [I, I, P], "dry": [P, F, F, I, I, P, N],
                       "mirostat": [I, U, F, F, I], "mirostat_v2": [U, F, F]}.items():
        fn = getattr(lib, f"llama_sampler_init_{name}")
        fn.restype, fn.argtypes = P, args
    lib.llama_sampler_chain_init.restype, lib.llama_sampler_chain_init.argtypes = P, [ctypes.c_bool]   # {no_perf}
    lib.llama_sampler_chain_add.argtypes = [P, P]
    lib.llama_sampler_apply.argtypes = [P, ctypes.POINTER(_TokenDataArray)]
    lib.llama_sampler_accept.argtypes = [P, I]
    lib.llama_sampler_reset.argtypes = [P]
    lib.llama_sampler_chain_get.restype, lib.llama_sampler_chain_get.argtypes = P, [P, I]
    lib.llama_sampler_name.restype, lib.llama_sampler_name.argtypes = P, [P]
    lib.llama_sampler_chain_n.restype, lib.llama_sampler_chain_n.argtypes = I, [P]
    lib.llama_sampler_free.argtypes = [P]
    return lib


def logit_bias_arg(biases) -> tuple:
    """("logit_bias", n_vocab, n, array) arguments' tail: (n, a llama_logit_bias array)."""
    arr = (LogitBiasC * max(len(biases), 1))(*[LogitBiasC(t, b) for t, b in biases])
    return len(biases), ctypes.cast(arr, ctypes.c_void_p)


def dry_breakers_arg(breakers) -> tuple:
    """(const char ** seq_breakers, num_breakers) for llama_sampler_init_dry."""
    arr = (ctypes.c_char_p * max(len(breakers), 1))(*[b.encode() for b in breakers])
    return ctypes.cast(arr, ctypes.c_void_p), len(breakers)


class LlamaChain:
    """A llama_sampler chain of libllama's own samplers, e.g. LlamaChain(("top_k", 40), ("dist", 7))."""

    def __init__(self, *samplers):
        lib = self.lib = _libllama()
        self.chain = lib.llama_sampler_chain_init(True)
        for name, *args in samplers:
            lib.llama_sampler_chain_add(self.chain, getattr(lib, f"llama_sampler_init_{name}")(*args))

    @classmethod
    def common(cls, p: SamplerParams, seed: int, n_vocab: int, vocab=None) -> LlamaChain:
        """common_sampler_init's chain for these params (common/sampling.cpp): logit bias, then
        p.samplers in order and dist, or temp and mirostat. vocab: a llama_vocab * (DRY)."""
        chain = []
        if p.logit_bias:
            chain.append(("logit_bias", n_vocab, *logit_bias_arg(p.logit_bias)))
        if p.mirostat == 1:
            return cls(*chain, ("temp", p.temp), ("mirostat", n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))
        if p.mirostat == 2:
            return cls(*chain, ("temp", p.temp), ("mirostat_v2", seed, p.mirostat_tau, p.mirostat_eta))
        by_name = {
            "penalties": ("penalties", p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty),
            "dry": ("dry", vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n,
                    *dry_breakers_arg(p.dry_sequence_breakers)),
            "top_n_sigma": ("top_n_sigma", p.top_n_sigma), "top_k": ("top_k", p.top_k),
            "typ_p": ("typical", p.typical_p, p.min_keep), "top_p": ("top_p", p.top_p, p.min_keep),
            "min_p": ("min_p", p.min_p, p.min_keep),
            "xtc": ("xtc", p.xtc_probability, p.xtc_threshold, p.min_keep, seed),
            "temperature": ("temp_ext", p.temp, p.dynatemp_range, p.dynatemp_exponent)}
        by_name["penalties"] = ("penalties", n_vocab, *by_name["penalties"][1:])
        return cls(*chain, *(by_name[name] for name in p.samplers), ("dist", seed))

    def apply(self, logits: np.ndarray) -> tuple[np.ndarray, int, bool]:
        """llama_sampler_apply on the row as llama_sampler_sample lays it out: the candidates left,
        the selected index (-1: none), sorted. (XTC drops the first ones by moving data on.)"""
        data = np.zeros(len(logits), TOKEN_DATA)
        data["id"], data["logit"] = np.arange(len(logits)), logits
        arr = _TokenDataArray(data.ctypes.data, len(logits), -1, False)
        self.lib.llama_sampler_apply(self.chain, ctypes.byref(arr))
        start = (arr.data - data.ctypes.data) // TOKEN_DATA.itemsize
        return data[start:start + arr.size].copy(), arr.selected, arr.sorted

    def sample(self, logits: np.ndarray) -> int:
        data, selected, _ = self.apply(logits)
        return int(data["id"][selected])

    def accept(self, ids) -> None:
        for token in ids:
            self.lib.llama_sampler_accept(self.chain, int(token))

    def reset(self) -> None:
        self.lib.llama_sampler_reset(self.chain)

    def mirostat_mu(self) -> np.float32:
        """mu of the chain's last sampler, a mirostat: struct llama_sampler {iface, ctx}; ctx is a
        llama_sampler_mirostat {n_vocab, seed, seed_cur, tau, eta, m, mu, ...} (mu at byte 24) or a
        llama_sampler_mirostat_v2 {seed, seed_cur, tau, eta, mu, ...} (mu at byte 16)."""
        smpl = self.lib.llama_sampler_chain_get(self.chain, self.lib.llama_sampler_chain_n(self.chain) - 1)
        ctx = ctypes.c_void_p.from_address(smpl + 8).value
        name = ctypes.cast(self.lib.llama_sampler_name(smpl), ctypes.c_char_p).value
        return np.float32(ctypes.c_float.from_address(ctx + (24 if name == b"mirostat" else 16)).value)

    def __del__(self):
        self.lib.llama_sampler_free(self.chain)


def _llama_top_k(logits: np.ndarray, k: int) -> list[int]:
    """The ids llama.cpp's own top-k sampler keeps, in its order (libllama of the oracle build)."""
    return LlamaChain(("top_k", k)).apply(logits)[0]["id"].tolist()


def seeds(n_vocab: int, many: int) -> range:
    """The seeds a chain test draws with: `many` on SmolLM2's 49,152 entries, 5 on Gemma's 262,144
    (the same code paths; each of its rows costs five times as much)."""
    return range(many if n_vocab <= 49152 else 5)


def tied_logits(rng: np.random.Generator, n: int, scale: float = 4.0, step: float = 8.0) -> np.ndarray:
    """A row of many equal logits: normal(0, scale) rounded to 1/step."""
    return (np.round(rng.normal(0, scale, n) * step) / step).astype(np.float32)


@pytest.mark.oracle
@pytest.mark.parametrize("k", [129, 200, 1000, 49152])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_k_above_128_orders_ties_as_llama_cpp(k, seed):
    """Above 128 candidates llama.cpp buckets the logits and std::sorts each bucket: equal logits
    come out in libstdc++'s introsort order, which a stable sort does not give."""
    rng = np.random.default_rng(seed)
    logits = tied_logits(rng, 49152)
    c = Candidates(logits)
    top_k(c, k)
    want = _llama_top_k(logits, k)
    assert c.ids.tolist() == want
    stable = np.argsort(-logits, kind="stable")[:k].tolist()
    assert stable != want                       # the case is one where tie order matters


@pytest.mark.oracle
def test_top_k_above_128_buckets_logits_past_int_range_last_as_llama_cpp():
    """int(6.4 * logit + 64) of a logit past 3.3e8 (or inf, or NaN) is INT_MIN on x86, so llama.cpp's
    bucketed sort files it in the lowest bucket: a top_k above 128 leaves such logits out."""
    logits = tied_logits(np.random.default_rng(3), 49152)
    logits[[5, 100, 7000, 9000]] = [np.inf, 1e10, 3.4e8, np.nan]
    for k in (129, 300, 49152):
        c = Candidates(logits)
        top_k(c, k)
        assert c.ids.tolist() == _llama_top_k(logits, k)
    assert 5 not in c.ids[:300]


def _rows(rng: np.random.Generator, n: int):
    """Logit rows of every kind the chain meets: peaked with many ties (top_p stops within its first
    256), broad and flat with many ties (it runs past them), continuous, and with NaNs (which
    compare false, so no max and no sort may propagate or move them otherwise)."""
    while True:
        yield tied_logits(rng, n, scale=8, step=4)
        yield tied_logits(rng, n)
        yield tied_logits(rng, n, scale=0.5, step=16)
        yield (rng.normal(0, 3, n)).astype(np.float32)
        row = tied_logits(rng, n)
        row[rng.integers(0, n, 20)] = np.nan
        yield row


SINGLE = {"top_k": top_k, "top_p": top_p, "min_p": min_p, "temp_ext": lambda c, t, *_: temperature(c, t)}
SAMPLERS = [("top_k", 1), ("top_k", 40), ("top_k", 128), ("top_k", 129), ("top_k", 256), ("top_k", 3000),
            ("top_p", 0.95, 0), ("top_p", 0.5, 300), ("top_p", 0.999, 1), ("min_p", 0.05, 0), ("min_p", 0.2, 5000),
            ("temp_ext", 0.0, 0.0, 1.0), ("temp_ext", 0.7, 0.0, 1.0),
            ("top_p", 0.99999998, 0), ("min_p", 1e-50, 0), ("temp_ext", 1e-50, 0.0, 1.0)]   # 1.0f, 0.0f: off, greedy


@pytest.mark.oracle
@pytest.mark.parametrize("n", [49152, 262144])
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: "-".join(map(str, s)))
def test_sampler_leaves_llama_cpp_candidates(sampler, n):
    """Each sampler alone on a whole unsorted row: the same candidates in the same order, logits
    and probabilities to the bit, and the same sorted flag."""
    rng = np.random.default_rng(n)
    rows, past_256 = _rows(rng, n), set()
    for _ in range(6):
        logits = next(rows)
        want, _, want_sorted = LlamaChain(sampler).apply(logits)
        c = Candidates(logits)
        SINGLE[sampler[0]](c, *sampler[1:])
        assert c.ids.tolist() == want["id"].tolist()
        assert np.array_equal(c.logit.view(np.uint32), want["logit"].view(np.uint32))
        assert c.sorted == want_sorted
        if sampler[0] == "top_p" and np.float32(sampler[1]) < 1:         # top_p ran: its probabilities
            assert np.array_equal(c.p.view(np.uint32), want["p"].view(np.uint32))
            past_256.add(len(want) > 256)
    if sampler[:2] == ("top_p", 0.95):
        assert past_256 == {False, True}            # both ends of top_p's adaptive sort ran


CHAINS = [SamplerParams(), GREEDY, SamplerParams(top_k=0), SamplerParams(top_k=0, top_p=1.0),
          SamplerParams(top_k=0, top_p=1.0, min_p=0.0), SamplerParams(top_k=0, temp=0.0),
          SamplerParams(top_k=1000, min_keep=5), SamplerParams(top_k=200, top_p=0.5, min_p=0.2, min_keep=3, temp=1.5),
          SamplerParams(top_k=1), SamplerParams(top_p=1.0, min_p=0.0, temp=1.0), SamplerParams(top_k=10 ** 6),
          SamplerParams(top_k=0, min_keep=400)]


@pytest.mark.oracle
@pytest.mark.parametrize("n", [49152, 262144])
@pytest.mark.parametrize("params", CHAINS, ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}-keep{p.min_keep}-t{p.temp}")
def test_chain_draws_llama_cpp_tokens(params, n):
    """common/sampling.cpp's chain in libllama and Sampler, 24 seeds (5 on the large vocabulary),
    8 draws each (the RNG state carries from draw to draw): the same tokens."""
    rng = np.random.default_rng(n + 1)
    rows = _rows(rng, n)
    for seed in seeds(n, 24):
        ours, theirs = Sampler(params, seed), LlamaChain.common(params, seed, n)
        for _ in range(8):
            logits = next(rows)
            assert ours.sample(logits) == theirs.sample(logits), seed
