"""RMS_NORM kernel (GGML_MAP §2), the bits of bankml/backends/reference/norm.py:rms_norm.

ggml-cpu/ops.cpp:ggml_compute_forward_rms_norm_f32, per row of K = n.shape[-1]:
    sum   = 0.0 (double); for i: sum += (double) r(x[i]*x[i])     # sequential, no FMA
    mean  = (float)(sum / K)
    scale = r(1.0f / sqrtf(r(mean + eps)))
    y     = r(x * scale)
The sum is a serial chain of fadd double (LLVM may not reassociate it without fast-math);
the scaling loop is elementwise, so LLVM is free to vectorise it. Rows are split over threads.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.common import f32, f64, for_range, i64, intrinsic, new_function, size, thread_range, typed
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import RMS_NORM


@kernel(Op.RMS_NORM)
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

    acc = b.alloca(f64, name="sum")                  # promoted to a register by mem2reg
    lo, hi = thread_range(b, rows, ith, nth)
    with for_range(b, lo, hi, name="row") as r:
        base = b.mul(r, i64(k))
        b.store(f64(0.0), acc)
        with for_range(b, 0, k, name="i") as i:
            x = b.load(b.gep(px, [b.add(base, i)]))
            b.store(b.fadd(b.load(acc), b.fpext(b.fmul(x, x), f64)), acc)
        total = b.load(acc, name="sum")
        mean = b.fptrunc(b.fdiv(total, f64(float(k))), f32, name="mean")
        scale = b.fdiv(f32(1.0), b.call(sqrt, [b.fadd(mean, eps)]), name="scale")
        with for_range(b, 0, k, name="j") as j:
            at = b.add(base, j)
            b.store(b.fmul(b.load(b.gep(px, [at])), scale), b.gep(py, [at]))
    b.ret_void()
    return fn

