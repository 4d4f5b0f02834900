"""SamplerParams from a dict of its fields: the one place the server and `bankml run` build it.

    kw = {**LLAMA_DEFAULTS, "temp": 0.5, "repeat_penalty": 1.1}
    params = build(kw, explicit={"temp", "repeat_penalty"})     # or Unsupported / ValueError

The fields are the sampler interface's (common_params_sampling under llama-server's names,
bankml/runtime/sampler.py). build refuses (Unsupported) a field that SamplerParams does not have,
or a value it does not take, when the caller set it (`explicit`), and leaves it at llama.cpp's
default when only a default of the caller's set it (Ollama's repeat_penalty 1.1). Once
SamplerParams has every field of the interface (the sampler branch merged), nothing is dropped
and Unsupported is never raised.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bankml.runtime.sampler import SamplerParams

# common_params_sampling's defaults (common/common.h) for every field of the interface;
# SamplerParams' own defaults win where it has the field.
LLAMA_DEFAULTS = dict(
    temp=0.8, dynatemp_range=0.0, dynatemp_exponent=1.0, top_k=40, top_p=0.95, min_p=0.05, min_keep=0,
    typical_p=1.0, top_n_sigma=-1.0, xtc_probability=0.0, xtc_threshold=0.1, repeat_last_n=64,
    repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, dry_multiplier=0.0, dry_base=1.75,
    dry_allowed_length=2, dry_penalty_last_n=64, dry_sequence_breakers=("\n", ":", "\"", "*"), mirostat=0,
    mirostat_tau=5.0, mirostat_eta=0.1, logit_bias=(),
    samplers=("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"))
LLAMA_DEFAULTS.update({f.name: f.default for f in dataclasses.fields(SamplerParams)
                       if f.default is not dataclasses.MISSING})


class Unsupported(ValueError):
    """A field (or value) bankml's sampler does not have yet."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def f32(v) -> float:
    """The value as C's float holds it (past FLT_MAX: inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def same(a, b) -> bool:
    """Equal as llama.cpp holds them (floats as float32)."""
    if isinstance(a, float) or isinstance(b, float):
        return f32(a) == f32(b)
    return a == b


def _fields() -> dict:
    return {f.name: f.default for f in dataclasses.fields(SamplerParams)}


def takes(name: str, value) -> bool:
    """Whether SamplerParams has the field and takes the value."""
    if name not in _fields():
        return same(value, LLAMA_DEFAULTS[name])
    try:
        SamplerParams(**{name: value})
        return True
    except ValueError:
        return False


# a setting that only matters with its sampler on: (the sampler's switches, their off values)
_ONLY_WITH = {
    "repeat_last_n": {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0},
    "dry_base": {"dry_multiplier": 0.0}, "dry_allowed_length": {"dry_multiplier": 0.0},
    "dry_penalty_last_n": {"dry_multiplier": 0.0}, "dry_sequence_breakers": {"dry_multiplier": 0.0},
    "mirostat_tau": {"mirostat": 0}, "mirostat_eta": {"mirostat": 0},
}


def _idle(name: str, kw: dict) -> bool:
    """A setting whose sampler is off (it changes nothing)."""
    off = _ONLY_WITH.get(name)
    return off is not None and all(same(kw.get(k, v), v) for k, v in off.items())


def build(kw: dict, explicit: set) -> SamplerParams:
    """SamplerParams from the interface's fields (any subset; the rest take their defaults). A
    setting of a sampler that is off is never refused (repeat_last_n without a penalty)."""
    have = _fields()
    use = {}
    kept = {n: v if n in explicit or takes(n, v) else LLAMA_DEFAULTS[n] for n, v in kw.items()}
    for name, v in kw.items():
        if name not in have and _idle(name, kept):
            continue
        if name in have:
            if same(v, have[name]):
                continue
            try:
                SamplerParams(**{name: v})
                use[name] = v
            except ValueError as e:
                if name in explicit:
                    raise Unsupported(name, str(e)) from None
        elif name in explicit and not same(v, LLAMA_DEFAULTS[name]):
            raise Unsupported(name, f"bankml's sampler has no {name} sampler yet")
    return SamplerParams(**use)
