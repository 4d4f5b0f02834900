"""The Qwen3.5 test models (issue 27, bankml/testing/models.py): llama.cpp b11434 itself loads and
runs each before bankml is held to it (tests/oracle/test_qwen35.py).

qwen35-small: 3 Gated-DeltaNet layers then one gated full-attention layer, 8 v-heads over 4
k-heads of 32; F16 as written, --pure Q8_0, Q1_0, Q2_0 and llama-quantize's default Q4_K_M mix.
"""
from __future__ import annotations

import numpy as np
import pytest

from bankml import oracle
from bankml.gguf import read_gguf
from bankml.testing import models

pytestmark = pytest.mark.oracle

SMALL = ["qwen35-small-f16", "qwen35-small-q8_0", "qwen35-small-q4_k_m", "qwen35-small-q1_0", "qwen35-small-q2_0"]


@pytest.fixture(scope="module")
def rows() -> dict:
    """Every model's logits for one 7-token prompt (every row), then 3 decodes."""
    tokens = [1, 504, 2365, 282, 253, 1012, 30, 216, 2025, 314]
    return {name: oracle.logits(models.path(name), tokens, decode_from=7) for name in SMALL}


@pytest.mark.parametrize("name", SMALL)
def test_llama_cpp_runs_each(rows, name):
    r = rows[name]
    assert r.shape == (10, 49152)
    assert np.isfinite(r).all()
    assert len({row.tobytes() for row in r}) == 10       # each position its own logits: the state moves


def test_quantized_copies_differ_from_f16(rows):
    digests = {name: rows[name].tobytes() for name in SMALL}
    assert len(set(digests.values())) == len(SMALL)


def test_what_the_files_hold():
    g = read_gguf(models.path("qwen35-small-q4_k_m"))
    md = g.metadata
    assert md["general.architecture"] == "qwen35"
    assert md["qwen35.ssm.inner_size"] == md["qwen35.ssm.state_size"] * md["qwen35.ssm.time_step_rank"]
    assert list(md["qwen35.rope.dimension_sections"]) == [3, 3, 2, 0]
    recurrent = [i for i in range(4) if f"blk.{i}.ssm_conv1d.weight" in g.tensors]
    assert recurrent == [0, 1, 2] and "blk.3.attn_q.weight" in g.tensors
    assert g.tensors["blk.0.ssm_conv1d.weight"].ggml_type == 0          # F32: ggml's SSM_CONV takes no other

