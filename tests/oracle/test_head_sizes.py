"""Head sizes past 64, 128 and 256, identical to llama.cpp on both backends.

Random-weight Llamas (NORM rope) and Qwen3s (NEOX rope, Q/K norms) of 2 layers and 2 heads over
one K/V head (bankml/testing/models.py): 80 and 112 (D % 32 == 16: ggml_vec_dot_f16's f64 tail,
vec_mad_f16's leftover loop), 96 and 160 (D % 64 == 32), 192 (a quantized cache's Hadamard
rotation of 64, three to a head); 96 and 112 are head sizes whose kq_scale 1.0f/sqrtf(D)
differs from 1/sqrt(D) computed in f64. A 65-token prompt, every row (the tiled kernel), then
3 decodes (one_chunk); decodes past 256 cells (split-KV); f16, q8_0 and q4_0 caches.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_logits import assert_rows_identical, decode_case, greedy, prefill_case, tokens

import bankml
from bankml import oracle
from bankml.testing import models

pytestmark = pytest.mark.oracle

LLVM = ["llama-h80-f16", "llama-h96-f16", "llama-h192-f16", "qwen3-h112-f16", "qwen3-h160-f16", "qwen3-h112-q8_0"]
REFERENCE = ["llama-h80-f16", "qwen3-h112-f16"]       # numpy: the two with leftover loops (D % 32 == 16)
PROMPT, DECODES = 65, 3

_loaded: dict = {}


def load(name: str, backend: str, llama_threads: int = 2, kt: str = "f16", vt: str = "f16") -> bankml.Model:
    key = (name, backend, llama_threads, kt, vt)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=2, llama_threads=llama_threads,
                                   cache_type_k=kt, cache_type_v=vt)
    return _loaded[key]


def prefill_then_decodes(record, m: bankml.Model, name: str) -> None:
    """PROMPT tokens in one micro-batch with every row's logits, then DECODES single-token
    decodes, against one llama.cpp run of the same llama_decode calls."""
    t = tokens(PROMPT + DECODES, PROMPT)
    ref = oracle.logits(m.path, t, threads=m.llama_threads, outputs="all", decode_from=PROMPT,
                        cache_type_k=m.cache_type_k, cache_type_v=m.cache_type_v)
    s = m.session()
    rows = s.prefill(t[:PROMPT], outputs="all")
    decodes = np.stack([s.decode(x) for x in t[PROMPT:]])
    what = dict(cache_type_k=m.cache_type_k, cache_type_v=m.cache_type_v)
    assert_rows_identical(record, rows, ref[:PROMPT], **prefill_case(m, name, PROMPT, "all"), **what)
    assert_rows_identical(record, decodes, ref[PROMPT:], **decode_case(m, name, PROMPT, PROMPT + DECODES), **what)


@pytest.mark.parametrize("name,backend", [(n, "llvm") for n in LLVM] + [(n, "reference") for n in REFERENCE])
def test_head_size_prefill_rows_and_decodes_identical(record, name, backend):
    prefill_then_decodes(record, load(name, backend), name)


@pytest.mark.parametrize("name", ["llama-h80-f16", "qwen3-h112-f16"])
def test_llvm_head_size_7_token_prompt_identical(record, name):
    """Fewer than 64 rows: one_chunk over several rows, two heads of a row side by side."""
    m = load(name, "llvm")
    ref = oracle.logits(m.path, tokens(7, 7), threads=2, outputs="all")
    assert_rows_identical(record, m.session().prefill(tokens(7, 7), outputs="all"), ref,
                          **prefill_case(m, name, 7, "all"))


@pytest.mark.parametrize("name", ["llama-h80-f16", "qwen3-h112-f16"])
def test_llvm_head_size_decodes_cross_into_split_kernel(record, name):
    """A 250-token prompt, then greedy decodes to 260 cells: padded n_kv reaches 512 at 257
    cells (split-KV, chunks of ceil(512 / 3) cells for llama_threads 3). (The reference
    backend's split-KV runs the one_chunk scores and V chain its decodes above check.)"""
    m = load(name, "llvm", llama_threads=3)
    toks, rows = greedy(m, tokens(250, 7), 260)
    ref = oracle.logits(m.path, toks, threads=3, outputs="last", decode_from=250)
    assert_rows_identical(record, rows, ref[1:], **decode_case(m, name, 250, 260))


@pytest.mark.parametrize("name,kt,vt,backend", [
    ("llama-h192-f16", "q8_0", "q8_0", "llvm"),        # K and V rotated by 64, three blocks a head
    ("llama-h192-f16", "q8_0", "q8_0", "reference"),
    ("qwen3-h160-f16", "q4_0", "f16", "llvm")])        # 160 % 64 != 0: no rotation
def test_head_size_quantized_cache_identical(record, name, kt, vt, backend):
    prefill_then_decodes(record, load(name, backend, kt=kt, vt=vt), name)
