"""The kernel contract of the llvm backend, and the registry of kernels by op.

A kernel is one LLVM function per IR node, emitted into the graph's module by

    @kernel(Op.RMS_NORM)
    def define_rms_norm(m: ir.Module, g: Graph, n: Node) -> ir.Function: ...

Signature of every kernel function (name: f"k{n.id}_{n.op.value}", linkage internal is fine):

    void (i8* out, i8* in_0, ..., i8* in_{k-1}, i64 ith, i64 nth, i64* dims)

- `out` is the node's buffer; `in_j` the buffer of n.inputs[j]; all pointers are i8*.
- Sizes may be symbolic (bankml.ir.dims.Dim: T, KV, O, KVS): their values of this call are
  dims[Dim.slot] (common.dim / common.size read them), and dims[4], the last slot, is llama.cpp's thread count.
  A buffer holds the node's shape at these values; the runner allocates it for the largest.
- dims[5] (common.KERNEL_ARG) is the node's kernel argument, kernel_arg(g, n) (0 for most ops):
  a size the kernel reads at run time although it is fixed, so that kernels that differ only
  in it are one IR text, compiled once (mul_mat: the weight's rows; SmolLM2's Q, K/V and
  gate/up projections share one kernel). The glue sets it per call (compile.py).
- Buffers are contiguous, row-major in node.shape (numpy order):
    f32 nodes: float;   f16 nodes (the K/V cache, the KQ mask): half;   i32 inputs (tokens, pos,
    out_ids): i32;   WEIGHT: the GGUF tensor bytes, rows of row_bytes;   QUANTIZE output: the ggml
    bytes of its type (F16: half; Q8_0: 34-byte blocks per 32 values; Q8_1: 36-byte blocks;
    Q8_K: 292-byte block_q8_K per 256), one activation row after another (row_bytes = K/32 * block
    bytes, K/256 * 292 for Q8_K, or 2K for F16).
- CACHE buffers are the session's whole f16 cache [kv_size, n_head_kv, head_dim]; SET_ROWS
  writes the rows at positions pos into its input cache and its `out` IS that same cache
  buffer (the runner aliases them), so FLASH_ATTN reads the first n_kv cells of it.
- RESHAPE has no kernel: the runner aliases its buffer to its input's.
- The kernel computes the share `ith` of `nth` threads (any deterministic split of rows, heads
  or blocks); the graph function puts a barrier between dependent kernels. The bits must not
  depend on nth, and must equal the reference backend's lowering of the same node (the split-KV
  attention's chunk count comes from llama.cpp's thread count, dims[4], never nth).
- Float order comes from n.order (FloatOrder) exactly as the reference backend reads it:
  `llvm.fma.*` where it says fma, plain fmul/fadd otherwise, never a fast-math flag.

Kernels register by (profile, op, float order) in one table (bankml/backends/registry.py):
`@kernel(Op.FLASH_ATTN, order=FA_TILED)`, `@kernel(Op.RMS_NORM, order=po.RMS_NORM, profile="portable")`
(ggml/ and portable/ hold them; importing those packages registers every kernel). `define` looks a
node up by its graph's profile, its op and its order; a node whose order has no kernel is refused.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from bankml.backends.registry import KernelTable, Orders
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op

Emitter = Callable[[ir.Module, Graph, Node], ir.Function]
KERNELS = KernelTable("llvm")
NO_KERNEL = frozenset({Op.INPUT, Op.WEIGHT, Op.CACHE, Op.RESHAPE})


KERNEL_ARGS: dict[Op, Callable[[Graph, Node], int]] = {}


def kernel_arg(g: Graph, n: Node) -> int:
    """Node n's kernel argument, dims[common.KERNEL_ARG] of its calls (0 where its op has none)."""
    f = KERNEL_ARGS.get(n.op)
    return int(f(g, n)) if f else 0


def kernel(op: Op, order: Orders = None, profile: str = "ggml"):
    """Decorator: the emitter of op's kernel in these float orders (registry.KernelTable.register)."""
    return KERNELS.register(op, order, profile)


def kernel_name(n: Node) -> str:
    return f"k{n.id}_{n.op.value}"


def kernel_type(n: Node) -> ir.FunctionType:
    i8p = ir.IntType(8).as_pointer()
    i64 = ir.IntType(64)
    return ir.FunctionType(ir.VoidType(), [i8p] * (1 + len(n.inputs)) + [i64, i64, i64.as_pointer()])


def define(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """The kernel function of node n, emitted into module m (once: a second call returns it)."""
    name = kernel_name(n)
    if name in m.globals:
        return m.globals[name]
    return KERNELS.lookup(g, n)(m, g, n)
