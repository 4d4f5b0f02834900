"""llama.cpp's sampler chain, bit for bit: common/sampling.cpp's common_sampler.

    s = Sampler(SamplerParams(temp=0.8), seed=42, tokenizer=tok)
    s.accept(prompt_ids)                # the history penalties and DRY look at
    tok = s.sample(logits_row)          # one token id, accepted; the RNG state carries to the next call

The chain (common_sampler_init) is logit bias, then params.samplers in order (common.h's
default: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature (temp_ext:
dynamic temperature)), then dist; or, with mirostat 1 or 2, temperature and mirostat alone. At
their off values the samplers are llama.cpp's empty samplers and are skipped here too. The
stateless samplers are in sampler_filters.py, those with a history or a state in sampler_history.py.
top_k and what follows it to dist, when that is top_p, min_p and plain temperature in any order
(the default chain), run as one native call on the k kept candidates (_Tail, with the top-k sort
itself when it is the chain's first step and k <= 128: backends/llvm/chain_tail.py); the steps of
sampler_filters.py are its spec, and tests/runtime/test_chain_tail.py holds the two to the bit.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from bankml.backends.llvm import chain_tail
from bankml.backends.llvm import stdsort as native
from bankml.runtime import sampler_history as history
from bankml.runtime.sampler_filters import (LLAMA_DEFAULT_SEED, MT19937, Candidates, _logf, _positions, _rng_seed,
                                            dist, min_p, temp_ext, temperature, top_k, top_n_sigma, top_p, typical,
                                            xtc)

f32 = np.float32


def c_float(v) -> float:
    """The value as C's float holds it (past FLT_MAX: inf; 1e-50: 0)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(f32(v))


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
        """What common_sampler_init refuses (throws, with these messages, or asserts on), as ValueError."""
        for name in ("dry_sequence_breakers", "samplers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for f in fields(self):                  # common_params_sampling's floats are C floats
            if f.type == "float":
                object.__setattr__(self, f.name, c_float(getattr(self, f.name)))
        object.__setattr__(self, "logit_bias", tuple((int(t), c_float(b)) for t, b in self.logit_bias))
        rp = self.repeat_penalty
        if not (np.isfinite(rp) and rp > 0 and np.isfinite(c_float(1 / rp))):
            raise ValueError("penalty_repeat must be finite and greater than 0")
        for name, field in (("frequency_penalty", "penalty_freq"), ("presence_penalty", "penalty_present")):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{field} must be finite")
        if self.mirostat not in (0, 1, 2):
            raise ValueError(f"sampler mirostat={self.mirostat}: llama.cpp knows 0 (off), 1 and 2")
        for name in self.samplers:
            if name in OTHER_SAMPLERS:
                raise ValueError(f"sampler {name!r}: bankml does not implement it; use {' '.join(DEFAULT_SAMPLERS)}")
            if name not in DEFAULT_SAMPLERS:
                known = " ".join(DEFAULT_SAMPLERS + OTHER_SAMPLERS)
                raise ValueError(f"sampler {name!r}: unknown; llama.cpp's are {known}")


GREEDY = SamplerParams(temp=0.0)
LLAMA_DEFAULTS = {f.name: f.default for f in fields(SamplerParams)}     # common/common.h's

# ---------------------------------------------------------------- the chain

class _Filter:
    """A stateless llama_sampler of the chain: apply is fn(c, *args)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def apply(self, c: Candidates) -> None:
        self.fn(c, *self.args)

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
        steps.append(history.Mirostat(p.mirostat, seed, p.mirostat_tau, p.mirostat_eta))
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
                    raise ValueError("sampler dry_multiplier: DRY needs the model's vocabulary; "
                                     "pass Sampler(..., tokenizer=)")
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
    return _fuse_tail([s for s in steps if not _off(s)])


class _Tail:
    """top_k and the steps after it (top_p, min_p, plain temperature, dist) as one step, native
    (backends/llvm/chain_tail.py, the same operations in the same order): for k <= 128 the top-k
    sort and the rest in one call (Program.top_k); above, llama.cpp's bucketed sort first, then the
    rest in one call (Program.run). Candidates that come in sorted or with probabilities (a sampler
    before top_k set them) take the steps one by one."""

    def __init__(self, k: int, steps: list, program: list):
        self.k, self.steps = k, steps
        self.program = chain_tail.Program(program, k if k <= chain_tail.TOP_K_MAX else 0)
        self.dist = steps[-1]
        self._result: tuple | None = None           # sample_row's (selected, left, has p, total)

    @property
    def whole_row(self) -> bool:
        """Whether the top-k sort runs in the native call too (k <= 128; above, llama.cpp buckets)."""
        return self.program.k > 0

    def sample_row(self, row: np.ndarray) -> int:
        """The steps on a whole row of positions 0.. (contiguous f32): the token's position. What
        they left stays in the program's buffers (last())."""
        rnd = self.dist.rng.canonical()                 # dist draws first, even for one candidate
        self._result = self.program.top_k(row, rnd)
        return int(self.program.ids[self._result[0]])

    def apply(self, c: Candidates) -> None:
        if c.sorted or c.p is not None:
            for step in self.steps:
                step.apply(c)
            return
        if self.whole_row:
            self.sample_row(c.logit)
            left = self.last()
            c.ids, c.logit, c.p, c.sorted = c.ids[left.ids], left.logit, left.p, True   # positions -> c's ids
            c.weights, c.total, c.selected = left.weights, left.total, left.selected
            return
        c.sort_top(min(self.k, len(c.ids)))             # top_k: c.logit is a new array, written below
        k = len(c.ids)
        p, e = np.empty(k, f32), np.empty(k, f32)
        rnd = self.dist.rng.canonical()
        sel, n, has_p, total = self.program.run(c.logit, p, e, rnd)
        c.ids, c.logit = c.ids[:n], c.logit[:n]
        c.p = p[:n] if has_p else None
        c.weights, c.total, c.selected = e[:n], np.float64(total), sel

    def last(self) -> Candidates:
        """The candidates sample_row left, as the steps leave them (copies of the program's buffers;
        ids are positions in the row)."""
        sel, n, has_p, total = self._result
        prog = self.program
        c = Candidates(prog.keys[:n].copy())
        c.ids, c.sorted = prog.ids[:n].copy(), True
        c.p = prog.p[:n].copy() if has_p else None
        c.weights, c.total, c.selected = prog.e[:n].copy(), np.float64(total), sel
        return c

    def reset(self) -> None:
        for step in self.steps:
            step.reset()


def _off(step) -> bool:
    """A stateless sampler at the settings for which llama.cpp's apply returns before it touches the
    candidates (or draws from its RNG): leaving it out of the chain changes nothing."""
    if not isinstance(step, _Filter):
        return False
    fn, a = step.fn, step.args
    if fn is top_k:
        return a[0] <= 0
    if fn in (top_n_sigma, min_p):
        return f32(a[0]) <= 0
    if fn in (typical, top_p):
        return f32(a[0]) >= 1
    if fn is xtc:
        return f32(a[0]) <= 0 or f32(a[1]) > 0.5
    if fn is temp_ext:
        return not f32(a[1]) > 0 and f32(a[0]) == 1
    if fn is temperature:
        return f32(a[0]) == 1
    return False


def _tail_step(step) -> tuple[int, float, int] | None:
    """A step after top_k as chain_tail runs it, (op, float arg, int arg); None when it cannot."""
    if not isinstance(step, _Filter) or isinstance(step, _Seeded):
        return None
    if step.fn is top_p:
        return chain_tail.TOP_P, f32(step.args[0]), step.args[1]
    if step.fn is min_p:
        return chain_tail.MIN_P, _logf(float(f32(step.args[0]))), step.args[1]
    if step.fn is temp_ext and not f32(step.args[1]) > 0:     # no dynamic temperature: plain temp
        return chain_tail.TEMP, f32(step.args[0]), 0
    return None


def _fuse_tail(steps: list) -> list:
    """The chain with top_k and what follows it to dist as one _Tail, when chain_tail runs every
    step between them (the off ones are out already); else as it was."""
    at = next((i for i, s in enumerate(steps) if isinstance(s, _Filter) and s.fn is top_k), None)
    if at is None or not (isinstance(steps[-1], _Seeded) and steps[-1].fn is dist):
        return steps
    program = [_tail_step(s) for s in steps[at + 1:-1]]
    if None in program:
        return steps
    return steps[:at] + [_Tail(steps[at].args[0], steps[at:], program)]


class Sampler:
    """One generation's sampler chain, common/sampling.cpp's common_sampler: its samplers' RNGs
    and histories are its state.

        s = Sampler(params, seed, tokenizer=tok)     # tok: DRY's sequence breakers need the vocabulary
        s.accept(prompt_ids)                         # common_sampler_accept(tok, false) each
        tok = s.sample(row)                          # the chain, then the token accepted
        s.reset()                                    # llama_sampler_reset: RNGs re-seeded, history cleared

    b11434 never maps a negative last_n to the context size (llama_sampler_init_penalties and
    _dry make it 0, off), so the chain needs no n_ctx."""

    def __init__(self, params: SamplerParams = SamplerParams(), seed: int = LLAMA_DEFAULT_SEED, *,
                 tokenizer=None, grammar=None):
        self.params, self.seed = params, seed
        self.grammar = grammar          # a runtime.grammar Grammar (its state moves with each token) or None
        self.steps = _chain(params, seed, tokenizer)
        self._history = [s for s in self.steps if isinstance(s, (history.Penalties, history.Dry))]
        self._last: Candidates | _Tail | None = None
        # the whole chain as one native call (_Tail.sample_row) when it is top_k (<= 128) onwards
        first = self.steps[0]
        self._whole_row = first if len(self.steps) == 1 and isinstance(first, _Tail) and first.whole_row else None

    def accept(self, ids) -> None:
        """llama_sampler_accept of the chain for each token, in order (only penalties and DRY keep
        what they accept; the chain's other accepts do nothing). The grammar is not told: these are
        common_sampler_accept(tok, is_generated=false)'s, the prompt's."""
        for step in self._history:
            for token in ids:
                step.accept(int(token))

    def sample(self, logits: np.ndarray) -> int:
        """common_sampler_sample(grammar_first=false), then common_sampler_accept(token, true): the
        chain picks a token; when a grammar rejects it, the chain runs again (its RNG one draw on)
        on the row with every token the grammar rejects at -inf."""
        token = self._draw(logits)
        grammar = self.grammar
        if grammar is not None:
            if not grammar.allows(token):
                token = self._draw(np.where(grammar.mask(), logits, f32(-np.inf)).astype(f32, copy=False))
            grammar.accept(token)
        if self._history:
            self.accept([token])
        return token

    def _draw(self, logits: np.ndarray) -> int:
        """The chain on one row (llama_sampler_apply(chain)): the selected token, nothing accepted."""
        tail = self._whole_row
        if tail is not None and type(logits) is np.ndarray and logits.dtype == f32 and logits.ndim == 1 \
                and logits.flags.c_contiguous:
            self._last = tail                       # candidates() asks it (_Tail.last)
            return tail.sample_row(logits)
        c = self._last = Candidates(logits)
        for step in self.steps:
            step.apply(c)
        return int(c.ids[c.selected])

    def reset(self) -> None:
        for step in self.steps:
            step.reset()

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """common_sampler_get_candidates(smpl, do_sort=true) after the last sample(): the candidates
        the chain left (ids i32) with the p dist (or mirostat) gave them (f32); when the chain left
        them unsorted, std::sort by p descending (the native introsort: equal p in its order)."""
        c = self._last.last() if isinstance(self._last, _Tail) else self._last
        if c is None or c.weights is None:
            raise ValueError("candidates(): no token sampled yet")
        p = (c.weights.astype(np.float64) / c.total).astype(np.float32)
        if c.sorted:
            return c.ids.copy(), p
        order = _positions(len(p)).copy()
        native.std_sort(p, order)
        return c.ids[order], p


def prepare() -> None:
    """Compile the sampler's native code now (the sorts, the chain's tail) or load it from the JIT
    cache, before a first token needs it: `bankml compile` calls it so that a run compiles nothing."""
    native.prepare()
    chain_tail.prepare()


def greedy(logits: np.ndarray) -> int:
    """The token llama.cpp's chain picks at temperature 0 (first of the highest logits after top-k)."""
    return Sampler(GREEDY, seed=0).sample(logits)
