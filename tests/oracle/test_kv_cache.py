"""A quantized K/V cache, identical to llama.cpp b11434 with the same `-ctk/-ctv`: every named tensor
(the Hadamard rotations included, as ggml names them: node_<index>), every logits row across the
64-row and 512-row edges, decodes to 1,100 cells at llama_threads 2 and 3, and 64 greedy tokens
against llama-server; on SmolLM2 (head 64: K and V rotated by 64) and the small Qwen3 (head 128:
K by 128, V by 64). q8_0/q8_0, q4_0/q4_0 and q8_0 K with an f16 V, as the issue asks."""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml import oracle
from bankml.diff import diff
from bankml.testing import models
from test_logits import assert_rows_identical, greedy_identical

pytestmark = pytest.mark.oracle

CACHES = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")]
HEADS = {"smollm2-q8_0": 64, "qwen3-small-q1_0": 128}


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


_loaded: dict = {}



def load(name, backend, kt, vt, llama_threads=2, threads=2) -> bankml.Model:
    key = (name, backend, kt, vt, llama_threads, threads)
    if key not in _loaded:
        _loaded[key] = bankml.load(models.path(name), backend=backend, threads=threads, llama_threads=llama_threads,
                                   cache_type_k=kt, cache_type_v=vt)
    return _loaded[key]


def case(m, name, **what) -> dict:
    return dict(model=name, backend=m.backend, cache_type_k=m.cache_type_k, cache_type_v=m.cache_type_v,
                threads=m.threads, llama_threads=m.llama_threads, **what)


@pytest.mark.parametrize("backend", ["llvm", "reference"])
@pytest.mark.parametrize("kt,vt", CACHES)
@pytest.mark.parametrize("name", list(HEADS))
def test_named_tensors_identical(record, name, kt, vt, backend):
    """7 prompt tokens, then 2 decodes: every named tensor of every micro-batch, the rotations
    (ggml's node_<index> mul_mats) among them."""
    m = load(name, backend, kt, vt)
    r = diff(m, tokens(9, 3), decode_from=7)
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), **case(m, name, tokens=7, cells=9))
    assert r.first_difference is None, r.summary()
    assert not r.missing, r.missing
    n_layer = m.hparams.n_layer
    rotations = {c.name for c in r.compared if c.name.startswith("node_") and c.op == "hadamard"}
    assert len(rotations) == n_layer * (2 + 2 * (vt != "f16")), sorted(rotations)[:8]


@pytest.mark.parametrize("kt,vt", [("q4_0", "q8_0"), ("f16", "q4_0")])
def test_other_type_pairs_named_tensors_identical(record, kt, vt):
    """K and V of two quantized types, and an f16 K (no Q/K rotation) with a q4_0 V, on the GQA
    3:1 Llama: 27 prompt tokens and 3 decodes."""
    name = "llama-gqa-f16"
    m = load(name, "llvm", kt, vt)
    r = diff(m, tokens(30, 30), decode_from=27)
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), **case(m, name, tokens=27, cells=30))
    assert r.first_difference is None, r.summary()
    assert not r.missing, r.missing


@pytest.mark.parametrize("kt,vt", CACHES)
@pytest.mark.parametrize("name", list(HEADS))
def test_named_tensors_identical_through_a_64_row_micro_batch(record, name, kt, vt):
    """64 rows: where an f16 cache takes the tiled kernel, a quantized one still runs one_chunk."""
    m = load(name, "llvm", kt, vt)
    r = diff(m, tokens(64, 64))
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), **case(m, name, tokens=64))
    assert r.first_difference is None, r.summary()
    assert not r.missing, r.missing


@pytest.mark.parametrize("n,outputs", [(65, "last"), (600, "all")])
@pytest.mark.parametrize("kt,vt", CACHES)
@pytest.mark.parametrize("name", list(HEADS))
def test_llvm_prefill_rows_identical_across_the_edges(record, name, kt, vt, n, outputs):
    """65 rows (the last one's logits) past the tiled kernel's 64; 600 = 512 + 88 rows in two
    micro-batches. (7 rows and decodes: the named-tensor tests.)"""
    m = load(name, "llvm", kt, vt)
    ref = oracle.logits(m.path, tokens(n, n), threads=2, outputs=outputs, cache_type_k=kt, cache_type_v=vt)
    assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), ref,
                          **case(m, name, kind="prefill", tokens=n, outputs=outputs))


