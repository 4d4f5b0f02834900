"""Compile a whole micro-batch Graph into LLVM modules with one entry point:

    void graph_part(i8** bufs, i64 ith, i64 nth, i8* barrier, i64* dims, i64 lo, i64 hi)

It calls kernels [lo, hi) in execution order (`for n in g`), with a spin barrier between
kernels where the next one reads what a kernel since the last barrier wrote (read after
write, on buffers after aliasing: RESHAPE is its input, SET_ROWS is its cache). Kernels are
deduplicated: nodes with the same op, shapes, dtypes, float order and parameters (tensor
and layer names aside) share one function, so 30 layers are one copy of each kernel. Each
distinct kernel is a module of its own, its function named `kernel`: the same kernel in
another variant of the model is the same IR text, one disk cache entry (emit, compile_graph).
A kernel compiled before is loaded by its spec without emitting its IR (kernel_spec, jit.py).

bufs[slot[node id]] is the node's buffer; the backend fills the table (backend.py). Buffer
reuse must respect the barriers: a buffer whose last reader runs before barrier b may be
written only by kernels after b (plan_arena does this).

A generic graph (bankml.ir.dims: sizes T, KV, O) compiles once for every value of its sizes:
dims holds this call's values, every kernel reads them, and buffers are sized for the largest.
The backend keeps one CompiledGraph per variant of a model (backend.py: LlvmBackend).
"""
from __future__ import annotations

import ctypes
import dataclasses
import enum
import math
import os
import sys
import time
from dataclasses import dataclass, field

from llvmlite import ir

from bankml.backends.llvm import ggml, jit, portable, registry  # noqa: F401  (ggml, portable: every kernel registers)
from bankml.backends.llvm.portable import matmul as portable_matmul
from bankml.backends.llvm.emit.core import KERNEL_ARG, for_range, i8, i8p, i64, intrinsic, new_function, void
from bankml.ir.dims import Dim, upper
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.quants import ACT_TYPES
from bankml.quants.kv_cache import cache_array

KERNEL_TABLE = "kernel_table"          # the glue's [n x i8*] of kernel addresses
KERNEL_FN = "kernel"                   # the function of a kernel module
# no kernel reads these: n_threads (llama_threads comes in dims[4]); a cache's cells (a kernel reads
# the cells of its node's shape); device (a node the device takes runs this kernel when it cannot)
_IGNORED_PARAMS = ("tensor", "layer", "n_threads", "cells", "device")
ALIGN = 64


def _log(msg: str) -> None:
    if os.environ.get("BANKML_DEBUG", "0") not in ("", "0"):
        print(msg, file=sys.stderr)


def _frozen(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items() if k not in _IGNORED_PARAMS))


def kernel_key(g: Graph, n: Node) -> tuple:
    """Nodes with equal keys compile to the same kernel function."""
    srcs = tuple((s.op, s.shape, s.dtype, s.order, _frozen(s.params)) for s in (g[i] for i in n.inputs))
    return n.op, n.shape, n.dtype, n.order, _frozen(n.params), srcs


def kernel_spec(g: Graph, n: Node) -> str | None:
    """What n's kernel IR depends on besides bankml's code, written out in full: the graph's
    profile and kernel_key's fields (a Dim with its range, an order with every field, each
    parameter's exact value). None when a value has no exact text (the kernel is then emitted
    every time). bankml's code is keyed by its files (jit.source_digest): code that changes a
    kernel's IR at run time (a test patching a module constant) must compile it with
    jit.compile_module, never through compile_graph, or its object is saved under the spec."""
    def text(x) -> str:
        if isinstance(x, Dim):
            return f"Dim({x.name},{x.lo},{x.hi})"
        if isinstance(x, enum.Enum):
            return f"{type(x).__name__}.{x.name}"
        if isinstance(x, (tuple, list)):
            return "(" + ",".join(map(text, x)) + ")"
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return type(x).__name__ + text([getattr(x, f.name) for f in dataclasses.fields(x)])
        if x is None or isinstance(x, (str, int, float, bool)):
            return repr(x)
        raise TypeError(type(x).__name__)
    def node(x: Node) -> tuple:
        params = sorted((k, v) for k, v in x.params.items() if k not in _IGNORED_PARAMS)
        return x.op, x.shape, x.dtype, x.order, params
    try:
        return text((g.meta.get("profile", "ggml"), node(n), [node(g[i]) for i in n.inputs]))
    except TypeError:
        return None


