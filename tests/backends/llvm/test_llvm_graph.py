"""The llvm backend runs whole micro-batch graphs with the reference backend's bits: every named
node and the logits, for several models, batch shapes and thread counts."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import bankml
from bankml.backends.llvm import graph as llvm_graph
from bankml.backends.llvm import registry
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
    n_kv = min(m.kv_size, max(256, -(-used // 256) * 256))
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


def _traced(run, g, caches, inputs, m, threads):
    env = Env(m.weight, {k: v.copy() for k, v in caches.items()}, inputs)
    env.threads = threads
    seen: dict = {}
    out = run(g, env, lambda n, v: seen.setdefault((n.id, n.name), np.array(v)))
    return out, seen, env.caches


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


def _missing_kernels(g: Graph) -> set[str]:
    return {n.op.value for n in g.nodes.values() if n.op not in registry.NO_KERNEL and n.op not in registry.KERNELS}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", MODELS)
def test_graph_before_attention_equals_reference(name, threads):
    """Everything up to the first attention (embeddings, norms, Q/K/V, RoPE, cache writes) with
    the kernels that exist: runner, buffer reuse, barriers and aliases, named node by node."""
    m = _model(name)
    g, caches, inputs = _env(m, 7, 3, 1, seed=1)
    sub = _prefix_without(g, {Op.FLASH_ATTN} | {op for op in Op if op not in registry.KERNELS
                                                 and op not in registry.NO_KERNEL})
    env_r = Env(m.weight, {k: v.copy() for k, v in caches.items()}, inputs)
    env_l = Env(m.weight, {k: v.copy() for k, v in caches.items()}, inputs)
    env_l.threads = threads
    ref, mine = ref_run(sub, env_r), llvm_run(sub, env_l)
    assert ref.keys() == mine.keys() and len(ref) > 3
    for k in ref:
        _assert_same(mine[k], ref[k], k)
    for k in caches:
        _assert_same(env_l.caches[k], env_r.caches[k], f"cache {k}")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}-past{p}-out{o}" for t, p, o in SHAPES])
@pytest.mark.parametrize("name", MODELS)
def test_graph_named_nodes_and_logits_equal_reference(name, shape, threads):
    m = _model(name)
    g, caches, inputs = _env(m, *shape, seed=sum(shape))
    missing = _missing_kernels(g)
    if missing:
        pytest.skip(f"llvm kernels not written yet: {', '.join(sorted(missing))}")
    ref, ref_seen, ref_caches = _traced(ref_run, g, caches, inputs, m, threads)
    mine, seen, my_caches = _traced(llvm_run, g, caches, inputs, m, threads)
    assert seen.keys() == ref_seen.keys()
    for k in ref_seen:                                  # execution order: the first difference fails
        _assert_same(seen[k], ref_seen[k], f"node {k}")
    _assert_same(mine["logits"], ref["logits"], "logits")
    for k in caches:
        _assert_same(my_caches[k], ref_caches[k], f"cache {k}")
    env = Env(m.weight, {k: v.copy() for k, v in caches.items()}, inputs)   # the untraced (buffer reuse) run
    env.threads = threads
    _assert_same(llvm_run(g, env)["logits"], ref["logits"], "logits without trace")


def test_layers_share_kernel_functions():
    m = _model("smollm2-q4_1")
    g = m.graph(1, 256, 1)
    _, _, kernels, _, barriers, n_fns = llvm_graph.emit(g)
    assert len(kernels) > 300 and n_fns < 25
    assert 0 < sum(barriers) < len(kernels)


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
    if _missing_kernels(g):
        pytest.skip("llvm kernels not written yet")
    env_r = Env(m.weight, {k: v.copy() for k, v in caches.items()}, inputs)
    env_l = Env(m.weight, {k: v.copy() for k, v in caches.items()}, inputs)
    env_l.threads = threads
    assert ref_run(g, env_r) == {} and llvm_run(g, env_l) == {}
    for k in caches:
        _assert_same(env_l.caches[k], env_r.caches[k], f"cache {k}")
        assert not np.array_equal(env_l.caches[k], caches[k])


def test_compiled_graphs_are_cached_by_structure():
    m = _model("smollm2-q4_1")
    g = m.graph(2, 256, 1)
    copy = Graph(dict(g.nodes), dict(g.outputs), dict(g.meta))      # another object, the same structure
    assert llvm_graph.compile_graph(g) is llvm_graph.compile_graph(copy)
