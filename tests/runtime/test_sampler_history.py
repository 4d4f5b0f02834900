"""The history samplers (logit bias, penalties, DRY, mirostat 1 and 2), accept() and reset(),
alone and in common_sampler_init's chain, against libllama b11434's own samplers over sequences
of accepted tokens, on SmolLM2's 49,152-token vocabulary (DRY also on Gemma's SentencePiece one).
The tokenizer calls DRY makes are checked in tests/tokenizer/test_raw_bytes.py."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from test_sampler import LlamaChain, dry_breakers_arg, logit_bias_arg, tied_logits

from bankml.runtime import sampler_history as history
from bankml.runtime.sampler import Sampler, SamplerParams
from bankml.runtime.sampler_filters import Candidates, top_k

N_VOCAB = 49152


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


# ---------------------------------------------------------------- refusals (common_sampler_init's throws and asserts)

@pytest.mark.parametrize("kw", [dict(repeat_penalty=0.0), dict(repeat_penalty=-1.0), dict(repeat_penalty=np.nan),
                                dict(repeat_penalty=np.inf), dict(repeat_penalty=1e-39), dict(repeat_penalty=1e-50),
                                dict(frequency_penalty=np.inf), dict(presence_penalty=np.nan), dict(mirostat=3),
                                dict(mirostat=-1), dict(samplers=("top_k", "tfs_z")), dict(samplers=("infill",)),
                                dict(samplers=("adaptive_p",))], ids=str)
def test_params_refuse_what_common_sampler_init_refuses(kw):
    with pytest.raises(ValueError) as e:
        SamplerParams(**kw)
    assert "\n" not in str(e.value)


def test_params_take_what_common_sampler_init_takes():
    """1e-30 is a normal float whose 1/x is finite; negative last_n is off (max(n, 0)), as are
    base < 1 and the empty sampler list; logit_bias and lists are kept as tuples."""
    p = SamplerParams(repeat_penalty=1e-30, frequency_penalty=-2.0, repeat_last_n=-1, dry_penalty_last_n=-1,
                      dry_multiplier=1.0, dry_base=0.5, samplers=[], logit_bias=[[3, -np.inf]])
    assert p.samplers == () and p.logit_bias == ((3, -np.inf),)
    s = Sampler(p, 1)                               # DRY off by its base: no vocabulary needed
    assert s.sample(np.arange(10, dtype=np.float32)) != 3


def test_dry_without_a_vocabulary_is_refused():
    with pytest.raises(ValueError, match="tokenizer"):
        Sampler(SamplerParams(dry_multiplier=0.8), 1)


def test_penalties_count_only_the_last_n_accepted():
    pen = history.Penalties(3, 1.0, 1.0, 0.0)
    for t in [1, 1, 2, 1, 2]:
        pen.accept(t)
    assert list(pen.prev) == [2, 1, 2] and dict(pen.count) == {2: 2, 1: 1}


# ---------------------------------------------------------------- against libllama

@functools.cache
def _vocab():
    from bankml.oracle.vocab import Vocab
    from bankml.testing import models
    return Vocab(models.path("smollm2-q4_1"))


@functools.cache
def _tok():
    from bankml.testing import models
    from bankml.tokenizer import tokenizer_for
    return tokenizer_for(models.path("smollm2-q4_1"))


def _rows(rng: np.random.Generator, favour=()):
    """Rows of the vocabulary's width: tied, continuous, with exact zeros (penalties multiply
    at <= 0), and with the given tokens made likely (so the history is among the candidates)."""
    while True:
        for row in (tied_logits(rng, N_VOCAB), rng.normal(0, 3, N_VOCAB).astype(np.float32),
                    tied_logits(rng, N_VOCAB, scale=8, step=4)):
            row[rng.integers(0, N_VOCAB, 50)] = 0.0
            if len(favour):
                row[list(favour)] = (rng.normal(8, 3, len(favour))).astype(np.float32)
                row[list(favour)[:3]] = 0.0
            yield row


def _apply_alone(step, chain: LlamaChain, row: np.ndarray) -> int:
    """One sampler alone on a row: the same ids, logit bits and sorted flag as libllama's; how
    many logits it changed."""
    want, _, want_sorted = chain.apply(row)
    c = Candidates(row)
    step.apply(c)
    assert c.ids.tolist() == want["id"].tolist()
    assert np.array_equal(bits(c.logit), bits(want["logit"]))
    assert c.sorted == want_sorted
    return int(np.count_nonzero(bits(c.logit) != bits(row[c.ids])))


@pytest.mark.oracle
def test_logit_bias_adds_as_llama_cpp():
    """-inf bans, positive and negative biases, a token listed twice (added twice), and ids
    outside the vocabulary (searched for, never found)."""
    rng = np.random.default_rng(0)
    biases = [(5, -np.inf), (7, 3.5), (7, 0.1), (49151, 1e30), (0, -0.3), (-1, 2.0), (N_VOCAB + 5, 1.0), (100, 1e-8)]
    step, chain = history.LogitBias(biases), LlamaChain(("logit_bias", N_VOCAB, *logit_bias_arg(biases)))
    rows = _rows(rng)
    for _ in range(3):
        assert _apply_alone(step, chain, next(rows)) >= 4      # 1e-8 rounds away unless the logit is 0


@pytest.mark.oracle
def test_logit_bias_after_top_k_searches_and_adds_the_first_entry_only():
    """On candidates that are not the vocabulary in order (after top_k), llama.cpp searches each
    id among the biases and adds only the first entry for it; at a position whose id matches it
    adds every entry."""
    rng = np.random.default_rng(6)
    row = rng.normal(0, 3, N_VOCAB).astype(np.float32)
    kept = LlamaChain(("top_k", 300)).apply(row)[0]["id"]
    biases = [(int(kept[0]), 1.5), (int(kept[0]), 2.25), (int(kept[1]), -np.inf), (int(kept[2]), 0.3), (2, 0.5),
              (int(kept[2]), 100.0)]
    chain = LlamaChain(("top_k", 300), ("logit_bias", N_VOCAB, *logit_bias_arg(biases)))
    want = chain.apply(row)[0]
    c = Candidates(row)
    top_k(c, 300)
    history.LogitBias(biases).apply(c)
    assert c.ids.tolist() == want["id"].tolist()
    assert np.array_equal(bits(c.logit), bits(want["logit"]))
    assert c.logit[0] == np.float32(row[kept[0]] + np.float32(1.5))


PENALTIES = [(64, 1.3, 0.0, 0.0), (64, 0.7, 0.25, 0.4), (8, 1.1, 0.3, -0.2), (1, 2.0, 1.0, 1.0), (300, 1.0, 0.5, 0.0),
             (64, 1.0, 0.0, 0.7)]


@pytest.mark.oracle
@pytest.mark.parametrize("cfg", PENALTIES, ids=lambda c: "-".join(map(str, c)))
def test_penalties_over_an_accepted_history_as_llama_cpp(cfg):
    """The counts over the ring buffer of the last n accepted tokens (with repeats, and past
    its capacity), each candidate's logit multiplied or divided and then lowered, to the bit,
    after each of several accepts."""
    rng = np.random.default_rng(1)
    pool = rng.integers(0, N_VOCAB, 12)
    step, chain = history.Penalties(*cfg), LlamaChain(("penalties", N_VOCAB, *cfg))
    rows = _rows(rng, pool)
    for _ in range(4):
        hist = rng.choice(pool, 40).tolist()
        for t in hist:
            step.accept(t)
        chain.accept(hist)
        assert _apply_alone(step, chain, next(rows)) > 0


def _breaker_history(rng, tok, n: int) -> list[int]:
    """A history of repeated phrases with sequence breakers in and between them."""
    phrases = [tok.encode(s, False) for s in ("the quick brown fox", " jumps over", ": the lazy dog", "\n", " *",
                                              " quick brown", "日本語", "\"quoted\"", " again and again")]
    out: list[int] = []
    while len(out) < n:
        out += phrases[int(rng.integers(0, len(phrases)))]
    return out[:n]


DRY = [(0.8, 1.75, 2, 64, ("\n", ":", "\"", "*")), (0.8, 1.75, 2, 64, ()), (1.5, 1.1, 0, 200, ("\n",)),
       (0.5, 1.5, 1, 256, (" brown fox", "日本", "again and")), (2.0, 1.0, 3, 32, ("\n", ":")),
       (0.8, 1.75, 4, 40, ("x" * 50,)), (0.5, 3.0, 2, 256, ("*",))]


@pytest.mark.oracle
@pytest.mark.parametrize("cfg", DRY, ids=lambda c: "-".join(map(str, c[:4])) + f"-{len(c[4])}breakers")
def test_dry_over_an_accepted_history_as_llama_cpp(cfg):
    """Repeats in the history (the Z-algorithm), restart sequences of one and of several tokens
    (the vocabulary's overlapping tokenizations, a non-ASCII breaker, one cut to 40 bytes), the
    exponent clamped (base 3 over 256 tokens of one repeat), base 1: the logits to the bit."""
    multiplier, base, allowed, last_n, breakers = cfg
    rng = np.random.default_rng(2)
    tok, vocab = _tok(), _vocab()
    step = history.Dry(multiplier, base, allowed, last_n, history.dry_breakers(tok, breakers))
    chain = LlamaChain(("dry", vocab.vocab, multiplier, base, allowed, last_n, *dry_breakers_arg(breakers)))
    hist = _breaker_history(rng, tok, 600)
    if base == 3.0:                                 # one long repeat: the exponent reaches its clamp
        hist = hist[:300] + tok.encode(" again and again", False) * 80
    rows, changed = _rows(rng, list(set(hist))[:200]), 0
    for chunk in (hist[:1], hist[1:3], hist[3:50], hist[50:90], hist[90:300], hist[300:]):
        for t in chunk:
            step.accept(t)
        chain.accept(chunk)
        changed += _apply_alone(step, chain, next(rows))
    assert changed > 0
    if base == 3.0:
        assert step.max_exponent == 80 and step._penalty(300) == step._penalty(82) != step._penalty(81)


@pytest.mark.oracle
def test_dry_penalty_grows_with_the_repeat_as_llama_cpp():
    """A run of distinct tokens, then the run again token by token: the next token of the run
    extends a repeat one longer each step, so each step checks one more exponent of
    multiplier * pow(base, n - allowed) (double pow, rounded to float) to the bit."""
    rng = np.random.default_rng(7)
    run = rng.choice(np.arange(1000, 40000), 90, replace=False).tolist()
    cfg = (0.7, 1.3, 2, 256)
    step = history.Dry(*cfg, {})
    chain = LlamaChain(("dry", _vocab().vocab, *cfg, *dry_breakers_arg(())))
    row = rng.normal(0, 3, N_VOCAB).astype(np.float32)
    for t in run:
        step.accept(t)
    chain.accept(run)
    for n, t in enumerate(run[:60], 1):               # a repeat of n tokens: penalised from n = allowed
        step.accept(t)
        chain.accept([t])
        assert _apply_alone(step, chain, row) == (n >= 2)


def _lockstep(params: SamplerParams, seeds, steps: int, prompt_len: int, rng, repeat_rows: bool, plain=None):
    """Sampler and libllama's common chain from the same seed: the same prompt accepted, then
    each step sampled and the token accepted in both (common_sampler_sample + accept). Yields
    (ours, theirs, row, draws that a Sampler of `plain` params drew otherwise)."""
    tok, vocab = _tok(), _vocab()
    for seed in seeds:
        ours = Sampler(params, seed, tokenizer=tok)
        theirs = LlamaChain.common(params, seed, N_VOCAB, vocab.vocab)
        other = Sampler(plain or params, seed, tokenizer=tok)
        prompt = _breaker_history(rng, tok, prompt_len)
        ours.accept(prompt)
        theirs.accept(prompt)
        rows = _rows(rng, list(set(prompt))[:100])
        row, differ = next(rows), 0
        for _ in range(steps):
            if not repeat_rows:
                row = next(rows)
            want = theirs.sample(row)
            theirs.accept([want])
            assert ours.sample(row) == want, seed
            differ += other.sample(row) != want
        yield ours, theirs, row, differ


CHAINS = [SamplerParams(repeat_penalty=1.2, frequency_penalty=0.1, presence_penalty=0.2, dry_multiplier=0.8),
          SamplerParams(repeat_penalty=0.9, dry_multiplier=1.5, dry_allowed_length=1, top_k=0, top_p=0.9, min_p=0.0,
                        temp=1.3, logit_bias=((13, -np.inf), (198, 2.0))),
          SamplerParams(repeat_penalty=1.5, dry_multiplier=0.5, samplers=("top_k", "penalties", "dry", "min_p",
                                                                           "temperature", "xtc"),
                        xtc_probability=0.5, xtc_threshold=0.05, temp=0.9)]


@pytest.mark.oracle
@pytest.mark.parametrize("params", CHAINS, ids=["default-order", "bias-topp", "custom-order"])
def test_chain_with_history_draws_llama_cpp_tokens(params):
    """logit bias, penalties and DRY in common's chain (and in another order), 20 seeds, a prompt
    and 5 draws each, the same row again and again (so the draws repeat and the history bites)."""
    rng = np.random.default_rng(3)
    plain = SamplerParams(**{**params.__dict__, "repeat_penalty": 1.0, "dry_multiplier": 0.0, "logit_bias": ()})
    assert sum(d for *_, d in _lockstep(params, range(20), 5, 48, rng, repeat_rows=True, plain=plain)) > 10


@pytest.mark.oracle
@pytest.mark.parametrize("params", [SamplerParams(mirostat=1), SamplerParams(mirostat=1, temp=1.0, mirostat_tau=3.0),
                                    SamplerParams(mirostat=2), SamplerParams(mirostat=2, temp=1.2, mirostat_eta=0.4,
                                                                             logit_bias=((7, -np.inf),)),
                                    SamplerParams(mirostat=2, temp=0.0), SamplerParams(mirostat=1, temp=0.0),
                                    SamplerParams(mirostat=1, temp=1.5, mirostat_tau=12.0, mirostat_eta=1.0)],
                         ids=lambda p: f"m{p.mirostat}-t{p.temp}-tau{p.mirostat_tau}")
def test_mirostat_draws_llama_cpp_tokens_as_mu_moves(params):
    """temp then mirostat (1: k from s_hat, 2: the surprise cut), 20 seeds, 6 draws each (mu carries
    from draw to draw; penalties in params.samplers are ignored), and after each run the candidates
    it left with their p and mu: libllama's. At temp 0 every p but one is 0: mirostat 1's s_hat is
    NaN and int(k) INT_MIN (one candidate), mirostat 2 cuts at the first."""
    rng = np.random.default_rng(4)
    p = SamplerParams(**{**params.__dict__, "repeat_penalty": 1.5})
    sizes = set()
    for ours, theirs, row, _ in _lockstep(p, range(20), 6, 8, rng, repeat_rows=False):
        assert bits(np.float32(ours.steps[-1].mu)) == bits(theirs.mirostat_mu())
        ours.sample(row)
        want, sel, _ = theirs.apply(row)
        assert bits(np.float32(ours.steps[-1].mu)) == bits(theirs.mirostat_mu())
        ids, prob = ours.candidates()
        assert ids.tolist() == want["id"].tolist()
        assert np.array_equal(bits(prob), bits(want["p"]))
        sizes.add(len(ids))
    assert len(sizes) > (1 if p.temp > 0 else 0)    # mu moved the cut


@pytest.mark.oracle
@pytest.mark.parametrize("params", [CHAINS[2], SamplerParams(mirostat=1)], ids=["penalties-dry-xtc", "mirostat1"])
def test_reset_starts_over_as_llama_sampler_reset(params):
    """After reset() the RNGs start again from the seed, the history is gone and mu is 2 * tau:
    the draws are those of libllama's chain after llama_sampler_reset, and those of a new Sampler."""
    rng = np.random.default_rng(5)
    tok = _tok()
    rows = [next(_rows(rng, range(100, 140))) for _ in range(4)]
    for ours, theirs, *_ in _lockstep(params, range(0, 40, 2), 4, 32, rng, repeat_rows=False):
        ours.reset()
        theirs.reset()
        fresh = Sampler(params, ours.seed, tokenizer=tok)
        for row in rows:
            want = theirs.sample(row)
            theirs.accept([want])
            assert ours.sample(row) == want == fresh.sample(row)


def test_suppress_tokens_are_banned_after_the_logit_biases():
    """common_sampler_init appends the vocabulary's suppress tokens to logit_bias at -inf."""
    class Vocab:
        n_vocab, suppress_tokens = 10, (2, 7)
    row = np.zeros(10, np.float32)
    row[[2, 7]] = 50.0
    s = Sampler(SamplerParams(top_k=3, logit_bias=((4, 1.0),)), 0, tokenizer=Vocab())
    assert s.steps[0].biases == [(4, 1.0), (2, -np.inf), (7, -np.inf)]
    assert {s.sample(row) for _ in range(20)} <= set(range(10)) - {2, 7}


@pytest.mark.oracle
def test_dry_on_a_sentencepiece_vocabulary_as_llama_cpp():
    """Gemma's SentencePiece vocabulary with add_space_prefix: the breakers' tails tokenize with
    the leading space llama_tokenize adds, over 262,158 tokens' texts."""
    from bankml.oracle.vocab import Vocab
    from bankml.testing import models
    from bankml.tokenizer import tokenizer_for
    path = models.path("gemma3-vocab-prefix")
    tok, breakers = tokenizer_for(path), ("\n", ":", " brown fox", "日本", "ing the")
    rng = np.random.default_rng(8)
    phrases = [tok.encode(s, False) for s in ("the quick brown fox", ": jumping the", "\n", "日本語", " singing the")]
    phrases += [[tok.encode_bytes("日".encode()[:1], False)[-1]] + tok.encode_bytes("日本".encode()[1:], False)]
    hist = [t for i in rng.integers(0, len(phrases), 120) for t in phrases[i]]
    row = rng.normal(0, 3, tok.n_vocab).astype(np.float32)
    with Vocab(path) as v:
        cfg = (0.8, 1.75, 1, 128)
        step = history.Dry(*cfg, history.dry_breakers(tok, breakers))
        chain = LlamaChain(("dry", v.vocab, *cfg, *dry_breakers_arg(breakers)))
        changed = 0
        for i, t in enumerate(hist):
            step.accept(t)
            chain.accept([t])
            if i % 8 == 7:
                changed += _apply_alone(step, chain, row)
    assert changed > 0
