"""Gemma 3 (src/models/gemma3.cpp) identical to llama.cpp: logits rows and named tensors, both backends.

Synthetic Gemma-3-shaped models (bankml/testing/models.py): 5 sliding-window layers and one
global layer, head size 256, GELU-gated FFN, Q/K norms, post norms, tied output. The 48-token
window is crossed inside one micro-batch (64 and 65 tokens: the tiled kernel skipping fully
masked key tiles), across micro-batches (600 tokens: 512 + 88), and by decodes through the
split-KV kernel (chunks of cells, some wholly outside the window); the 512-token window of the
real model is crossed by a 600-token prompt.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_logits import assert_rows_identical, decode_case, greedy_identical, prefill_case, tokens
from test_named_tensors import record_diff

import bankml
from bankml import oracle
from bankml.diff import diff
from bankml.testing import models

pytestmark = pytest.mark.oracle

W48 = ["gemma3-tiny-w48-f16", "gemma3-tiny-w48-q8_0"]
_loaded: dict = {}



def load(name: str, backend: str, llama_threads: int = 2, threads: int = 2) -> bankml.Model:
    key = (name, backend, llama_threads, threads)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=threads, llama_threads=llama_threads)
    return _loaded[key]


def prefill_identical(record, name: str, backend: str, n: int, outputs: str) -> None:
    m = load(name, backend)
    ref = oracle.logits(m.path, tokens(n, n), threads=2, outputs=outputs)
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), ref,
                          **prefill_case(m, name, n, outputs))


@pytest.mark.parametrize("outputs", ["all", "last"])
@pytest.mark.parametrize("n", [1, 7, 64, 65, 600])
@pytest.mark.parametrize("name", W48)
def test_llvm_gemma3_prefill_rows_identical(record, name, n, outputs):
    prefill_identical(record, name, "llvm", n, outputs)


@pytest.mark.parametrize("threads", [1, 3])
def test_llvm_gemma3_threads_never_change_the_bits(record, threads):
    m = load("gemma3-tiny-w48-f16", "llvm", threads=threads)
    ref = oracle.logits(m.path, tokens(65, 65), threads=2, outputs="all")
    assert_rows_identical(record, m.session().prefill(tokens(65, 65), outputs="all"), ref,
                          **prefill_case(m, "gemma3-tiny-w48-f16", 65, "all"))


@pytest.mark.parametrize("outputs", ["all", "last"])
@pytest.mark.parametrize("n", [1, 7, 65])
def test_reference_gemma3_prefill_rows_identical(record, n, outputs):
    prefill_identical(record, "gemma3-tiny-w48-q8_0", "reference", n, outputs)


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_gemma3_real_window_512_crossed_by_a_600_token_prompt(record, backend):
    prefill_identical(record, "gemma3-tiny-w512-f16", backend, 600, "last" if backend == "reference" else "all")


@pytest.mark.parametrize("backend", ["llvm", "reference"])
@pytest.mark.parametrize("n", [7, 65])
def test_gemma3_named_tensors_identical(record, backend, n):
    """Every named tensor (Q/K norms, attn_post_norm, sa_out, ffn_geglu, ffn_post_norm, l_out of
    every layer, the sliding-window layers and the global one) equals llama.cpp's. (bankml diff
    leaves inp_* names out, inp_scaled among them: attn_norm-0 is computed from it.)"""
    name = "gemma3-tiny-w48-f16"
    t = np.random.default_rng(n).integers(0, 49152, n).tolist()
    r = diff(models.path(name), t, backend=backend)
    record_diff(record, r, model=name, backend=backend, tokens=n, outputs="all")
    assert r.first_difference is None, r.summary()
    got = {c.name for c in r.compared}
    for want in ("attn_norm-0", "Qcur_normed-0", "Kcur_normed-0", "Qcur-0", "Kcur-0", "Vcur-0",
                 "kqv_out-0", "attn_post_norm-0", "sa_out-0", "ffn_norm-0", "ffn_up-0", "ffn_gate-0",
                 "ffn_geglu-0", "ffn_out-0", "ffn_post_norm-0", "l_out-0", "kqv_out-5", "l_out-5", "norm",
                 "result_norm", "result_output"):
        assert want in got, want
    assert not r.missing, r.missing


@pytest.mark.parametrize("llama_threads", [2, 3])
def test_llvm_gemma3_greedy_decodes_past_the_window(record, llama_threads):
    """A 40-token prompt, then decodes to 400 cells: the window (48) is passed at once, split-KV
    from 257 cells (n_kv 512) with chunks that lie wholly outside the window."""
    greedy_identical(record, load("gemma3-tiny-w48-f16", "llvm", llama_threads), tokens(40, 3), 400)


def test_reference_gemma3_greedy_decodes_past_the_window(record):
    """Decodes from 250 to 270 cells on the reference backend: split-KV (n_kv 512) at llama_threads 3."""
    greedy_identical(record, load("gemma3-tiny-w48-q8_0", "reference", 3), tokens(250, 4), 270)


@pytest.mark.slow
@pytest.mark.parametrize("llama_threads", [2, 3])
def test_llvm_gemma3_real_window_decodes_to_1100_cells(record, llama_threads):
    """The 512-token window: a 600-token prompt, then decodes to 1,100 cells (split-KV over n_kv
    768..1280, chunks of ceil(n_kv / llama_threads) cells, the oldest leaving the window)."""
    greedy_identical(record, load("gemma3-tiny-w512-f16", "llvm", llama_threads), tokens(600, 5), 1100)


# ---- llama-server's sliding-window cache (swa_full = false): a ring of PAD256(n_swa + n_ubatch) cells

def ring_identical(record, name: str, backend: str, n_ubatch: int, prompt: int, total: int,
                   llama_threads: int = 2) -> None:
    """A prompt in micro-batches of n_ubatch, then decodes to `total` cells, against libllama with
    swa_full = false (bankml.oracle.swa): the sliding-window cells are reused once the window has
    left them, so keys sit out of position order and that cache's n_kv stops growing."""
    from bankml.oracle import swa
    m = bankml.load(models.path(name), backend=backend, threads=2, llama_threads=llama_threads, n_ubatch=n_ubatch,
                    swa_full=False)
    try:
        t = tokens(total, prompt)
        s = m.session()
        rows = np.stack([s.prefill(t[:prompt], outputs="last")[-1]] + [s.decode(x) for x in t[prompt:]])
        assert s.swa.size == m.kv_size_swa < m.kv_size and s.swa.pos.max() >= s.swa.size   # the ring wrapped
        ref = swa.logits(m.path, t, decode_from=prompt, threads=llama_threads, n_ubatch=n_ubatch, swa_full=False)
        case = decode_case(m, name, prompt, total) | {"backend": f"{backend}, SWA ring of {m.kv_size_swa} cells "
                                                                        f"(ubatch {n_ubatch})"}
        assert_rows_identical(record, rows, ref, **case, swa_full=False, n_ubatch=n_ubatch)
    finally:
        m.close()


@pytest.mark.parametrize("llama_threads", [2, 3])
def test_llvm_gemma3_swa_ring_cache_like_llama_server(record, llama_threads):
    """Window 48, micro-batches of 64: a ring of 256 cells, wrapped inside the 300-token prompt
    and again by the decodes (split-KV on the base layers, one_chunk on the 256-cell ring)."""
    ring_identical(record, "gemma3-tiny-w48-f16", "llvm", 64, 300, 420, llama_threads)


def test_reference_gemma3_swa_ring_cache_like_llama_server(record):
    ring_identical(record, "gemma3-tiny-w48-q8_0", "reference", 64, 200, 280, 3)


@pytest.mark.slow
def test_llvm_gemma3_real_window_ring_cache_to_1100_cells(record):
    """The real window (512) and micro-batch (512): a ring of 1,024 cells, wrapped by the
    decodes from 600 to 1,100 cells (split-KV over the ring's 1,024 cells)."""
    ring_identical(record, "gemma3-tiny-w512-f16", "llvm", 512, 600, 1100, 3)
