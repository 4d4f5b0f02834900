"""Qwen3.5's declaration (bankml/arch/qwen35.py): what load_arch_hparams gives, and each refusal."""
from __future__ import annotations

import dataclasses
import re

import pytest

from bankml.arch import mrope_text_refusal
from bankml.arch.plan import plan
from bankml.arch.qwen35 import derive
from bankml.errors import ModelRefused
from bankml.gguf import read_gguf
from bankml.testing import models


@pytest.fixture(scope="module")
def hp():
    return plan(read_gguf(models.path("qwen35-small-f16"))).hparams


def derived(hp, **extra):
    return derive(dataclasses.replace(hp, extra={**hp.extra, **extra}), ModelRefused)


def test_the_small_model_as_llama_cpp_reads_it(hp):
    assert hp.recurrent_layers == (True, True, True, False) and hp.n_layer_kv() == 1
    assert hp.n_rot == 16 and hp.head_dim == 64 and hp.rope_type == "imrope"
    assert derived(hp)["ssm_conv_channels"] == 2 * 4 * 32 + 8 * 32


def test_recurrent_layers_from_flags_or_the_interval(hp):
    assert derived(hp, **{"attention.recurrent_layers": (1, 0, 1, 0)})["recurrent_layers"] == (True, False, True, False)
    assert derived(hp, **{"full_attention_interval": 2})["recurrent_layers"] == (True, False, True, False)


@pytest.mark.parametrize("extra,cause", [
    ({"nextn_predict_layers": 1}, "the MTP layers are not reproduced"),
    ({"ssm.state_size": 48, "ssm.inner_size": 384}, "needs a multiple of 32"),
    ({"ssm.inner_size": 300}, "inner size = state size x v heads"),
    ({"ssm.group_count": 3}, "v heads a multiple of k heads"),
    ({"attention.recurrent_layers": (1, 0)}, "one flag for each of 4 layers"),
    ({"full_attention_interval": 0}, "full_attention_interval is 0"),
    ({"rope.dimension_sections": (1, 1, 1, 5)}, "the 4th (vision) position"),
])
def test_refusals(hp, extra, cause):
    with pytest.raises(ModelRefused, match=re.escape(cause)):
        derived(hp, **extra)


def test_text_rope_sections():
    assert mrope_text_refusal((11, 11, 10, 0), 64) is None and mrope_text_refusal((3, 3, 2, 0), 16) is None
    assert "pair 3" in mrope_text_refusal((1, 1, 1, 5), 16)       # sector 3: t's 3 x 1 sectors are 0..2
    assert mrope_text_refusal((0, 0, 0, 0), 16) is not None
