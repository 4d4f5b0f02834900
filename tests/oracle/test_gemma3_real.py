"""The real Gemma-3-270M Q4_K_M file identical to llama.cpp: logits rows and named tensors, both backends.

Its matrices mix four types per tensor (81 Q5_0, 27 Q4_K, 10 Q8_0 with the embeddings, 9 Q6_K):
Q, K, gate and up (Q5_0) share one q8_0 activation with V (Q8_0); attn_output (Q4_K, 640 rows:
ggml's repacked 8x8 gemm/gemv with q8_K activations) and ffn_down (Q6_K, q8_K) quantize their
own inputs; the tied logits are a Q8_0 mul_mat of 262,144 rows. Prompts of 1..65 tokens stay in
one micro-batch; 600 crosses the 512 window inside the second micro-batch (512 + 88); 1,100 is
three micro-batches (512 + 512 + 76), the last one's queries seeing only the window. Decodes run
to 1,100 cells (split-KV, the oldest cells leaving the window) at llama_threads 2 and 3.

Tokens are drawn over the whole 262,144-token vocabulary (get_rows of any Q8_0 embedding row).
The oracle harness runs llama_context_default_params(): swa_full (a full-size SWA cache).

The reference backend runs this model up to 65 tokens and 44 decodes: its 600-token prompt
(3.5 minutes of numpy, the suite's slowest test) is held piece by piece on smaller models:
the 512 window crossed with no output in the first micro-batch on gemma3-tiny-w512
(test_gemma3.py), Q4_K/Q6_K at 600 tokens on llama-kq-q4_k_m (test_kquant_models.py); its
Q5_0/Q8_0 mat-muls of many columns (tinyBLAS) at 65 tokens here and on SmolLM2's copies
(test_legacy_quants.py); llvm runs this model's 600 and 1,100 tokens.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_logits import assert_rows_identical, greedy_identical, prefill_case
from test_named_tensors import record_diff

import bankml
from bankml import oracle
from bankml.diff import diff
from bankml.testing import models

pytestmark = pytest.mark.oracle

NAME = "gemma3-270m-q4_k_m"
N_VOCAB = 262144
_loaded: dict = {}



def load(backend: str, llama_threads: int = 2) -> bankml.Model:
    key = (backend, llama_threads)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(NAME), backend=backend, threads=2, llama_threads=llama_threads)
    return _loaded[key]


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_VOCAB, n).tolist()


def prefill_identical(record, backend: str, n: int, outputs: str) -> None:
    m = load(backend)
    t = tokens(n, n)
    ref = oracle.logits(m.path, t, threads=2, outputs=outputs)
    got = m.session().prefill(t, outputs=outputs)
    assert_rows_identical(record, got, ref, **prefill_case(m, NAME, n, outputs))


@pytest.mark.parametrize("outputs", ["all", "last"])
@pytest.mark.parametrize("n", [1, 7, 63, 64, 65, 600])
def test_llvm_gemma3_270m_prefill_rows_identical(record, n, outputs):
    prefill_identical(record, "llvm", n, outputs)


@pytest.mark.slow
@pytest.mark.parametrize("outputs", ["all", "last"])
def test_llvm_gemma3_270m_1100_token_prompt(record, outputs):
    prefill_identical(record, "llvm", 1100, outputs)


@pytest.mark.parametrize("n,outputs", [(1, "all"), (7, "all"), (65, "last")])
def test_reference_gemma3_270m_prefill_rows_identical(record, n, outputs):
    prefill_identical(record, "reference", n, outputs)


@pytest.mark.parametrize("backend,n", [("llvm", 7), ("llvm", 65), ("reference", 7)])
def test_gemma3_270m_named_tensors_identical(record, backend, n):
    """Every named tensor of every layer (sliding-window and global; the Q5_0, Q8_0, Q4_K and
    Q6_K mat-muls among them) equals llama.cpp's."""
    r = diff(load(backend), tokens(n, n), backend=backend)
    record_diff(record, r, model=NAME, backend=backend, tokens=n, outputs="all")
    assert r.first_difference is None, r.summary()
    got = {c.name for c in r.compared}
    for want in ("Vcur-0", "kqv_out-0", "attn_post_norm-0", "ffn_geglu-0", "ffn_out-0", "l_out-5",
                 "l_out-17", "result_output"):
        assert want in got, want
    assert not r.missing, r.missing


@pytest.mark.slow
def test_llvm_gemma3_270m_named_tensors_past_the_window(record):
    """A 600-token prompt: the second micro-batch's sliding-window layers mask cells < pos - 511."""
    r = diff(load("llvm"), tokens(600, 600), outputs="last", backend="llvm")
    record_diff(record, r, model=NAME, backend="llvm", tokens=600, outputs="last")
    assert r.first_difference is None, r.summary()
    assert not r.missing, r.missing


@pytest.mark.slow
@pytest.mark.parametrize("llama_threads", [2, 3])
def test_llvm_gemma3_270m_decodes_to_1100_cells(record, llama_threads):
    """A 600-token prompt, then greedy decodes to 1,100 cells (n_kv 768..1280, split-KV chunks of
    ceil(n_kv / llama_threads) cells, cells leaving the 512 window on the sliding layers)."""
    greedy_identical(record, load("llvm", llama_threads), tokens(600, 601), 1100)


def test_reference_gemma3_270m_decodes(record):
    """The reference backend's decodes after a prompt of 40 tokens, at llama_threads 3."""
    greedy_identical(record, load("reference", 3), tokens(40, 40), 44)