def root(g: Graph, i: int) -> int:
    """The node whose buffer node i uses: views and cache writes alias their first input."""
    while g[i].op in (Op.RESHAPE, Op.SET_ROWS):
        i = g[i].inputs[0]
    return i


def nbytes(n: Node) -> int:
    """Bytes of a node's buffer (registry.py's layouts)."""
    if n.op is Op.QUANTIZE and n.params["type"] == po.ACT_TYPE:      # pq8: backends/llvm/portable/matmul.py
        return math.prod(upper(n.shape[:-1])) * portable_matmul.pq8_bytes(n.shape[-1], n.params.get("block", 32))
    if n.op is Op.QUANTIZE:                  # rows of the activation type (bankml/quants ACT_TYPES)
        act = ACT_TYPES.get(int(n.params["type"]))
        if act is None:
            raise ValueError(f"node {n.name or n.id}: no buffer size for activation type {n.params['type']}")
        return math.prod(upper(n.shape[:-1])) * act.row_bytes(n.shape[-1])
    if n.dtype == po.CACHE_TYPE:             # portable K/V rows: an f16 scale, head_dim int8 codes
        shape, dtype = cache_array(n.dtype, upper(n.shape))
        return math.prod(shape) * dtype.itemsize
    size = {"f32": 4, "f16": 2, "i32": 4, "F32": 4}.get(n.dtype)
    if size is None:
        raise ValueError(f"node {n.name or n.id}: no buffer size for dtype {n.dtype}")
    return math.prod(upper(n.shape)) * size


@dataclass
class CompiledGraph:
    order: list[Node]                  # execution order
    slot: dict[int, int]               # node id -> index in bufs
    kernels: list[Node]                # nodes with a kernel, in order
    barrier_before: list[bool]         # per kernel node
    engine: list                       # the glue's MCJIT engine, then each kernel module's
    part: object                       # ctypes function (bufs, ith, nth, barrier, dims, lo, hi): kernels [lo, hi)
    n_functions: int
    compile_s: dict = field(default_factory=dict)
    emitted: int = 0                   # kernel modules whose IR was emitted (not loaded from the cache)


SERIAL_ELEMS = 8192        # kernels touching at most this many f32 values run on thread 0 alone


def is_serial(g: Graph, n: Node) -> bool:
    """Tiny kernels (a decode step's norms, quantizes, ropes, adds) run on thread 0 with nth = 1:
    a chain of them needs no barrier inside, only where it meets split kernels. Every kernel's
    bits are independent of nth, so this changes no result."""
    if n.op in (Op.MUL_MAT, Op.FLASH_ATTN):
        return False
    views = [i for i in n.inputs if g[i].op not in (Op.WEIGHT, Op.CACHE, Op.SET_ROWS)]
    sizes = [math.prod(upper(g[i].shape)) for i in views] + ([] if n.op is Op.SET_ROWS else [math.prod(upper(n.shape))])
    return max(sizes, default=0) <= SERIAL_ELEMS


def plan_barriers(g: Graph, kernels: list[Node], serial: list[bool] | None = None) -> list[bool]:
    """A barrier before a kernel that touches a buffer written (or writes one read) since the last
    barrier, unless both kernels run on thread 0 alone (serial), which orders them already."""
    serial = serial or [False] * len(kernels)
    dirty = {True: set(), False: set()}        # roots written since the last barrier, by serial-ness
    read = {True: set(), False: set()}
    out = []
    for n, ser in zip(kernels, serial):
        reads = {root(g, i) for i in n.inputs}
        w = root(g, n.id)
        kinds = (False,) if ser else (False, True)
        need = any(bool(reads & dirty[k]) or w in dirty[k] or w in read[k] for k in kinds)
        if need:
            dirty, read = {True: set(), False: set()}, {True: set(), False: set()}
        out.append(need)
        dirty[ser].add(w)
        read[ser] |= reads
    return out