@pytest.mark.parametrize("kt,vt", [("q4_0", "q4_0"), ("q8_0", "f16")])
def test_reference_prefill_rows_identical(record, kt, vt):
    name = "qwen3-small-q1_0"
    m = load(name, "reference", kt, vt)
    ref = oracle.logits(m.path, tokens(65, 65), threads=2, cache_type_k=kt, cache_type_v=vt)
    assert_rows_identical(record, m.session().prefill(tokens(65, 65), outputs="all"), ref,
                          **case(m, name, kind="prefill", tokens=65, outputs="all"))


DECODES = [("smollm2-q8_0", "q8_0", "q8_0", 2), ("smollm2-q8_0", "q8_0", "q8_0", 3),
           ("qwen3-small-q1_0", "q4_0", "q4_0", 2), ("qwen3-small-q1_0", "q4_0", "q4_0", 3),
           ("qwen3-small-q1_0", "q8_0", "f16", 3)]


@pytest.mark.slow
@pytest.mark.parametrize("name,kt,vt,llama_threads", DECODES)
def test_llvm_greedy_decodes_to_1100_cells(record, name, kt, vt, llama_threads):
    """A 600-token prompt, then one llama_decode per token to 1,100 cells (n_kv 768 .. 1,280,
    where an f16 cache would split the keys by llama_threads)."""
    m = load(name, "llvm", kt, vt, llama_threads=llama_threads)
    greedy_identical(record, m, tokens(600, 11), 1100, cache_type_k=kt, cache_type_v=vt)


def test_reference_greedy_decodes(record):
    """The reference backend through decodes into 512 padded cells (where an f16 cache splits)."""
    m = load("qwen3-small-q1_0", "reference", "q8_0", "q8_0", llama_threads=3)
    greedy_identical(record, m, tokens(250, 5), 262, cache_type_k="q8_0", cache_type_v="q8_0")


CHAT = "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name,kt,vt,prompt", [("smollm2-q4_1", "q8_0", "q8_0", "Once upon a time"),
                                               ("qwen3-small-q1_0", "q4_0", "q4_0", CHAT)],
                         ids=["smollm2-q4_1-q8_0-q8_0", "qwen3-small-q1_0-q4_0-q4_0-chat"])
def test_greedy_64_tokens_equal_llama_server(record, name, kt, vt, prompt):
    """64 greedy tokens, token for token llama-server b11434 started with the same -ctk/-ctv."""
    from bankml.oracle.server import LlamaServer
    from bankml.runtime.generate import GREEDY, generate
    m = load(name, "llvm", kt, vt)
    ids = m.tokenize(prompt)
    with LlamaServer(m.path, threads=2, extra=("-ctk", kt, "-ctv", vt)) as srv:
        want = srv.completion(ids, 64, temperature=0.0, seed=0)
    got = list(generate(m, ids, 64, GREEDY, seed=0))
    record(kind="generate", compared=len(want), identical=sum(a == b for a, b in zip(got, want)),
           **case(m, name, tokens=len(ids)))
    assert len(want) == 64 and got == want


def test_rotation_off_with_llama_attn_rot_disable(record, monkeypatch):
    """LLAMA_ATTN_ROT_DISABLE=1 (read by bankml at load and by llama.cpp): no rotation, same bits."""
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    name = "qwen3-small-q1_0"
    m = bankml.load(models.path(name), threads=2, llama_threads=2, cache_type="q8_0")
    try:
        assert (m.kv.rot_k, m.kv.rot_v) == (0, 0)
        r = diff(m, tokens(9, 4), decode_from=7)
    finally:
        m.close()
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), model=name, backend="llvm", cache_type_k="q8_0", cache_type_v="q8_0",
           rotation="disabled")
    assert r.first_difference is None, r.summary()
    assert not r.missing and not any(c.name.startswith("node_") for c in r.compared)
