"""Row and elementwise kernels of the llvm backend: GET_ROWS, ADD, MUL, SET_ROWS.

- GET_ROWS of a weight (token embeddings) dequantizes each selected row as ggml-base's to_float
  (bankml/quants/*.dequantize; no FMA there): F16 exact, Q8_0 r(q*d), Q4_1 r(r(q*d)+m),
  Q1_0 bit ? d : -d, Q2_0 r((q-1)*d); other types register theirs with their mul_mat kernels
  (row_element: matmul/legacy.py, matmul/kquants.py). GET_ROWS of an f32 node copies rows (out_ids).
- ADD / MUL (binary-ops.cpp:apply_binary_op): r(a+b) / r(a*b), src1 broadcast over rows.
- SET_ROWS (ggml_compute_forward_set_rows -> ggml_cpu_fp32_to_fp16): row t of src1 rounded to
  f16 (RNE, fptrunc) into cache row pos[t]; `out` is the cache itself (the runner aliases it).
Threads split rows (or elements); no result depends on nth.
"""
from __future__ import annotations

import math
from typing import Callable

from llvmlite import ir

from bankml.backends.llvm.emit.core import (dim, f16, f32, for_range, i8, i32, i64, new_function, size, thread_range,
    typed)
from bankml.backends.llvm.emit.simd import at, load_h
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import upper
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import ELEMENTWISE, SET_ROWS_F16
from bankml.quants import F16, F32, GGML_TYPES, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES


def _start(m, n):
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    return fn, b


