"""ModelOptions: load()'s settings in one frozen object, llama.cpp's defaults, each refusal one line."""
from __future__ import annotations

import dataclasses

import pytest

from bankml.errors import BankmlError
from bankml.runtime.options import ModelOptions


def test_defaults_are_llama_cpps_and_the_options_are_frozen():
    o = ModelOptions()
    assert (o.n_ctx, o.n_ubatch, o.cache_type, o.swa_full, o.profile) == (4096, 512, "f16", True, "ggml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.threads = 2


@pytest.mark.parametrize("kw,why", [
    ({"backend": "cuda"}, "unknown backend 'cuda'; choose one of reference, llvm"),
    ({"threads": 0}, "threads, llama_threads, n_ubatch and n_ctx must be positive"),
    ({"llama_threads": 0}, "must be positive"), ({"n_ubatch": 0}, "must be positive"),
    ({"n_ctx": -1}, "must be positive"),
    ({"profile": "fast"}, "unknown profile 'fast'; choose one of ggml, portable"),
    ({"profile": "portable", "gpu": 0}, "profile 'portable' has no GPU lowering yet")])
def test_each_bad_setting_is_refused_in_one_line(kw, why):
    with pytest.raises(BankmlError, match=why) as e:
        ModelOptions(**kw)
    assert "\n" not in str(e.value)
