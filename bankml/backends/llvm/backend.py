"""The llvm backend of one model: its compiled graphs, their buffers and a thread pool.

    be = LlvmBackend(weights, threads=2, gpu=None)
    be.prepare(g)                                   # compile g (a generic graph) now; seconds spent
    out = be.run(g, {"T": 7, "KV": 256, "O": 1}, inputs, caches, trace=None)   # {"logits": ...}
    be.close()                                      # engines, buffers and threads released

The calling thread is thread 0; the pool's workers wait for jobs in native code (pool.py), so
Python is on neither the per-op path nor the hand-off to the workers. Threads never change the
bits: every kernel's result is independent of nth. Buffers are planned once per compiled
graph, for the largest value of each size, in one arena that every compiled graph of the
backend shares (runs take turns; outputs are copied out); `values` gives this call's sizes (the dims vector
every kernel reads), inputs are copied into the first rows of their buffers.

With trace, the graph runs one kernel at a time (graph_part) on the same buffers, and
trace(node, value) sees every named node right after the kernel that made it, before any
buffer is reused, in execution order (a SET_ROWS node's value is the first n_kv cells of
its cache, as the reference gives it).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import threading
from typing import Callable

import numpy as np

from bankml.backends.llvm.pool import Pool
from bankml.backends.llvm.compile import ALIGN, CompiledGraph, compile_graph, plan_arena, root
from bankml.backends.llvm.registry import NO_KERNEL
from bankml.errors import BankmlError
from bankml.ir.dims import DIM_SLOTS, Bindings, concrete, upper
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.quants.kv_cache import cache_array

_NP = {"f32": np.float32, "F32": np.float32, "f16": np.float16, "i32": np.int32}


class _Buffers:
    """The bufs table of one compiled graph on one arena plan, and the arrays behind it. The
    arena itself is the backend's, shared by its compiled graphs (one runs at a time): `place`
    points the table at it."""

    def __init__(self, g: Graph, cg: CompiledGraph):
        offsets, self.size = plan_arena(g, cg)
        self.offsets = offsets
        self.arena, self.base_off = None, 0
        self.table = (ctypes.c_void_p * len(cg.order))()
        self.inputs: dict[int, tuple[str, np.ndarray]] = {}
        self.leaves: dict[int, object] = {}            # node id -> the array last bound (weights, caches)
        self.aliases: list[tuple[int, int]] = []
        self.weight_nodes = [n for n in cg.order if n.op is Op.WEIGHT]
        self.cache_nodes = [(n, (n.params["layer"], n.params["kind"])) for n in cg.order if n.op is Op.CACHE]
        self.cache_keys = [key for _, key in self.cache_nodes]
        self.weights_bound = False
        self.stale = True                               # the aliases' entries need copying from their roots
        self.dims = np.zeros(len(DIM_SLOTS), np.int64)
        self.dims_ptr = self.dims.ctypes.data           # the kernels' sizes vector, as graph_part takes it
        self.values: Bindings = {}                      # the last call's sizes
        self.shaped_for: Bindings | None = None         # the sizes `shaped` and `outputs` are for
        self.cache_ids: tuple[int, ...] = ()           # id() of each cache array last bound (held in leaves)
        self.row_tables: dict[int, np.ndarray] = {}     # a batch of sequences' CACHE node -> its rows' cache addresses
        self.shaped: list[tuple[str, np.ndarray, tuple[int, ...]]] = []   # (input, buffer, shape) at these values
        self.outputs: list[tuple[str, np.ndarray]] = []  # (key, view of its buffer) at these values, once placed
        self.in_arena: list[tuple[int, int]] = []       # (table slot, arena offset)
        for n in cg.order:
            s = cg.slot[n.id]
            if n.op is Op.INPUT:
                buf = np.zeros(int(np.prod(upper(n.shape))), _NP[n.dtype])
                self.inputs[n.id] = (n.params["input"], buf)
                self.table[s] = buf.ctypes.data if buf.size else None
            elif n.id in offsets:
                self.in_arena.append((s, offsets[n.id]))
            elif n.op in (Op.RESHAPE, Op.SET_ROWS):
                self.aliases.append((s, cg.slot[root(g, n.id)]))

    def place(self, arena: np.ndarray) -> None:
        """Put this graph's buffers in arena (at least size + ALIGN bytes)."""
        base = arena.ctypes.data
        base += (-base) % ALIGN
        self.arena, self.base_off = arena, base - arena.ctypes.data
        for s, off in self.in_arena:
            self.table[s] = base + off
        self.stale = True
        self.shaped_for = None                          # the output views point at the old arena

    def view(self, n: Node) -> np.ndarray:
        """Node n's buffer at this call's sizes."""
        shape = concrete(n.shape, self.values)
        off = self.base_off + self.offsets[n.id]
        count = math.prod(shape)
        return self.arena[off:off + count * np.dtype(_NP[n.dtype]).itemsize].view(_NP[n.dtype]).reshape(shape)

    def bind(self, g: Graph, cg: CompiledGraph, weights, caches, inputs, values: Bindings) -> None:
        """Point the table at the weights (on the first call: a backend's weights never change),
        this call's caches and inputs; set the sizes. A decode step runs this for every token, so
        it touches only what can change: the cache arrays (another session's), the inputs, and
        the sizes when they differ from the last call's (every 256 cells of a decode)."""
        if values != self.shaped_for:
            self.values = dict(values)
            self.dims[:] = [values.get(k, 0) for k in DIM_SLOTS[:-1]] + [int(g.meta.get("llama_threads", 1))]
            self.shaped = [(name, buf, concrete(g[i].shape, values)) for i, (name, buf) in self.inputs.items()]
            self.outputs = [(k, self.view(g[i]) if i in self.offsets else None) for k, i in g.outputs.items()]
            self.shaped_for = self.values
        if not self.weights_bound:
            for n in self.weight_nodes:
                a = self.leaves[n.id] = _checked(n, weights(n.params["tensor"]))
                self.table[cg.slot[n.id]] = a.ctypes.data
            self.weights_bound = self.stale = True
        arrays = list(map(caches.__getitem__, self.cache_keys))
        ids = tuple(map(id, arrays))        # the arrays last bound are held in leaves: no id is reused
        if ids != self.cache_ids:
            for (n, _), a in zip(self.cache_nodes, arrays):
                if self.leaves.get(n.id) is not a:
                    if n.params.get("seqs"):        # a list of the rows' caches: a table of their addresses
                        rows = self.row_tables[n.id] = np.array([_checked(n, c).ctypes.data for c in a], np.int64)
                        self.table[cg.slot[n.id]] = rows.ctypes.data
                    else:
                        self.table[cg.slot[n.id]] = _checked(n, a).ctypes.data
                    self.leaves[n.id] = a
                    self.stale = True
            self.cache_ids = ids
        for name, buf, want in self.shaped:
            src = np.asarray(inputs[name])
            if src.shape != want:
                raise BankmlError(f"input {name}: shape {src.shape}, the graph wants {want}")
            np.copyto(buf[:src.size], src.reshape(-1), casting="unsafe")
        if self.stale:
            for s, r in self.aliases:
                self.table[s] = self.table[r]
            self.stale = False


