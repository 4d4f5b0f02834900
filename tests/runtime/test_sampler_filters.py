"""The chain's filters (typical, top-n-sigma, XTC, dynamic temperature), min_keep and
Sampler.candidates(), against libllama b11434's own samplers and common_sampler_get_candidates."""
from __future__ import annotations

import ctypes
import functools
import math

import numpy as np
import pytest
from test_sampler import LlamaChain, _TokenDataArray, seeds, tied_logits

from bankml.numerics import libm, stdsort
from bankml.runtime.sampler import Sampler, SamplerParams
from bankml.runtime.sampler_filters import (MT19937, Candidates, _softmax, temp_ext, top_n_sigma, typical, uniform_f32,
                                            xtc)


def test_sum_f32_of_f64_rounds_each_add_to_float():
    """C's `float acc; acc += (double)t`: each add in double, then rounded to float; neither an f32
    nor an f64 running sum gives those bits."""
    t = np.random.default_rng(0).normal(0, 3, 5000) ** 2
    acc = 0.0
    for v in t:
        acc = float(np.float32(acc + v))
    got = libm.sum_f32_of_f64(t)
    assert got == np.float32(acc)
    assert got != np.cumsum(t.astype(np.float32), dtype=np.float32)[-1] or got != np.float32(t.cumsum()[-1])


def test_exp_is_glibc_exp():
    x = np.random.default_rng(1).normal(0, 20, 5000)
    assert np.array_equal(libm.exp(x), np.array([math.exp(v) for v in x]))      # CPython's math.exp is libm's


def test_uniform_f32_is_one_draw_over_2_32():
    a, b = MT19937(11), MT19937(11)
    for _ in range(1000):
        g = b()
        assert uniform_f32(a) == np.float32(np.float32(g) * np.float32(2.0 ** -32))


def test_uniform_f32_stays_below_one():
    class Top:
        def __call__(self):
            return 0xFFFFFFFF                   # float(g) rounds up to 2^32
    assert uniform_f32(Top()) == np.nextafter(np.float32(1), np.float32(0))


def test_params_take_the_filters():
    p = SamplerParams(typical_p=0.5, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.2,
                      dynatemp_range=0.5, dynatemp_exponent=2.0)
    assert Sampler(p, 1).sample(np.arange(100, dtype=np.float32)) in range(100)


def test_typical_sorts_scores_as_libstdcxx_std_sort():
    """The indices by ascending shifted score: std::sort's order of equal scores (the spec port)."""
    logits = np.repeat(np.float32([3, 1, 2, 1, 3, 0]), 7)
    c = Candidates(logits)
    typical(c, 0.99, 0)
    ref = Candidates(logits)
    ref.sort_top(len(logits))
    _softmax(ref)
    logp = libm.logf(ref.p)
    ent = np.cumsum(-ref.p * logp, dtype=np.float32)[-1]
    score = np.abs(-logp - ent)
    order = list(range(len(logits)))
    stdsort.std_sort(order, (-score).tolist().__getitem__)          # comp a > b on -score: a < b on score
    assert c.ids.tolist() == ref.ids[order][:len(c.ids)].tolist()


# ---------------------------------------------------------------- libllama's own samplers