def plan_arena(g: Graph, cg: CompiledGraph, reuse: bool = True) -> tuple[dict[int, int], int]:
    """Offsets in one arena for every kernel output that is not an alias. With reuse, a buffer
    is free once its last reader ran and a barrier followed; a named view counts as a reader
    right after the kernel before it (a trace reads it there)."""
    last_use: dict[int, int] = {}
    k = -1
    for n in cg.order:
        if n.op not in registry.NO_KERNEL:
            k += 1
            for i in n.inputs:
                last_use[root(g, i)] = k
        elif n.op is Op.RESHAPE and n.name:
            last_use[root(g, n.id)] = max(last_use.get(root(g, n.id), -1), k)
    keep = {root(g, i) for i in g.outputs.values()}
    offsets: dict[int, int] = {}
    free: list[tuple[int, int]] = []       # (offset, size), sorted, neighbours merged
    pending: list[tuple[int, int]] = []
    top = 0
    for k, n in enumerate(cg.kernels):
        if cg.barrier_before[k]:
            free = _merged(free + pending)
            pending = []
        if root(g, n.id) == n.id:
            size = -(-nbytes(n) // ALIGN) * ALIGN
            fit = [f for f in free if f[1] >= size] if reuse else []
            if fit:
                best = min(fit, key=lambda f: f[1])
                free.remove(best)
                offsets[n.id] = best[0]
                if best[1] > size:
                    free.append((best[0] + size, best[1] - size))
                    free.sort()
            elif reuse and free and sum(free[-1]) == top:      # grow the free block at the top
                offsets[n.id] = free.pop()[0]
                top = offsets[n.id] + size
            else:
                offsets[n.id] = top
                top += size
        for i in {root(g, i) for i in n.inputs}:
            if last_use.get(i) == k and i in offsets and i not in keep:
                pending.append((offsets[i], -(-nbytes(g[i]) // ALIGN) * ALIGN))
    return offsets, top


def _merged(blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Free (offset, size) blocks sorted, adjacent ones joined into one."""
    out: list[tuple[int, int]] = []
    for off, size in sorted(blocks):
        if out and sum(out[-1]) == off:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((off, size))
    return out


def _define_barrier(m: ir.Module) -> ir.Function:
    """Counter at byte 0, generation at byte 64: the last thread to arrive resets the counter
    and bumps the generation; the others spin on it: 100 pauses, then sched_yield between
    checks (a machine with more threads than free cores otherwise loses whole time slices)."""
    fn, b = new_function(m, "barrier", ir.FunctionType(void, [i8p, i64]))
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    st, nth = fn.args
    go, last, wait, spin, yld, done = (fn.append_basic_block(s) for s in ("go", "last", "wait", "spin", "yield", "done"))
    b.cbranch(b.icmp_signed("<=", nth, i64(1)), done, go)
    b.position_at_end(go)
    cnt = b.bitcast(st, i64.as_pointer())
    genp = b.bitcast(b.gep(st, [i64(64)]), i64.as_pointer())
    gen = b.load_atomic(genp, "acquire", 8)
    old = b.atomic_rmw("add", cnt, i64(1), "acq_rel")
    b.cbranch(b.icmp_signed("==", old, b.sub(nth, i64(1))), last, wait)
    b.position_at_end(last)
    b.store_atomic(i64(0), cnt, "monotonic", 8)
    b.atomic_rmw("add", genp, i64(1), "release")
    b.branch(done)
    b.position_at_end(wait)
    b.branch(spin)
    b.position_at_end(spin)
    k = b.phi(i64, name="spins")
    k.add_incoming(i64(0), wait)
    b.call(intrinsic(m, "llvm.x86.sse2.pause", void, []), [])
    k1 = b.add(k, i64(1))
    b.cbranch(b.icmp_signed("==", b.load_atomic(genp, "acquire", 8), gen), yld, done)
    b.position_at_end(yld)
    many = b.icmp_signed(">", k1, i64(100))
    with b.if_then(many):
        b.call(intrinsic(m, "sched_yield", ir.IntType(32), []), [])
    k.add_incoming(k1, b.block)
    b.branch(spin)
    b.position_at_end(done)
    b.ret_void()
    return fn


def emit(g: Graph) -> tuple[ir.Module, list[ir.Module], list[Node], list[Node], dict[int, int], list[bool]]:
    """The glue module (graph_part, the barrier) and one module per distinct kernel (plan)."""
    glue, reps, order, kernels, slot, barriers = plan(g)
    return glue, [kernel_module(g, n) for n in reps], order, kernels, slot, barriers


def kernel_module(g: Graph, n: Node) -> ir.Module:
    """Node n's kernel alone in a module (its text: _kernel_text)."""
    km = ir.Module(name="bankml_kernel")           # no index: the text is the kernel's alone
    registry.define(km, g, n).linkage = "external"
    return km


def plan(g: Graph) -> tuple[ir.Module, list[Node], list[Node], list[Node], dict[int, int], list[bool]]:
    """The glue module and, for each distinct kernel (kernel_key), the first node that has it.
    The glue is a loop over a constant plan (per kernel: its module, barrier and serial flags,
    its kernel argument, its buffer slots) that calls kernel j through kernel_table[j], which compile_graph fills
    with the compiled kernels' addresses. (One call site per kernel node made a function that
    took O3 0.85 s of SmolLM2's 2.3 s; the loop takes 0.01 s.)"""
    order = list(g)
    slot = {n.id: k for k, n in enumerate(order)}
    kernels = [n for n in order if n.op not in registry.NO_KERNEL]
    serial = [is_serial(g, n) for n in kernels]
    barriers = plan_barriers(g, kernels, serial)
    index: dict[tuple, int] = {}
    reps: list[Node] = []
    keys = [kernel_key(g, n) for n in kernels]
    for n, key in zip(kernels, keys):
        if key not in index:
            index[key] = len(reps)
            reps.append(n)
    m = ir.Module(name="bankml_graph")
    barrier = _define_barrier(m)
    table = ir.GlobalVariable(m, ir.ArrayType(i8p, len(reps)), name=KERNEL_TABLE)
    table.initializer = ir.Constant(table.type.pointee, None)     # external: LLVM may not fold the loads
    width = 4 + max(1 + len(n.inputs) for n in kernels)
    rows = [[index[key], int(need) | 2 * int(ser), 1 + len(n.inputs), registry.kernel_arg(g, n)]
            + [slot[i] for i in (n.id, *n.inputs)] for n, key, need, ser in zip(kernels, keys, barriers, serial)]
    # the plan as one byte-string constant of little-endian i64 records (an IR constant per
    # field made 12,500 llvmlite objects for SmolLM2's glue: time to build and print, and a
    # cyclic-GC pass over them when the module is dropped)
    data = b"".join(int(v).to_bytes(8, "little", signed=True) for r in rows for v in r + [0] * (width - len(r)))
    plan_gv = ir.GlobalVariable(m, ir.ArrayType(i8, len(data)), name="plan")
    plan_gv.global_constant, plan_gv.linkage, plan_gv.align = True, "internal", 8
    plan_gv.initializer = ir.Constant(plan_gv.type.pointee, bytearray(data))
    i64p = i64.as_pointer()
    rf, b = new_function(m, "graph_part", ir.FunctionType(void, [i8p.as_pointer(), i64, i64, i8p, i64p, i64, i64]))
    bufs, ith, nth, bar, sizes, lo, hi = rf.args
    dims = b.alloca(i64, KERNEL_ARG + 1, name="dims")       # the sizes, then each call's kernel argument
    for j in range(KERNEL_ARG):
        b.store(b.load(b.gep(sizes, [i64(j)])), b.gep(dims, [i64(j)]))
    records = b.bitcast(plan_gv, i64p)
    with for_range(b, lo, hi, name="k") as k:               # plan[k]: kernel, flags, pointer count, arg, slots
        rec = b.mul(k, i64(width))
        field = lambda f: b.load(b.gep(records, [b.add(rec, i64(f))]))              # noqa: E731
        b.store(field(3), b.gep(dims, [i64(KERNEL_ARG)]))
        flags = field(1)
        with b.if_then(b.icmp_signed("!=", b.and_(flags, i64(1)), i64(0))):
            b.call(barrier, [bar, nth])
        ser = b.icmp_signed("!=", b.and_(flags, i64(2)), i64(0))
        with b.if_then(b.or_(b.not_(ser), b.icmp_signed("==", ith, i64(0)))):
            kith, knth = b.select(ser, i64(0), ith), b.select(ser, i64(1), nth)
            fp = b.load(b.gep(table, [i64(0), field(0)]))
            after = b.append_basic_block("called")
            sw = b.switch(field(2), after)                   # one call per pointer count
            for a in sorted({r[2] for r in rows}):
                case = b.append_basic_block(f"args{a}")
                sw.add_case(i64(a), case)
                b.position_at_end(case)
                ptrs = [b.load(b.gep(bufs, [field(4 + j)])) for j in range(a)]
                ft = ir.FunctionType(void, [i8p] * a + [i64, i64, i64p])
                b.call(b.bitcast(fp, ft.as_pointer()), [*ptrs, kith, knth, dims])
                b.branch(after)
            b.position_at_end(after)
    b.ret_void()
    return m, reps, order, kernels, slot, barriers


def _kernel_text(km: ir.Module) -> str:
    """A kernel module's IR text with its one function named KERNEL_FN: the same kernel in
    another graph (another variant of the model) is the same text, so one disk cache entry."""
    name = next(f.name for f in km.functions if not f.is_declaration)
    text = jit.module_text(km)
    old, new = f'@"{name}"(', f'@"{KERNEL_FN}"('
    if text.count(old) != 1 or new in text:
        raise AssertionError(f"kernel module {km.name}: cannot name {name} {KERNEL_FN}")
    return text.replace(old, new)


def compile_graph(g: Graph) -> CompiledGraph:
    """Emit and JIT one graph: the glue and each distinct kernel. A kernel whose spec (its
    kernel_key in full, with this bankml's source) was compiled before, by this graph or another
    one, is loaded from the disk cache without emitting its IR; else its module is emitted and
    compiled, from the disk cache when its IR text was compiled before (a change elsewhere in
    bankml's code changes every spec, but few texts).
    (One thread: llvmlite serialises every LLVM call behind one lock.)"""
    t0 = time.perf_counter()
    m, reps, order, kernels, slot, barriers = plan(g)
    text = jit.module_text(m)
    emit_s = time.perf_counter() - t0
    engines = [jit.compile_text(text)] + [None] * len(reps)
    by_text: dict[str, list] = {}              # kernels alike but for ignored params: one engine
    for j, n in enumerate(reps, 1):
        spec = kernel_spec(g, n)
        engines[j] = jit.load_cached(spec) if spec is not None else None
        if engines[j] is None:
            t = time.perf_counter()
            text = _kernel_text(kernel_module(g, n))
            emit_s += time.perf_counter() - t
            by_text.setdefault(text, []).append((j, spec))
    for text, users in by_text.items():
        eng = jit.compile_text(text, also=[spec for _, spec in users if spec is not None])
        for j, _ in users:
            engines[j] = eng
    eng = engines[0]
    addrs = (ctypes.c_void_p * len(reps)).from_address(eng.get_global_value_address(KERNEL_TABLE))
    for j, ke in enumerate(engines[1:]):
        addrs[j] = ke.get_function_address(KERNEL_FN)
    t2 = time.perf_counter()
    c = ctypes
    part = c.CFUNCTYPE(None, c.c_void_p, c.c_int64, c.c_int64, c.c_void_p, c.c_void_p, c.c_int64,
                       c.c_int64)(eng.get_function_address("graph_part"))
    n_fns = len(reps)
    cache = [getattr(e, "_bankml_cache", "off") for e in engines]
    _log(f"llvm: compiled {g.meta.get('n_tokens')}x{g.meta.get('n_kv')} graph: {len(kernels)} kernels, "
         f"{n_fns} functions, {sum(barriers)} barriers, emit {emit_s:.2f}s, jit {t2 - t0 - emit_s:.2f}s "
         f"({', '.join(f'{cache.count(c)} {c}' for c in sorted(set(cache)))})")
    return CompiledGraph(order, slot, kernels, barriers, engines, part, n_fns,
                         {"emit": emit_s, "jit": t2 - t0 - emit_s}, sum(len(u) for u in by_text.values()))
