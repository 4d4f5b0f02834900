"""mul_mat of the llvm backend: ggml_compute_forward_mul_mat, bit for bit, in register tiles.

Same orders as backends/reference/matmul.py (read its docstrings); the per-type float steps
are in backends/llvm/ggml/matmul/f16.py and backends/llvm/ggml/matmul/quant.py, which register a `Tiler` here:
- F16_VEC_DOT (ggml_vec_dot_f16) and F16_TINYBLAS (tinyBLAS<8,__m256>).
- Q8_0_DOT, Q4_1_DOT, Q1_0_DOT, Q2_0_DOT (the vec_dots of the quantized weights).

ggml computes every (row, column) pair with its own vec_dot. Each output here keeps exactly
that chain of float steps, but a tile of R weight rows x C activation columns runs together:
a weight block is unpacked once for C columns, an activation block loaded once for R rows,
and R*C independent accumulators hide the FMA latency. Per column tile, the activation's f16
scales (and anything else per column) are converted once into stack scratch (`Tiler.prep`).

Loop nest of one thread (rows [lo, hi) of N, a contiguous share; bits never depend on nth):

    for each chunk of rows (sized to stay in L2; one chunk when there is one column tile):
        for each column tile (C columns; a last tile of M % C):
            prep(columns)
            for each group of R rows: [prefetch a share of the next chunk (few columns)]
                tile(rows, columns); leftover rows one at a time

Lane l of a quantized block holds the exact int32 sum of elements 4l..4l+3, made as ggml
makes it: vpmaddubsw (u8 x s8 -> i16 pairs, never saturating for q8 activations in
[-127, 127]) then vpmaddwd with ones.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from bankml.backends.llvm.emit.core import (ceil_div, dim, f32, for_range, i64, kernel_arg, new_function, prefetch, size, smin, thread_range, typed)
from bankml.backends.llvm.emit.simd import alloca
from bankml.backends.llvm.registry import KERNEL_ARGS, kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import prod_range
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.quants import ACT_TYPES, WEIGHT_TYPES

CHUNK_BYTES = 96 * 1024                          # weight bytes of one row chunk (L2-resident)
PREFETCH_MAX_COLS = 128                          # micro-batches of at most this many columns prefetch
WIDE_COLS = 32                                   # Tiler.wide from kernels whose column count reaches this


# ---- small vector helpers (shared by the other kernels of this backend) -------------------


# ---- tilers and the kernel ----------------------------------------------------------------

@dataclass(frozen=True)
class Tiler:
    """How one weight type and float order computes an R x C tile of outputs.

    shape(M, K) -> (R, C): rows and columns of a full tile for a micro-batch of M columns of K.
    alloc(b, K, C) -> scratch: entry-block stack arrays for one column tile (or None).
    prep(b, K, xrows, scratch) -> cols: per column tile state (xrows: C activation row pointers).
    tile(b, K, wrows, cols) -> [[value] * C] * R: the finished f32 outputs of the tile.
    chunk(b, K, w0, n, n_max, scratch): optional, per chunk of n (<= n_max) weight rows from w0
    (i8*), before its column tiles; only where the rows run in chunks (several column tiles).
    wide: the tiler of kernels whose column count reaches WIDE_COLS (a prompt's), where more
    work per chunk pays for fewer uops per product (quant.py's widen_pairs).

    Every kernel prefetches the next chunk's weights while a chunk runs (a share of its cache
    lines before each tile) when the micro-batch has at most PREFETCH_MAX_COLS columns: one
    thread's hardware prefetch here streams a matrix at 10-16 GB/s where the kernels would take
    it at twice that, and a chunk's first pass (the chunk step's scales) would otherwise wait on
    DRAM (bench/mul_mat_columns.py; docs/PERFORMANCE.md, 2026-12-06). A kernel of one column
    tile runs in chunks for it too, its columns prepared once and no chunk step.
    """
    shape: Callable[[int, int], tuple[int, int]]
    alloc: Callable
    prep: Callable
    tile: Callable
    chunk: Callable | None = None
    wide: Tiler | None = None


TILERS: dict[tuple[int, object], Tiler] = {}       # (ggml weight type, FloatOrder) -> Tiler


def register_tiler(wtype: int, order, tiler: Tiler) -> None:
    """The tiled mul_mat kernel of weight type wtype in this float order, computed by tiler."""
    TILERS[(wtype, order)] = tiler
    kernel(Op.MUL_MAT, order=order)(define_mul_mat)


def plain_cols(b, K, xrows, scratch):
    """prep for tilers that need nothing per column but the row pointers."""
    return xrows


def prefetch_ahead(b, wp, nextp, end, per) -> None:
    """Prefetch `per` cache lines of wp from *nextp (no further than end) and advance *nextp."""
    start = b.load(nextp)
    with for_range(b, 0, per, name="pf") as k:
        at = b.add(start, b.mul(k, i64(64)))
        with b.if_then(b.icmp_signed("<", at, end)):
            prefetch(b, b.gep(wp, [at]), 3)
    b.store(b.add(start, b.mul(per, i64(64))), nextp)


KERNEL_ARGS[Op.MUL_MAT] = lambda g, n: g[n.inputs[0]].shape[0]          # the weight's rows, N


def define_mul_mat(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    if w.op is not Op.WEIGHT or xq.op is not Op.QUANTIZE:
        raise LoweringError(f"mul_mat {n.name}: llvm wants a weight and a quantize node, got {w.op.value}, {xq.op.value}")
    wtype = int(w.params["ggml_type"])
    if wtype not in WEIGHT_TYPES:
        raise LoweringError(f"mul_mat {n.name}: weight type {wtype} has no llvm kernel")
    wt = WEIGHT_TYPES[wtype]
    N, K = w.shape
    M_lo, M_hi = prod_range(n.shape[:-1])
    if n.shape[-1] != N or xq.shape[-1] != K or int(xq.params["type"]) != wt.act_type:
        raise LoweringError(f"mul_mat {n.name}: shapes or activation type do not fit the weight")
    tiler = TILERS.get((wtype, n.order))
    if tiler is None:
        raise LoweringError(f"mul_mat {n.name}: {wt.name} order {n.order.describe() if n.order else None} is not lowered")
    if tiler.wide is not None and M_hi >= WIDE_COLS:
        tiler = tiler.wide
    if K % wt.block:
        raise LoweringError(f"mul_mat {n.name}: K = {K} is not a multiple of {wt.name} blocks")
    xrb = ACT_TYPES[wt.act_type].row_bytes(K)
    wrb = wt.row_bytes(K)

    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    if M_lo == M_hi:                 # a known column count: its best tile, then one tile of the rest
        R, C = tiler.shape(M_lo, K)
        C = min(C, M_lo)
        col_tiles = [(R, C, i64(M_lo // C), 0)] + ([(R, M_lo % C, i64(1), M_lo // C * C)] if M_lo % C else [])
    else:                            # columns known at run time: full tiles, then the rest in tiles of 4, 2, 1
        R, C = tiler.shape(max(1, min(M_hi, 8)), K)
        full = b.sdiv(M, i64(C))
        col_tiles = [(R, C, full, 0)]
        first, rest = b.mul(full, i64(C)), b.srem(M, i64(C))
        for c in (4, 2, 1):
            if c < C:
                count = b.and_(b.lshr(rest, i64(c.bit_length() - 1)), i64(1))
                col_tiles.append((tiler.shape(c, K)[0], c, count, first))
                first = b.add(first, b.mul(count, i64(c)))
    scr = tiler.alloc(b, K, max(c for _, c, _, _ in col_tiles))
    rows_n = kernel_arg(b, dims)     # N, at run time: one kernel text for every row count of a K
    lo, hi = thread_range(b, rows_n, ith, nth)

    ahead = None                     # per chunk: (next byte to prefetch, end, lines per tile)

    def rows(R, rlo, rhi, xrows, cols, m0):
        def emit(r0, nr):
            prefetch_ahead(b, wp, *ahead)
            wrows = [b.gep(wp, [b.mul(b.add(r0, i64(i)), i64(wrb))]) for i in range(nr)]
            res = tiler.tile(b, K, wrows, cols)
            for i in range(nr):
                for j, v in enumerate(res[i]):
                    b.store(v, b.gep(yp, [b.add(b.mul(b.add(m0, i64(j)), rows_n), b.add(r0, i64(i)))]))

        groups = b.sdiv(b.sub(rhi, rlo), i64(R)) if R > 1 else b.sub(rhi, rlo)
        with for_range(b, 0, groups, name="rg") as gi:
            emit(b.add(rlo, b.mul(gi, i64(R))), R)
        if R > 1:
            with for_range(b, b.add(rlo, b.mul(groups, i64(R))), rhi, name="rt") as r:
                emit(r, 1)

    one_tile = M_lo == M_hi and len(col_tiles) == 1 and M_lo == C
    if one_tile:                     # prepared once; no chunk pass (nothing to share between tiles)
        xrows = [b.gep(xp, [i64(j * xrb)]) for j in range(C)]
        cols = tiler.prep(b, K, xrows, scr)

    def columns(rlo, rhi):
        if one_tile:
            return rows(col_tiles[0][0], rlo, rhi, xrows, cols, i64(0))
        for Rt, c, count, first in col_tiles:
            with for_range(b, 0, count, name=f"ct{c}") as t:
                m0 = b.add(dim(b, dims, first), b.mul(t, i64(c)))
                xr = [b.gep(xp, [b.mul(b.add(m0, i64(j)), i64(xrb))]) for j in range(c)]
                rows(Rt, rlo, rhi, xr, tiler.prep(b, K, xr, scr), m0)

    R = max(r for r, _, _, _ in col_tiles)              # powers of two: chunks cut no row group
    chunk = max(R, CHUNK_BYTES // wrb // R * R)
    tiles = functools.reduce(b.add, [count for _, _, count, _ in col_tiles])
    nextp = alloca(b, i64, i64(0), "prefetch_at")
    few = b.icmp_signed("<=", M, i64(PREFETCH_MAX_COLS))
    with for_range(b, lo, hi, step=chunk, name="chunk") as r0:
        r1 = smin(b, b.add(r0, i64(chunk)), hi)
        # the next chunk's lines, a share before each tile of this chunk
        end = b.mul(smin(b, b.add(r1, i64(chunk)), hi), i64(wrb))
        calls = b.mul(tiles, ceil_div(b, b.sub(r1, r0), i64(R)))
        calls = b.select(b.icmp_signed(">", calls, i64(0)), calls, i64(1))     # no column: no tile
        per = ceil_div(b, ceil_div(b, b.sub(end, b.mul(r1, i64(wrb))), i64(64)), calls)
        b.store(b.mul(r1, i64(wrb)), nextp)
        ahead = (nextp, end, b.select(few, per, i64(0)))
        if tiler.chunk and not one_tile:
            tiler.chunk(b, K, b.gep(wp, [b.mul(r0, i64(wrb))]), b.sub(r1, r0), chunk, scr)
        columns(r0, r1)
    b.ret_void()
    return fn
