"""SamplerParams from a dict of its fields: the one place the server and `bankml run` build it.

    kw = {**LLAMA_DEFAULTS, "temp": 0.5, "repeat_penalty": 1.1}
    params = build(kw)              # ValueError: what common_sampler_init refuses

The fields are the sampler interface's (common_params_sampling under llama-server's names,
bankml/runtime/sampler.py); LLAMA_DEFAULTS are common/common.h's, as SamplerParams declares them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bankml.runtime.sampler import SamplerParams

LLAMA_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplerParams)}


def f32(v) -> float:
    """The value as C's float holds it (past FLT_MAX: inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def build(kw: dict) -> SamplerParams:
    """SamplerParams from the interface's fields (any subset; the rest take their defaults)."""
    return SamplerParams(**kw)
