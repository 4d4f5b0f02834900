"""Run a compiled graph: buffers planned once per compiled graph, a persistent thread pool.

    run(g, env, trace=None) -> {"logits": ...}     # the reference backend's meaning

env is backends.reference.run.Env (weights(name), caches[(layer, kind)], inputs); the thread
count is getattr(env, "threads", 1). Every pool thread calls the native graph function
through ctypes (which releases the GIL), so Python is not on the per-op path; the calling
thread is thread 0. Threads never change the bits: every kernel's result is independent of nth.

With trace, the graph runs one kernel at a time (graph_part) on the same buffers, and
trace(node, value) sees every named node right after the kernel that made it, before any
buffer is reused, in execution order (a SET_ROWS node's value is the first n_kv cells of
its cache, as the reference gives it).
"""
from __future__ import annotations

import ctypes
import queue
import threading
from typing import Callable

import numpy as np

from bankml.backends.llvm.graph import ALIGN, CompiledGraph, compile_graph, plan_arena, root
from bankml.backends.llvm.registry import NO_KERNEL
from bankml.errors import BankmlError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.order import Q1_0_DOT
from bankml.ir.ops import Op

_NP = {"f32": np.float32, "F32": np.float32, "f16": np.float16, "i32": np.int32}


class _Pool:
    """nth - 1 daemon threads that each run one job per call; the caller is thread 0."""

    def __init__(self, nth: int):
        self.nth = nth
        self.lock = threading.Lock()
        self.barrier = np.zeros(2 * ALIGN, np.uint8)       # counter at 0, generation at 64
        self.jobs = [queue.SimpleQueue() for _ in range(nth - 1)]
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        for k in range(1, nth):
            threading.Thread(target=self._work, args=(k,), daemon=True, name=f"bankml-llvm-{k}").start()

    def _work(self, ith: int) -> None:
        q = self.jobs[ith - 1]
        bar = self.barrier.ctypes.data
        while True:
            fn, bufs, rng = q.get()
            try:
                fn(bufs, ith, self.nth, bar, *rng)
            finally:
                self.done.put(ith)

    def run(self, fn, bufs, *rng) -> None:
        with self.lock:
            for q in self.jobs:
                q.put((fn, bufs, rng))
            fn(bufs, 0, self.nth, self.barrier.ctypes.data, *rng)
            for _ in self.jobs:
                self.done.get()


_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def pool(nth: int) -> _Pool:
    with _POOLS_LOCK:
        if nth not in _POOLS:
            _POOLS[nth] = _Pool(nth)
        return _POOLS[nth]


class _Buffers:
    """The bufs table of one compiled graph on one arena plan, and the arrays behind it."""

    def __init__(self, g: Graph, cg: CompiledGraph):
        offsets, size = plan_arena(g, cg)
        self.arena = np.zeros(size + ALIGN, np.uint8)
        base = self.arena.ctypes.data
        base += (-base) % ALIGN
        self.base_off = base - self.arena.ctypes.data
        self.offsets = offsets
        self.table = (ctypes.c_void_p * len(cg.order))()
        self.inputs: dict[int, tuple[str, np.ndarray]] = {}
        self.leaves: dict[int, object] = {}            # node id -> the array last bound (weights, caches)
        self.aliases: list[tuple[int, int]] = []
        self.bound = [n for n in cg.order if n.op in (Op.WEIGHT, Op.CACHE)]
        for n in cg.order:
            s = cg.slot[n.id]
            if n.op is Op.INPUT:
                buf = np.zeros(n.shape, _NP[n.dtype])
                self.inputs[n.id] = (n.params["input"], buf)
                self.table[s] = buf.ctypes.data if buf.size else None
            elif n.id in offsets:
                self.table[s] = base + offsets[n.id]
            elif n.op in (Op.RESHAPE, Op.SET_ROWS):
                self.aliases.append((s, cg.slot[root(g, n.id)]))

    def view(self, n: Node) -> np.ndarray:
        off = self.base_off + self.offsets[n.id]
        count = int(np.prod(n.shape))
        return self.arena[off:off + count * np.dtype(_NP[n.dtype]).itemsize].view(_NP[n.dtype]).reshape(n.shape)

    def bind(self, g: Graph, cg: CompiledGraph, env) -> None:
        """Point the table at this call's weights, caches and inputs."""
        for n in self.bound:
            if n.op is Op.WEIGHT:
                a = env.weights(n.params["tensor"])
            else:
                a = env.caches[(n.params["layer"], n.params["kind"])]
            if self.leaves.get(n.id) is not a:
                self.leaves[n.id] = a
                self.table[cg.slot[n.id]] = _checked(n, a).ctypes.data
        for i, (name, buf) in self.inputs.items():
            src = np.asarray(env.inputs[name])
            if src.shape != buf.shape:
                raise BankmlError(f"input {name}: shape {src.shape}, the graph wants {buf.shape}")
            np.copyto(buf, src, casting="unsafe")
        for s, r in self.aliases:
            self.table[s] = self.table[r]