def filter_rows(rng: np.random.Generator, n: int):
    """Rows with ties and -inf entries: peaked (a few far above the rest: p >= XTC's threshold),
    broad, flat, continuous, some with a tenth of the row -inf (a p of 0: typical's entropy is NaN
    over the whole row, top-n-sigma leaves them out), and NaNs."""
    while True:
        row = tied_logits(rng, n)
        row[rng.integers(0, n, 3)] += np.float32(rng.choice([12, 16, 20]))
        yield row
        row = tied_logits(rng, n, scale=8, step=4)
        row[rng.integers(0, n, n // 10)] = -np.inf
        yield row
        yield tied_logits(rng, n)
        row = tied_logits(rng, n, scale=0.5, step=16)
        row[rng.integers(0, n, 5)] += np.float32(9)
        yield row
        yield rng.normal(0, 3, n).astype(np.float32)
        row = tied_logits(rng, n)
        row[rng.integers(0, n, 20)] = np.nan
        yield row


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def assert_same(c: Candidates, want: np.ndarray, want_sorted: bool) -> None:
    """Our candidates are libllama's: ids, logits and p to the bit (p 0 where no sampler set it), sorted."""
    assert c.ids.tolist() == want["id"].tolist()
    assert np.array_equal(_bits(c.logit), _bits(want["logit"]))
    p = c.p if c.p is not None else np.zeros(len(c.ids), np.float32)
    assert np.array_equal(_bits(p), _bits(want["p"]))
    assert c.sorted == want_sorted


FILTERS = {"typical": lambda c, p, keep: typical(c, p, keep), "top_n_sigma": top_n_sigma,
           "temp_ext": temp_ext}
SINGLE = [("typical", 0.9, 0), ("typical", 0.5, 0), ("typical", 0.2, 100), ("typical", 0.995, 1),
          ("top_n_sigma", 1.0), ("top_n_sigma", 0.25), ("top_n_sigma", 3.0),
          ("temp_ext", 0.8, 0.5, 1.0), ("temp_ext", 0.3, 0.5, 2.0), ("temp_ext", 1.0, 1.5, 0.5),
          ("temp_ext", 0.2, 0.5, 0.25)]


@pytest.mark.oracle
@pytest.mark.parametrize("n", [49152, 262144])
@pytest.mark.parametrize("sampler", SINGLE, ids=lambda s: "-".join(map(str, s)))
def test_filter_leaves_llama_cpp_candidates(sampler, n):
    """Each filter alone on whole unsorted rows: the same candidates in the same order, logits and p
    to the bit, the same sorted flag."""
    rows, cut = filter_rows(np.random.default_rng(n + 7), n), []
    for _ in range(6):
        logits = next(rows)
        want, _, want_sorted = LlamaChain(sampler).apply(logits)
        c = Candidates(logits)
        FILTERS[sampler[0]](c, *sampler[1:])
        assert_same(c, want, want_sorted)
        cut.append(len(want) < n or bool(np.isinf(want["logit"]).sum() > np.isinf(logits).sum()))
    if sampler[0] != "temp_ext":
        assert any(cut)                             # the filter did remove tokens


@pytest.mark.oracle
@pytest.mark.parametrize("n", [49152, 262144])
@pytest.mark.parametrize("sampler", [("xtc", 0.5, 0.1, 0), ("xtc", 1.0, 0.05, 2), ("xtc", 1.0, 0.001, 1),
                                     ("xtc", 1.0, 0.01, 49150), ("xtc", 0.3, 0.5, 0)], ids=lambda s: "-".join(map(str, s)))
def test_xtc_draws_and_leaves_llama_cpp_candidates(sampler, n):
    """XTC's own RNG (std::mt19937(seed), uniform_real_distribution<float>) over 12 rows a seed,
    20 seeds (5 on the large vocabulary): where it fires and what it leaves, to the bit."""
    rows, fired, skipped = filter_rows(np.random.default_rng(n + 8), n), 0, 0
    for seed in seeds(n, 20):
        theirs, rng = LlamaChain((*sampler, seed)), MT19937(seed)
        for _ in range(12):
            logits = next(rows)
            want, _, want_sorted = theirs.apply(logits)
            c = Candidates(logits)
            xtc(c, *sampler[1:], rng)
            assert_same(c, want, want_sorted)
            fired += len(want) < n
            skipped += len(want) == n
    if sampler[2] < 0.05:
        assert fired and skipped


@functools.cache
def _get_candidates():
    """common_sampler_get_candidates of the build's libllama-common, on a common_sampler that holds
    only what it reads: cur_p at byte 0x250 and params.no_perf at 0x6d (set: no timing; the timer
    would add to t_total_us at 0x15f8), as the function's code reads them (objdump -d)."""
    from bankml.oracle.paths import bin_dir
    lib = ctypes.CDLL(str(bin_dir() / "libllama-common.so"))
    fn = lib._Z29common_sampler_get_candidatesP14common_samplerb
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_bool]
    return fn


def llama_candidates(data: np.ndarray, selected: int, is_sorted: bool) -> tuple[np.ndarray, int]:
    """What common_sampler_get_candidates(smpl, do_sort=true) returns for the chain's cur_p: the
    candidates (sorted by p when the chain left them unsorted) and the selected index."""
    data = np.ascontiguousarray(data.copy())
    smpl = (ctypes.c_uint8 * 0x1800)()
    smpl[0x6d] = 1
    arr = _TokenDataArray.from_buffer(smpl, 0x250)
    arr.data, arr.size, arr.selected, arr.sorted = data.ctypes.data, len(data), selected, is_sorted
    assert _get_candidates()(ctypes.addressof(smpl), True) == ctypes.addressof(smpl) + 0x250
    assert arr.sorted
    return data, arr.selected


CHAINS = [SamplerParams(typical_p=0.9), SamplerParams(top_k=0, typical_p=0.5, min_keep=3),
          SamplerParams(top_k=0, top_p=1.0, min_p=0.0, typical_p=0.95, temp=1.0),
          SamplerParams(top_n_sigma=1.0), SamplerParams(top_k=0, top_n_sigma=2.0, top_p=1.0, min_p=0.0),
          SamplerParams(xtc_probability=0.5, xtc_threshold=0.1), SamplerParams(top_k=100, xtc_probability=1.0,
                                                                               xtc_threshold=0.01, min_keep=2),
          SamplerParams(dynatemp_range=0.5), SamplerParams(top_k=0, temp=0.3, dynatemp_range=0.5, dynatemp_exponent=2.0),
          SamplerParams(temp=0.2, dynatemp_range=0.5, dynatemp_exponent=0.25),
          SamplerParams(top_n_sigma=1.5, typical_p=0.8, xtc_probability=0.7, xtc_threshold=0.05, dynatemp_range=0.4,
                        min_keep=2),
          SamplerParams(top_k=0, min_keep=-1), SamplerParams(), SamplerParams(top_k=0, temp=0.0),
          SamplerParams(top_k=0, top_p=1.0, min_p=0.0)]


def _name(p: SamplerParams) -> str:
    base = SamplerParams()
    return "-".join(f"{k}{getattr(p, k)}" for k in ("temp", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p",
                    "min_p", "min_keep", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold")
                    if getattr(p, k) != getattr(base, k)) or "default"


@pytest.mark.oracle
@pytest.mark.parametrize("n", [49152, 262144])
@pytest.mark.parametrize("params", CHAINS, ids=_name)
def test_filter_chain_draws_llama_cpp_tokens_and_candidates(params, n):
    """common/sampling.cpp's chain with the filters on, in libllama and Sampler, 20 seeds (5 on the
    large vocabulary), 5 draws each (both RNGs carry from draw to draw): the same tokens, and
    candidates() is what common_sampler_get_candidates(smpl, true) gives llama-server's
    post_sampling_probs."""
    rows = filter_rows(np.random.default_rng(n + 9), n)
    for seed in seeds(n, 20):
        ours, theirs = Sampler(params, seed), LlamaChain.common(params, seed, n)
        for _ in range(5):
            logits = next(rows)
            tok = ours.sample(logits)
            data, selected, is_sorted = theirs.apply(logits)
            assert tok == int(data["id"][selected]), seed
            want, want_selected = llama_candidates(data, selected, is_sorted)
            ids, p = ours.candidates()
            assert ids.dtype == np.int32 and p.dtype == np.float32
            assert ids.tolist() == want["id"].tolist(), seed
            assert np.array_equal(_bits(p), _bits(want["p"])), seed
            assert int(ids[want_selected]) == tok


def test_candidates_before_any_sample_raises():
    with pytest.raises(ValueError):
        Sampler(SamplerParams(), 1).candidates()


# ---------------------------------------------------------------- thresholds are C floats

@pytest.mark.oracle
def test_params_hold_c_floats():
    """SamplerParams rounds its float settings as common_params_sampling's floats hold them: the
    mirostat chain's plain temperature of 1e-50 is greedy in both. (Each sampler alone takes its
    setting as a float too: test_sampler.py's SAMPLERS has 0.99999998 and 1e-50.)"""
    assert SamplerParams(top_p=0.99999998).top_p == 1.0 and SamplerParams(temp=1e-50).temp == 0.0
    logits = tied_logits(np.random.default_rng(8), 4096)
    for seed in range(20):
        ours = Sampler(SamplerParams(temp=1e-50, mirostat=2), seed)
        theirs = LlamaChain(("temp", 1e-50), ("mirostat_v2", seed, 5.0, 0.1))
        assert [ours.sample(logits) for _ in range(3)] == [theirs.sample(logits) for _ in range(3)]
