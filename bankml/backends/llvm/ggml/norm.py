"""RMS_NORM kernel (GGML_MAP §2), the bits of bankml/backends/reference/norm.py:rms_norm.

ggml-cpu/ops.cpp:ggml_compute_forward_rms_norm_f32, per row of K = n.shape[-1]:
    sum   = 0.0 (double); for i: sum += (double) r(x[i]*x[i])     # sequential, no FMA
    mean  = (float)(sum / K)
    scale = r(1.0f / sqrtf(r(mean + eps)))
    y     = r(x * scale)
The sum is a serial chain of fadd double per row, so one row is bound by the add's latency
(about 4 cycles an element). When K % 8 == 0 the rows run eight at a time: an 8x8 block of
squares is transposed so that lane j holds row j, and two <4 x double> accumulators carry the
eight rows' chains side by side, each still adding its row's squares in column order; the
rows left over sum one at a time. With K % 8 == 0 every row scales by explicit 8-lane products;
otherwise elementwise, which LLVM may vectorise. Rows are split over threads.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.emit.core import (f32, f64, for_range, i32, i64, intrinsic, new_function, size, smin,
    thread_range, typed, v8f32)
from bankml.backends.llvm.emit.simd import broadcast
from bankml.backends.llvm.emit.simd import transpose8
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import RMS_NORM

v4f64 = ir.VectorType(f64, 4)


@kernel(Op.RMS_NORM, order=RMS_NORM)
def define_rms_norm(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order != RMS_NORM:
        raise LoweringError(f"llvm backend: rms_norm lowers only {RMS_NORM.describe()!r}, not "
                            f"{n.order.describe() if n.order else None!r} ({n.name or n.id})")
    name = kernel_name(n)
    fn, b = new_function(m, name, kernel_type(n))
    out, src, ith, nth, dims = fn.args
    px, py = typed(b, src, f32), typed(b, out, f32)
    k = n.shape[-1]
    rows = size(b, dims, n.shape[:-1])
    eps = f32(float(np.float32(n.params["eps"])))    # ggml's `const float eps`
    sqrt = intrinsic(m, "llvm.sqrt.f32", f32, [f32])

    acc = b.alloca(f64, name="sum")                  # promoted to registers by mem2reg
    sums8 = b.alloca(ir.ArrayType(v4f64, 2), name="sums")     # rows r0..r0+3, r0+4..r0+7
    accs = [b.gep(sums8, [i32(0), i32(h)]) for h in range(2)]
    lo, hi = thread_range(b, rows, ith, nth)

    def scale_row(r, total, vector: bool = False):
        base = b.mul(r, i64(k))
        mean = b.fptrunc(b.fdiv(total, f64(float(k))), f32, name="mean")
        scale = b.fdiv(f32(1.0), b.call(sqrt, [b.fadd(mean, eps)]), name="scale")
        if not vector:                               # LLVM vectorises this loop itself
            with for_range(b, 0, k, name="j") as j:
                at = b.add(base, j)
                b.store(b.fmul(b.load(b.gep(px, [at])), scale), b.gep(py, [at]))
            return
        sv = broadcast(b, scale)
        with for_range(b, 0, k, step=8, name="j") as j:
            at = b.add(base, j)
            b.store(b.fmul(vload(px, at), sv), b.bitcast(b.gep(py, [at]), v8f32.as_pointer()), align=4)

    def vload(p, at):
        return b.load(b.bitcast(b.gep(p, [at]), v8f32.as_pointer()), align=4)

    first = lo
    if k % 8 == 0:                                   # eight rows' chains at a time
        groups = b.sdiv(b.sub(hi, lo), i64(8))
        with for_range(b, 0, groups, name="rg") as gi:
            r0 = b.add(lo, b.mul(gi, i64(8)))
            for a in accs:
                b.store(ir.Constant(v4f64, [0.0] * 4), a)
            with for_range(b, 0, k // 8, name="c") as c:
                sq = []
                for j in range(8):
                    x = vload(px, b.add(b.mul(b.add(r0, i64(j)), i64(k)), b.mul(c, i64(8))))
                    sq.append(b.fmul(x, x))
                for col in transpose8(b, sq):            # lane j: row r0 + j's square
                    for h, a in enumerate(accs):
                        half = b.shuffle_vector(col, col, ir.Constant(ir.VectorType(i32, 4), [4 * h + l for l in range(4)]))
                        b.store(b.fadd(b.load(a), b.fpext(half, v4f64)), a)
            with for_range(b, 0, smin(b, i64(8), b.sub(hi, r0)), name="jr") as jr:    # the eight rows' scaling
                sums = b.bitcast(accs[0], f64.as_pointer())
                scale_row(b.add(r0, jr), b.load(b.gep(sums, [jr])), vector=True)
        first = b.add(lo, b.mul(groups, i64(8)))
    with for_range(b, first, hi, name="row") as r:
        base = b.mul(r, i64(k))
        b.store(f64(0.0), acc)
        with for_range(b, 0, k, name="i") as i:
            x = b.load(b.gep(px, [b.add(base, i)]))
            b.store(b.fadd(b.load(acc), b.fpext(b.fmul(x, x), f64)), acc)
        scale_row(r, b.load(acc, name="sum"), vector=k % 8 == 0)
    b.ret_void()
    return fn