def _checked(n: Node, a: np.ndarray) -> np.ndarray:
    if not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
        raise BankmlError(f"{n.params.get('tensor') or n.op.value}: the llvm backend needs a C-contiguous array")
    if n.op is Op.CACHE and (a.dtype != np.float16 or a.shape[1:] != n.shape[1:] or a.shape[0] < n.shape[0]):
        raise BankmlError(f"cache {n.params}: {a.dtype}{list(a.shape)} does not fit {list(n.shape)} f16")
    return a


def run(g: Graph, env, trace: Callable[[Node, np.ndarray], None] | None = None,
        threads: int | None = None) -> dict[str, np.ndarray]:
    """Execute g natively; returns its outputs by key (fresh arrays)."""
    cg = compile_graph(g)
    with _RUN_LOCK:                 # one run at a time: a compiled graph has one set of buffers
        return _run(g, cg, env, trace, max(1, int(threads or getattr(env, "threads", 1) or 1)))


_RUN_LOCK = threading.RLock()


def _run(g: Graph, cg: CompiledGraph, env, trace, nth: int) -> dict[str, np.ndarray]:
    if cg.buffers is None:
        cg.buffers = _Buffers(g, cg)
    bufs = cg.buffers
    bufs.bind(g, cg, env)
    gpu = getattr(env, "gpu", None)
    if trace is None and gpu is not None:
        _run_with_gpu(g, cg, bufs, env, gpu, nth)
    elif trace is None:
        if cg.kernels:
            _call(nth, cg.fn, bufs.table)
    else:
        k = -1
        for n in cg.order:
            if n.op not in NO_KERNEL:
                k += 1
                _call(nth, cg.part, bufs.table, k, k + 1)
            if n.name and n.op not in (Op.WEIGHT, Op.CACHE, Op.INPUT):
                trace(n, value(g, bufs, n, env).copy())
    return {k: value(g, bufs, g[i], env).copy() for k, i in g.outputs.items()}


def _run_with_gpu(g: Graph, cg: CompiledGraph, bufs: _Buffers, env, gpu, nth: int) -> None:
    """Decode's Q1_0 matvecs on the Vulkan device (bankml.runtime.gpu), the kernels between
    them natively in ranges: graph_part(lo, hi) runs kernels [lo, hi) with their barriers."""
    lo = 0
    for k, n in enumerate(cg.kernels):
        w = g[n.inputs[0]]
        if not (n.op is Op.MUL_MAT and n.order is Q1_0_DOT and int(np.prod(n.shape[:-1])) == 1):
            continue
        q = g[n.inputs[1]]
        K = q.shape[-1]
        if lo < k:
            _call(nth, cg.part, bufs.table, lo, k)
        off = bufs.base_off + bufs.offsets[q.id]
        act = bufs.arena[off:off + K // 32 * 34].tobytes()
        y = gpu.matvec_bytes(w.params["tensor"], env.weights(w.params["tensor"]), act, K)
        if y is None:                                   # shapes the device kernel does not take
            _call(nth, cg.part, bufs.table, k, k + 1)
        else:
            bufs.view(n)[...] = y.reshape(n.shape)
        lo = k + 1
    if lo < len(cg.kernels):
        _call(nth, cg.part, bufs.table, lo, len(cg.kernels))


def _call(nth: int, fn, table, *rng) -> None:
    if nth == 1:
        fn(table, 0, 1, None, *rng)
    else:
        pool(nth).run(fn, table, *rng)


def value(g: Graph, bufs: _Buffers, n: Node, env) -> np.ndarray:
    """The current contents of node n's buffer, shaped as the node."""
    if n.op is Op.RESHAPE:
        return value(g, bufs, g[n.inputs[0]], env).reshape(n.shape)
    if n.op is Op.SET_ROWS:
        return value(g, bufs, g[n.inputs[0]], env)[: n.shape[0]]
    if n.op is Op.CACHE:
        return bufs.leaves[n.id]
    if n.op is Op.INPUT:
        return bufs.inputs[n.id][1]
    return bufs.view(n)
