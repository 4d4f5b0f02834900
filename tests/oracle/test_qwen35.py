"""Qwen3.5 (src/models/qwen35.cpp) identical to llama.cpp: logits rows and named tensors, both backends.

qwen35-small (bankml/testing/models.py): 3 Gated-DeltaNet layers (8 v-heads over 4 k-heads of
32, a 4-tap convolution) then one gated attention layer (partial rotary: 16 of 64 dims, IMROPE
sections 3/3/2/0), tied output. The recurrent states carry across micro-batches (600 and 1,100
tokens: 512 + 88, 512 + 512 + 76; 600 in micro-batches of 64) and decodes (to 1,100 cells at
llama_threads 2 and 3).
"""
from __future__ import annotations

import pytest
from test_logits import assert_rows_identical, greedy_identical, prefill_case, tokens
from test_named_tensors import record_diff

import bankml
from bankml import oracle
from bankml.diff import diff
from bankml.testing import models

pytestmark = pytest.mark.oracle

ALL_LENGTHS = [1, 7, 63, 64, 65, 600, 1100]
CASES = ([(name, n, outputs) for name in ("qwen35-small-f16", "qwen35-small-q4_k_m") for n in ALL_LENGTHS
          for outputs in ("all", "last")]
         + [(name, n, "all") for name in ("qwen35-small-q8_0", "qwen35-small-q1_0", "qwen35-small-q2_0")
            for n in (7, 600)])
_loaded: dict = {}


def load(name: str, backend: str, llama_threads: int = 2, threads: int = 2, n_ubatch: int = 512) -> bankml.Model:
    key = (name, backend, llama_threads, threads, n_ubatch)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=threads,
                                   llama_threads=llama_threads, n_ubatch=n_ubatch)
    return _loaded[key]


def prefill_identical(record, m: bankml.Model, name: str, n: int, outputs: str) -> None:
    ref = oracle.logits(m.path, tokens(n, n), threads=m.llama_threads, n_ubatch=m.n_ubatch, outputs=outputs)
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), ref,
                          **prefill_case(m, name, n, outputs), n_ubatch=m.n_ubatch)


@pytest.mark.parametrize("name,n,outputs", CASES)
def test_llvm_qwen35_prefill_rows_identical(record, name, n, outputs):
    prefill_identical(record, load(name, "llvm"), name, n, outputs)


@pytest.mark.parametrize("outputs", ["all", "last"])
@pytest.mark.parametrize("n", [1, 7, 63, 64, 65])
@pytest.mark.parametrize("name", ["qwen35-small-f16", "qwen35-small-q8_0"])
def test_reference_qwen35_prefill_rows_identical(record, name, n, outputs):
    prefill_identical(record, load(name, "reference"), name, n, outputs)


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_qwen35_micro_batches_of_64_carry_the_states(record, backend):
    """600 tokens in 10 micro-batches of 64 (the last of 24): each starts from the conv and SSM
    states the one before left."""
    name = "qwen35-small-q4_k_m"
    prefill_identical(record, load(name, backend, n_ubatch=64), name, 600, "all" if backend == "llvm" else "last")


@pytest.mark.parametrize("threads", [1, 3])
def test_llvm_qwen35_threads_never_change_the_bits(record, threads):
    prefill_identical(record, load("qwen35-small-f16", "llvm", threads=threads), "qwen35-small-f16", 65, "all")


@pytest.mark.parametrize("llama_threads", [2, 3])
@pytest.mark.parametrize("name", ["qwen35-small-f16", "qwen35-small-q4_k_m"])
def test_llvm_qwen35_greedy_decodes_to_1100_cells(record, name, llama_threads):
    """A 600-token prompt, then one llama_decode per token to 1,100 cells: the states stepped one
    token at a time, the attention layer through split-KV."""
    greedy_identical(record, load(name, "llvm", llama_threads), tokens(600, 11), 1100)


def test_reference_qwen35_greedy_decodes(record):
    greedy_identical(record, load("qwen35-small-q8_0", "reference", 3), tokens(250, 7), 270)


@pytest.mark.parametrize("backend,name,n,n_ubatch", [("reference", "qwen35-small-f16", 7, 512),
                                                      ("llvm", "qwen35-small-q4_k_m", 65, 512),
                                                      ("llvm", "qwen35-small-f16", 150, 64)])
def test_qwen35_named_tensors_identical(record, backend, name, n, n_ubatch):
    """Every named tensor of both layer kinds equals llama.cpp's: the projections, the gates
    (beta_sigmoid, a_softplus, gate), the convolution (conv_output_raw, _silu), the L2-normed q
    and k, the delta net's output (attn_output), the gated norm (final_output), and the attention
    layer's query/gate halves, norms, rope, pregate and gated output; with micro-batches of 64
    the states carried between them."""
    m = load(name, backend, n_ubatch=n_ubatch)
    t = tokens(n, n)
    r = diff(m, t)
    record_diff(record, r, model=name, backend=backend, tokens=n, outputs="all", n_ubatch=n_ubatch)
    assert r.first_difference is None, r.summary()
    got = {c.name for c in r.compared}
    for want in ("model.input_embed", "attn_norm-0", "linear_attn_qkv_mixed-0", "z-0", "beta_sigmoid-0",
                 "a_softplus-0", "gate-0", "conv_output_raw-0", "conv_output_silu-0", "q_conv_predelta-0",
                 "k_conv_predelta-0", "v_conv_predelta-0", "attn_output-0", "final_output-0", "linear_attn_out-2",
                 "attn_residual-0", "attn_post_norm-0", "ffn_swiglu-0", "l_out-2", "Qcur_full-3",
                 "Qcur_reshaped-3", "Qcur_normed-3", "Kcur_normed-3", "gate_reshaped-3", "Qcur-3", "Kcur-3",
                 "attn_pregate-3", "gate_sigmoid-3", "attn_gated-3", "attn_output-3", "l_out-3", "h_nextn",
                 "result_output"):
        assert want in got, want
    assert not r.missing, r.missing

