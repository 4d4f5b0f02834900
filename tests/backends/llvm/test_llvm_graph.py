"""The llvm backend runs whole micro-batch graphs with the reference backend's bits: every named
node and the logits, for several models, batch shapes and thread counts."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import bankml
from bankml.backends.llvm import compile as llvm_graph
from bankml.backends.llvm import jit
from bankml.backends.llvm import registry
from bankml.backends.llvm import LlvmBackend
from bankml.backends.llvm import run as llvm_run
from bankml.backends.reference.run import Env
from bankml.backends.reference.run import run as ref_run
from bankml.ir.graph import Graph
from bankml.ir.ops import Op
from bankml.testing import models

MODELS = ["qwen3-small-q1_0", "qwen3-small-f16", "llama-gqa-f16", "smollm2-q4_1"]
# (n_tokens, n_past, outputs): decode, a short prompt, one with every row, tiled attention
SHAPES = [(1, 5, 1), (7, 0, 1), (5, 3, 5), (64, 0, 2)]


@functools.cache
def _model(name: str):
    return bankml.load(models.path(name), threads=2)


def _env(m, n_tokens: int, n_past: int, n_outputs: int, seed: int):
    """Inputs and caches as runtime/session.py makes them, caches filled with random history."""
    hp = m.hparams
    rng = np.random.default_rng(seed)
    used = n_past + n_tokens
    n_kv = m.n_kv(used)
    pos = np.arange(n_past, used, dtype=np.int32)
    cells = np.arange(n_kv)
    mask = np.where((cells[None, :] <= pos[:, None]) & (cells[None, :] < used), np.float16(0), np.float16(-np.inf))
    caches = {(il, kind): np.zeros((m.kv_size, hp.n_head_kv, hp.head_dim), np.float16)
              for il in range(hp.n_layer) for kind in "kv"}
    for c in caches.values():
        c[:n_past] = rng.standard_normal((n_past, hp.n_head_kv, hp.head_dim)).astype(np.float16)
    out_ids = np.arange(n_tokens - n_outputs, n_tokens, dtype=np.int64)
    inputs = {"tokens": rng.integers(0, hp.n_vocab, n_tokens).astype(np.int64), "pos": pos,
              "kq_mask": mask.astype(np.float16), "out_ids": out_ids}
    return m.graph(n_tokens, n_kv, n_outputs), caches, inputs


def _ref(g, m, caches, inputs, trace=None):
    return ref_run(g, Env(m.weight, caches, inputs), trace)


def _llvm(g, m, caches, inputs, threads, trace=None):
    return llvm_run(g, m.weight, caches, inputs, threads, trace)


def _traced(run, g, caches, inputs, m, threads):
    caches = {k: v.copy() for k, v in caches.items()}
    seen: dict = {}
    trace = lambda n, v: seen.setdefault((n.id, n.name), np.array(v))        # noqa: E731
    out = _ref(g, m, caches, inputs, trace) if run == "reference" else _llvm(g, m, caches, inputs, threads, trace)
    return out, seen, caches


def _assert_same(a: np.ndarray, b: np.ndarray, what: str):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    bits = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    assert np.array_equal(a.view(bits), b.view(bits)), what


def _prefix_without(g: Graph, ops: set[Op]) -> Graph:
    """The nodes of g that do not depend on a node of `ops`, every named one an output."""
    bad: set[int] = set()
    for n in g:
        if n.op in ops or any(i in bad for i in n.inputs):
            bad.add(n.id)
    keep = {i: n for i, n in g.nodes.items() if i not in bad}
    outs = {f"{n.name}#{n.id}": n.id for n in keep.values() if n.name and n.op not in (Op.WEIGHT, Op.INPUT, Op.CACHE)}
    return Graph(keep, outs, dict(g.meta))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", MODELS)
def test_graph_before_attention_equals_reference(name, threads):
    """Everything up to the first attention (embeddings, norms, Q/K/V, RoPE, cache writes) with
    the kernels that exist: runner, buffer reuse, barriers and aliases, named node by node."""
    m = _model(name)
    g, caches, inputs = _env(m, 7, 3, 1, seed=1)
    sub = _prefix_without(g, {Op.FLASH_ATTN})
    caches_r = {k: v.copy() for k, v in caches.items()}
    caches_l = {k: v.copy() for k, v in caches.items()}
    ref, mine = _ref(sub, m, caches_r, inputs), _llvm(sub, m, caches_l, inputs, threads)
    assert ref.keys() == mine.keys() and len(ref) > 3
    for k in ref:
        _assert_same(mine[k], ref[k], k)
    for k in caches:
        _assert_same(caches_l[k], caches_r[k], f"cache {k}")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}-past{p}-out{o}" for t, p, o in SHAPES])
@pytest.mark.parametrize("name", MODELS)
def test_graph_named_nodes_and_logits_equal_reference(name, shape, threads):
    m = _model(name)
    g, caches, inputs = _env(m, *shape, seed=sum(shape))
    ref, ref_seen, ref_caches = _traced("reference", g, caches, inputs, m, threads)
    mine, seen, my_caches = _traced("llvm", g, caches, inputs, m, threads)
    assert seen.keys() == ref_seen.keys()
    for k in ref_seen:                                  # execution order: the first difference fails
        _assert_same(seen[k], ref_seen[k], f"node {k}")
    _assert_same(mine["logits"], ref["logits"], "logits")
    for k in caches:
        _assert_same(my_caches[k], ref_caches[k], f"cache {k}")
    untraced = _llvm(g, m, {k: v.copy() for k, v in caches.items()}, inputs, threads)     # buffer reuse
    _assert_same(untraced["logits"], ref["logits"], "logits without trace")


def test_layers_share_kernel_functions():
    m = _model("smollm2-q4_1")
    g = m.graph(1, 256, 1)
    _, modules, _, kernels, _, barriers = llvm_graph.emit(g)
    assert len(kernels) > 300 and len(modules) < 25
    assert 0 < sum(barriers) < len(kernels)


def test_variants_share_kernel_modules_in_the_disk_cache(tmp_path, monkeypatch):
    """A kernel module's IR text does not name its node, so the small-last graph finds the
    kernels it shares with small-all (all but the output rows') in the disk cache."""
    from bankml.backends.llvm import jit_cache
    monkeypatch.setattr(jit_cache, "jit_dir", lambda: tmp_path)
    monkeypatch.delenv("BANKML_JIT_CACHE", raising=False)
    m = _model("smollm2-q4_1")
    variant = {v.name: v for v in m.variants}
    all_rows, last_row = (m.generic_graph(variant[name]) for name in ("small-all", "small-last"))
    before = dict(jit_cache.counts)
    llvm_graph.compile_graph(all_rows)
    mid = dict(jit_cache.counts)
    llvm_graph.compile_graph(last_row)
    after = jit_cache.counts
    def texts(g):                                       # the glue and each distinct kernel text
        glue, kernels = llvm_graph.emit(g)[:2]
        return {jit.module_text(glue)} | {llvm_graph._kernel_text(k) for k in kernels}
    assert mid["miss"] - before["miss"] == len(texts(all_rows)) and mid["hit"] == before["hit"]
    assert after["hit"] - mid["hit"] > 0               # shared kernels: found by spec (or text)
    assert after["miss"] - mid["miss"] == len(texts(last_row) - texts(all_rows))


def test_decode_tiny_kernels_run_on_thread_0_between_fewer_barriers():
    m = _model("smollm2-q4_1")
    g = m.graph(1, 256, 1)
    kernels = [n for n in g if n.op not in registry.NO_KERNEL]
    serial = [llvm_graph.is_serial(g, n) for n in kernels]
    assert not any(s for n, s in zip(kernels, serial) if n.op in (Op.MUL_MAT, Op.FLASH_ATTN))
    assert sum(serial) > len(kernels) // 2
    planned = llvm_graph.plan_barriers(g, kernels, serial)
    assert sum(planned) < sum(llvm_graph.plan_barriers(g, kernels))
    since: list[bool] = []                   # serial flags of the kernels since the last barrier
    for need, ser in zip(planned, serial):
        if need:
            assert not (ser and all(since)), "a barrier between two runs of thread-0-only kernels"
            since = []
        since.append(ser)
    g64 = m.graph(64, 256, 1)
    assert not any(llvm_graph.is_serial(g64, n) for n in g64 if n.op is Op.ADD and n.shape[0] == 64)


@pytest.mark.parametrize("threads", [1, 2])
def test_micro_batch_without_outputs_only_writes_the_caches(threads):
    m = _model("qwen3-small-q1_0")
    g, caches, inputs = _env(m, 5, 2, 0, seed=9)
    caches_r = {k: v.copy() for k, v in caches.items()}
    caches_l = {k: v.copy() for k, v in caches.items()}
    assert _ref(g, m, caches_r, inputs) == {} and _llvm(g, m, caches_l, inputs, threads) == {}
    for k in caches:
        _assert_same(caches_l[k], caches_r[k], f"cache {k}")
        assert not np.array_equal(caches_l[k], caches[k])


def test_a_backend_compiles_a_graph_once():
    m = _model("smollm2-q4_1")
    g = m.graph(2, 256, 1)
    be = LlvmBackend(m.weight, threads=2)
    try:
        assert be.prepare(g) > 0 and be.prepare(g) == 0.0
    finally:
        be.close()
    assert be.compiled == {} and be.pool is None


def test_mul_mats_that_differ_only_in_weight_rows_are_one_kernel_text():
    """A mul_mat takes its weight's row count at run time (registry.kernel_arg, set per call by
    the glue): SmolLM2's Q and O (576 rows), K/V (192) and gate/up (1536) projections, all of
    K = 576 and one weight type, are one IR text, compiled once."""
    m = _model("smollm2-q4_1")
    g = m.generic_graph({v.name: v for v in m.variants}["small-all"])
    _, reps, *_ = llvm_graph.plan(g)
    texts, rows = {}, {}
    for n in (n for n in reps if n.op is Op.MUL_MAT):
        w = g[n.inputs[0]]
        key = (w.shape[1], w.params["ggml_type"])
        texts.setdefault(key, set()).add(llvm_graph._kernel_text(llvm_graph.kernel_module(g, n)))
        rows.setdefault(key, set()).add(w.shape[0])
    key = next(k for k in rows if k[0] == 576 and len(rows[k]) > 1)
    assert rows[key] == {192, 576, 1536} and len(texts[key]) == 1