@kernel(Op.GET_ROWS, profile=("ggml", "portable"))
def define_get_rows(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    src = g[n.inputs[0]]
    K = n.shape[-1]
    fn, b = _start(m, n)
    out, sp, ids, ith, nth, dims = fn.args
    R = size(b, dims, n.shape[:-1])
    idp = typed(b, ids, i32)
    ys = typed(b, out, f32)
    gtype = int(src.params.get("ggml_type", -1)) if src.op is Op.WEIGHT else F32
    if src.op is not Op.WEIGHT and src.dtype != "f32":
        raise LoweringError(f"get_rows {n.name or n.id}: rows of a {src.dtype} node have no llvm kernel")
    if gtype != F32 and gtype not in ELEMENTS:
        raise LoweringError(f"get_rows {n.name or n.id}: weight type {gtype} has no llvm kernel")
    rb = GGML_TYPES[gtype].row_bytes(K)
    lo, hi = thread_range(b, R, ith, nth)
    with for_range(b, lo, hi, name="r") as r:
        row = b.gep(sp, [b.mul(b.sext(b.load(b.gep(idp, [r])), i64), i64(rb))])
        yrow = b.gep(ys, [b.mul(r, i64(K))])
        with for_range(b, 0, K, name="j") as j:
            b.store(_element(b, gtype, row, j), b.gep(yrow, [j]))
    b.ret_void()
    return fn


@kernel(Op.SLICE, profile=("ggml", "portable"))
def define_slice(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """Columns [lo, hi) of each f32 row, copied; threads split the rows."""
    width, lo, hi = g[n.inputs[0]].shape[-1], n.params["lo"], n.params["hi"]
    fn, b = _start(m, n)
    out, xp, ith, nth, dims = fn.args
    ys, xs = typed(b, out, f32), typed(b, xp, f32)
    first, last = thread_range(b, size(b, dims, n.shape[:-1]), ith, nth)
    with for_range(b, first, last, name="r") as r:
        src, dst = b.gep(xs, [b.add(b.mul(r, i64(width)), i64(lo))]), b.gep(ys, [b.mul(r, i64(hi - lo))])
        with for_range(b, 0, hi - lo, name="j") as j:
            b.store(b.load(b.gep(src, [j])), b.gep(dst, [j]))
    b.ret_void()
    return fn


ELEMENTS: dict[int, Callable] = {}     # weight type -> element(b, row, j), registered by the type's kernels


def row_element(wtype: int):
    """Register fn(b, row, j) -> f32 as element j of a wtype weight row (ggml-base to_float)."""
    def put(fn):
        ELEMENTS[wtype] = fn
        return fn
    return put


def _element(b: ir.IRBuilder, gtype: int, row, j):
    """Element j of a weight row, dequantized (ggml-base to_float), or of an f32 row."""
    if gtype == F32:
        return b.load(b.gep(typed(b, row, f32), [j]))
    return ELEMENTS[gtype](b, row, j)


def _block(b: ir.IRBuilder, gtype: int, row, j):
    """(offset of element j's block, j's index in it, the block's f16 d as f32)."""
    wt = WEIGHT_TYPES[gtype]
    blk, k = b.sdiv(j, i64(wt.block)), b.srem(j, i64(wt.block))
    base = b.mul(blk, i64(wt.block_bytes))
    return base, k, load_h(b, row, base)


@row_element(F16)
def _f16(b, row, j):
    return load_h(b, row, b.mul(j, i64(2)))


@row_element(Q8_0)
def _q8_0(b, row, j):
    base, k, d = _block(b, Q8_0, row, j)
    q = b.load(at(b, row, b.add(base, b.add(k, i64(2))), i8))
    return b.fmul(b.sitofp(q, f32), d)


@row_element(Q4_1)
def _q4_1(b, row, j):
    base, k, d = _block(b, Q4_1, row, j)
    mn = load_h(b, row, b.add(base, i64(2)))
    byte = b.load(at(b, row, b.add(base, b.add(b.srem(k, i64(16)), i64(4))), i8))
    sh = b.trunc(b.mul(b.sdiv(k, i64(16)), i64(4)), i8)
    q = b.and_(b.lshr(byte, sh), i8(15))
    return b.fadd(b.fmul(b.uitofp(q, f32), d), mn)


@row_element(Q1_0)
def _q1_0(b, row, j):
    base, k, d = _block(b, Q1_0, row, j)
    byte = b.load(at(b, row, b.add(base, b.add(b.sdiv(k, i64(8)), i64(2))), i8))
    bit = b.and_(b.lshr(byte, b.trunc(b.srem(k, i64(8)), i8)), i8(1))
    return b.select(b.icmp_unsigned("!=", bit, i8(0)), d, b.fneg(d))


@row_element(Q2_0)
def _q2_0(b, row, j):
    base, k, d = _block(b, Q2_0, row, j)
    byte = b.load(at(b, row, b.add(base, b.add(b.sdiv(k, i64(4)), i64(2))), i8))
    q = b.and_(b.lshr(byte, b.trunc(b.mul(b.srem(k, i64(4)), i64(2)), i8)), i8(3))
    return b.fmul(b.sitofp(b.sub(b.zext(q, i32), i32(1)), f32), d)


def _binary(m: ir.Module, g: Graph, n: Node, op: str) -> ir.Function:
    a, c = g[n.inputs[0]], g[n.inputs[1]]
    if n.order not in (None, ELEMENTWISE) or a.shape != n.shape or a.dtype != "f32" or c.dtype not in ("f32", "F32"):
        raise LoweringError(f"{n.op.value} {n.name or n.id}: no llvm kernel for {a.dtype}{list(a.shape)} "
                            f"and {c.dtype}{list(c.shape)}")
    lead = n.shape[:len(n.shape) - len(c.shape)]
    if tuple(n.shape[len(lead):]) != tuple(c.shape) or 0 in upper(c.shape):
        raise LoweringError(f"{n.op.value} {n.name or n.id}: {list(c.shape)} does not broadcast over {list(n.shape)}")
    fn, b = _start(m, n)
    out, ap, cp, ith, nth, dims = fn.args
    ys, xs, ws = typed(b, out, f32), typed(b, ap, f32), typed(b, cp, f32)
    rows, nb = size(b, dims, lead), size(b, dims, c.shape)
    if upper(lead) != () and math.prod(upper(lead)) >= 2:     # split rows; the broadcast operand is one row
        lo, hi = thread_range(b, rows, ith, nth)
        with for_range(b, lo, hi, name="r") as r:
            base = b.mul(r, nb)
            with for_range(b, 0, nb, name="j") as j:
                i = b.add(base, j)
                x, w = b.load(b.gep(xs, [i])), b.load(b.gep(ws, [j]))
                b.store(b.fadd(x, w) if op == "add" else b.fmul(x, w), b.gep(ys, [i]))
    else:                                      # one row: split its elements
        lo, hi = thread_range(b, nb, ith, nth)
        with for_range(b, lo, hi, name="j") as j:
            x, w = b.load(b.gep(xs, [j])), b.load(b.gep(ws, [j]))
            b.store(b.fadd(x, w) if op == "add" else b.fmul(x, w), b.gep(ys, [j]))
    b.ret_void()
    return fn


@kernel(Op.ADD, order=ELEMENTWISE)
def define_add(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    return _binary(m, g, n, "add")


@kernel(Op.MUL, order=ELEMENTWISE)
def define_mul(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    return _binary(m, g, n, "mul")


@kernel(Op.SET_ROWS, order=SET_ROWS_F16)
def define_set_rows(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    cache, vals, pos = (g[i] for i in n.inputs)
    if cache.dtype != "f16" or vals.dtype != "f32":
        raise LoweringError(f"set_rows {n.name or n.id}: only f32 rows into an f16 cache have an llvm kernel")
    row = math.prod(cache.shape[1:])
    if math.prod(vals.shape[1:]) != row or vals.shape[:1] != pos.shape:
        raise LoweringError(f"set_rows {n.name or n.id}: {list(vals.shape)} rows do not fit cache rows of {row}")
    fn, b = _start(m, n)
    out, _cache_in, vp, pp, ith, nth, dims = fn.args        # out is the cache (aliased by the runner)
    T = dim(b, dims, vals.shape[0])
    seqs = cache.params.get("seqs", False)     # a batch of sequences: out is a table of the rows' caches
    ys, xs, ps = typed(b, out, f16), typed(b, vp, f32), typed(b, pp, i32)
    lo, hi = thread_range(b, T, ith, nth)
    with for_range(b, lo, hi, name="t") as t:
        if seqs:
            ys = b.inttoptr(b.load(b.gep(typed(b, out, i64), [t])), f16.as_pointer())
        dst = b.gep(ys, [b.mul(b.sext(b.load(b.gep(ps, [t])), i64), i64(row))])
        src = b.gep(xs, [b.mul(t, i64(row))])
        with for_range(b, 0, row, name="j") as j:
            b.store(b.fptrunc(b.load(b.gep(src, [j])), f16), b.gep(dst, [j]))
    b.ret_void()
    return fn
