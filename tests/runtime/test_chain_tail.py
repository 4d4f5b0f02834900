"""The chain after top-k in one native call (backends/llvm/chain_tail.py): the same candidates, logits,
probabilities, weights and token as the steps one by one (sampler_filters.py, the spec), and as
libllama's own chain."""
from __future__ import annotations

import numpy as np
import pytest
from test_sampler import LlamaChain, seeds, tied_logits

from bankml.backends.llvm import chain_tail
from bankml.runtime import sampler as S
from bankml.runtime.sampler import GREEDY, Sampler, SamplerParams

NAN = float("nan")
# every step of the tail at its edges: off values, NaN settings, min_keep past k and as a negative
# (a huge size_t), greedy and negative temperatures, orders other than the default, top_k 1 and > 128
TAILS = [SamplerParams(), GREEDY, SamplerParams(top_k=1), SamplerParams(top_k=3000),
         SamplerParams(top_k=200, top_p=0.5, min_p=0.2, min_keep=3, temp=1.5), SamplerParams(top_p=0.2),
         SamplerParams(top_p=NAN), SamplerParams(min_p=NAN), SamplerParams(temp=NAN), SamplerParams(temp=-1.0),
         SamplerParams(min_keep=-1), SamplerParams(min_keep=30), SamplerParams(min_keep=100),
         SamplerParams(top_p=1.0, min_p=0.0, temp=1.0), SamplerParams(top_p=0.99999998, min_p=1e-50),
         SamplerParams(samplers=("top_k", "temperature", "min_p", "top_p")),
         SamplerParams(samplers=("top_k", "top_p", "top_p", "min_p")), SamplerParams(temp=0.0, min_p=0.9),
         # samplers before the tail: it takes the candidates they left (Ollama's default repeat_penalty)
         SamplerParams(repeat_penalty=1.1, frequency_penalty=0.5, logit_bias=((5, 3.0), (17, -np.inf), (99, 40.0))),
         SamplerParams(top_k=1000, repeat_penalty=1.3, presence_penalty=0.2)]


def _ids(p: SamplerParams) -> str:
    return f"k{p.top_k}-p{p.top_p:.3g}-m{p.min_p:.3g}-keep{p.min_keep}-t{p.temp:.3g}-{len(p.samplers)}"


def _rows(rng: np.random.Generator, n: int):
    """Peaked rows with ties, continuous rows, rows with NaNs scattered and at the front."""
    while True:
        yield tied_logits(rng, n, scale=8, step=4)
        yield rng.normal(0, 3, n).astype(np.float32)
        row = tied_logits(rng, n)
        row[rng.integers(0, n, 20)] = np.nan
        yield row
        row = rng.normal(0, 3, n).astype(np.float32)
        row[:3] = np.nan
        yield row
        yield np.zeros(n, np.float32)


def _stepwise(p: SamplerParams, seed: int) -> Sampler:
    """A Sampler whose tail runs step by step (the spec)."""
    s = Sampler(p, seed)
    s.steps = [t for step in s.steps for t in (step.steps if isinstance(step, S._Tail) else [step])]
    s._whole_row = None
    return s


def _last(s: Sampler):
    """The candidates the last sample() left (a whole-row tail keeps them in its buffers)."""
    return s._last.last() if isinstance(s._last, S._Tail) else s._last


def _bits(x) -> bytes:
    return np.asarray(x).tobytes()


@pytest.mark.parametrize("params", TAILS, ids=_ids)
def test_tail_leaves_the_candidates_of_the_steps_one_by_one(params):
    fused, stepwise = Sampler(params, 11), _stepwise(params, 11)
    assert isinstance(fused.steps[-1], S._Tail)
    for s in (fused, stepwise):
        s.accept([5, 17, 5, 99, 2000, 7])           # a history for the penalties
    rows = _rows(np.random.default_rng(5), 3000)
    for _ in range(40):
        row = next(rows)
        assert fused.sample(row) == stepwise.sample(row)
        a, b = _last(fused), _last(stepwise)
        assert a.ids.tolist() == b.ids.tolist() and a.sorted == b.sorted and a.selected == b.selected
        assert _bits(a.logit) == _bits(b.logit)
        assert (a.p is None) == (b.p is None) and (a.p is None or _bits(a.p) == _bits(b.p))
        assert _bits(a.weights) == _bits(b.weights) and _bits(np.float64(a.total)) == _bits(np.float64(b.total))


def test_tail_is_not_fused_where_it_cannot_run_a_step():
    """Dynamic temperature, typical, XTC (on) after top_k, top_k off, mirostat: the steps one by one."""
    for p in (SamplerParams(dynatemp_range=0.5), SamplerParams(typical_p=0.9), SamplerParams(xtc_probability=0.5),
              SamplerParams(top_k=0), SamplerParams(mirostat=2), SamplerParams(samplers=("top_k", "penalties"), repeat_penalty=1.1)):
        assert not any(isinstance(s, S._Tail) for s in Sampler(p, 1).steps), p


def test_tail_takes_sorted_candidates_step_by_step():
    """A sampler before top_k that sorted the candidates (top_p first) leaves them to the steps."""
    p = SamplerParams(samplers=("top_p", "top_k", "min_p", "temperature"))
    fused, stepwise = Sampler(p, 3), _stepwise(p, 3)
    rows = _rows(np.random.default_rng(2), 2000)
    for _ in range(10):
        row = next(rows)
        assert fused.sample(row) == stepwise.sample(row)


def test_program_refuses_arrays_it_cannot_write():
    prog = chain_tail.Program([(chain_tail.TEMP, np.float32(0.5), 0)])
    x = np.ones(4, np.float32)
    with pytest.raises(TypeError):
        prog.run(x[::2], np.empty(4, np.float32), np.empty(4, np.float32), 0.5)
    with pytest.raises(TypeError):
        prog.run(x.astype(np.float64), np.empty(4, np.float32), np.empty(4, np.float32), 0.5)


@pytest.mark.oracle
@pytest.mark.parametrize("n", [49152, 262144])
@pytest.mark.parametrize("params", TAILS, ids=_ids)
def test_tail_leaves_llama_cpp_candidates(params, n):
    """libllama's chain and the fused tail, seeded, 8 draws a seed: the same token, the same
    candidates, logits and probabilities (common_sampler_get_candidates' p: dist's, divided)."""
    rng = np.random.default_rng(n + 7)
    rows = _rows(rng, n)
    for seed in seeds(n, 6):
        ours, theirs = Sampler(params, seed), LlamaChain.common(params, seed, n)
        ours.accept([5, 17, 5, 99, 2000, 7])
        theirs.accept([5, 17, 5, 99, 2000, 7])
        for _ in range(8):
            row = next(rows)
            data, selected, _ = theirs.apply(row)
            token = int(data["id"][selected])
            assert ours.sample(row) == token
            theirs.accept([token])                  # as common_sampler_sample's accept (ours accepts in sample)
            c = _last(ours)
            assert c.ids.tolist() == data["id"].tolist()
            assert _bits(c.logit) == _bits(data["logit"])