def _release_freed_heap() -> None:
    """Give the heap that emitting a graph used (its llvmlite IR objects, tens of MB for a large
    model) back to the system: collected now, and glibc's free pages returned (malloc_trim)."""
    gc.collect()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _checked(n: Node, a: np.ndarray) -> np.ndarray:
    if not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
        raise BankmlError(f"{n.params.get('tensor') or n.op.value}: the llvm backend needs a C-contiguous array")
    if n.op is Op.CACHE:        # the session's whole cache (kv_cache.cache_array), at least the cells read
        shape, dtype = cache_array(n.dtype, upper(n.shape))
        if a.dtype != dtype or a.shape[1:] != shape[1:] or a.shape[0] < shape[0]:
            raise BankmlError(f"cache {n.params}: {a.dtype}{list(a.shape)} does not fit {n.dtype} "
                              f"{dtype}{list(shape)}")
    return a


class LlvmBackend:
    """Compiled graphs of one model (by graph object), their buffers, one thread pool."""

    def __init__(self, weights: Callable[[str], np.ndarray], threads: int = 1, gpu=None):
        self.weights, self.threads, self.gpu = weights, max(1, int(threads)), gpu
        self.compiled: dict[int, tuple[Graph, CompiledGraph, _Buffers]] = {}
        self.arena = np.zeros(0, np.uint8)     # every compiled graph's buffers (one run at a time)
        self.pool = Pool(self.threads) if self.threads > 1 else None
        self.lock = threading.RLock()          # one run at a time: a compiled graph has one set of buffers

    def prepare(self, g: Graph) -> float:
        """Compile g unless it was; the seconds it took (0 when it was compiled already)."""
        with self.lock:
            if id(g) in self.compiled:
                return 0.0
            cg = compile_graph(g)
            if cg.emitted:                      # loaded from the cache, it left little to free
                _release_freed_heap()
            bufs = _Buffers(g, cg)
            self.compiled[id(g)] = (g, cg, bufs)
            if bufs.size + ALIGN > self.arena.nbytes:        # a larger arena for every graph
                self.arena = np.zeros(bufs.size + ALIGN, np.uint8)
                for _, _, b in self.compiled.values():
                    b.place(self.arena)
            else:
                bufs.place(self.arena)
            return cg.compile_s["emit"] + cg.compile_s["jit"]

    def run(self, g: Graph, values: Bindings, inputs: dict, caches: dict,
            trace: Callable[[Node, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
        """One micro-batch of g at these sizes; its outputs by key (fresh arrays)."""
        with self.lock:
            self.prepare(g)
            _, cg, bufs = self.compiled[id(g)]
            bufs.bind(g, cg, self.weights, caches, inputs, values)
            if trace is None and self.gpu is not None:
                self._run_with_gpu(g, cg, bufs)
            elif trace is None:
                if cg.kernels:
                    self.call(cg, bufs, 0, len(cg.kernels))
            else:
                k = -1
                for n in cg.order:
                    if n.op not in NO_KERNEL:
                        k += 1
                        self.call(cg, bufs, k, k + 1)
                    if n.name and n.op not in (Op.WEIGHT, Op.CACHE, Op.INPUT):
                        trace(n, value(g, bufs, n).copy())
            return {k: (v if v is not None else value(g, bufs, g[g.outputs[k]])).copy() for k, v in bufs.outputs}

    def close(self) -> None:
        """Release the compiled code, the buffers and the pool threads."""
        self.compiled.clear()
        self.arena = np.zeros(0, np.uint8)
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def call(self, cg: CompiledGraph, bufs: _Buffers, lo: int, hi: int) -> None:
        """Kernels [lo, hi) of cg (graph_part) on every thread, with the sizes bound in bufs."""
        dims = bufs.dims_ptr
        if self.pool is None:
            cg.part(bufs.table, 0, 1, None, dims, lo, hi)
        else:
            self.pool.run(cg.part, bufs.table, dims, lo, hi)

    def _run_with_gpu(self, g: Graph, cg: CompiledGraph, bufs: _Buffers) -> None:
        """The matvecs placed on the device (passes/place_on_device.py: decode's Q1_0) on the
        Vulkan device, the kernels between them natively in ranges: graph_part(lo, hi) runs
        kernels [lo, hi)."""
        lo = 0
        for k, n in enumerate(cg.kernels):
            if "device" not in n.params:
                continue
            w, q = g[n.inputs[0]], g[n.inputs[1]]
            K = q.shape[-1]
            if lo < k:
                self.call(cg, bufs, lo, k)
            off = bufs.base_off + bufs.offsets[q.id]
            act = bufs.arena[off:off + K // 32 * 34].tobytes()
            y = self.gpu.matvec_bytes(w.params["tensor"], self.weights(w.params["tensor"]), act, K)
            if y is None:                                   # shapes the device kernel does not take
                self.call(cg, bufs, k, k + 1)
            else:
                bufs.view(n)[...] = y.reshape(bufs.view(n).shape)
            lo = k + 1
        if lo < len(cg.kernels):
            self.call(cg, bufs, lo, len(cg.kernels))


def value(g: Graph, bufs: _Buffers, n: Node) -> np.ndarray:
    """The current contents of node n's buffer, shaped as the node at this call's sizes."""
    if n.op is Op.RESHAPE:
        return value(g, bufs, g[n.inputs[0]]).reshape(concrete(n.shape, bufs.values))
    if n.op is Op.SET_ROWS:
        return value(g, bufs, g[n.inputs[0]])[: concrete(n.shape, bufs.values)[0]]
    if n.op is Op.CACHE:
        return bufs.leaves[n.id]
    if n.op is Op.INPUT:
        return bufs.inputs[n.id][1][:math.prod(concrete(n.shape, bufs.values))].reshape(
            concrete(n.shape, bufs.values))
    return bufs.view(n)


def run(g: Graph, weights, caches: dict, inputs: dict, threads: int = 1, trace=None) -> dict[str, np.ndarray]:
    """Compile and run one concrete graph once (tests, tools); a model keeps an LlvmBackend."""
    be = LlvmBackend(weights, threads)
    try:
        return be.run(g, {}, inputs, caches, trace)
    finally:
        be.close()
