"""QUANTIZE: an f32 activation to the weight's vec_dot type, as bankml/quants/activation.py.

F16: fptrunc (vcvtps2ph, RNE), as ggml_cpu_fp32_to_fp16.
q8_0 / q8_1 (quantize_row_q8_0/_q8_1, AVX2 branch), per block of 32:
    amax = max|x|; d = r(amax/127); block.d = f16(d); id = amax != 0 ? r(127/amax) : 0
    v = roundeven(r(x*id)); i32 = |v| < 2^31 ? (int)v : INT32_MIN   (cvtps_epi32)
    q = clamp(i32, -128, 127)                                         (the two saturating packs)
    q8_1 only: block.s = f16(r(d * (float)sum(i32)))   (int32 sum, wrapping)
Threads split blocks (or elements for F16); the bits do not depend on nth.
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import (f16, f32, for_range, i8, i32, i64, intrinsic, new_function, size,
    thread_range, typed)
from bankml.backends.llvm.emit.simd import at, splat
from bankml.backends.llvm.ggml.matmul.kquants import define_quantize_q8_k
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.quants import ACT_TYPES, F16, Q8_0, Q8_1, Q8_K

v32f32, v32i32, v32i8 = ir.VectorType(f32, 32), ir.VectorType(i32, 32), ir.VectorType(i8, 32)


@kernel(Op.QUANTIZE)
def define_quantize(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    t = int(n.params["type"])
    if t == Q8_K:
        return define_quantize_q8_k(m, g, n)
    x = g[n.inputs[0]]
    K = x.shape[-1]
    if x.dtype != "f32" or t not in (F16, Q8_0, Q8_1) or (t != F16 and K % 32):
        raise LoweringError(f"quantize {n.id}: no llvm kernel for type {t} of a {x.dtype} row of {K}")
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    out, src, ith, nth, dims = fn.args
    M = size(b, dims, x.shape[:-1])
    if t == F16:
        xs, ys = typed(b, src, f32), typed(b, out, f16)
        lo, hi = thread_range(b, b.mul(M, i64(K)), ith, nth)
        with for_range(b, lo, hi) as i:
            b.store(b.fptrunc(b.load(b.gep(xs, [i])), f16), b.gep(ys, [i]))
        b.ret_void()
        return fn
    bb = ACT_TYPES[t].block_bytes                # q8_0 34, q8_1 36
    vsum = intrinsic(b.module, "llvm.vector.reduce.add.v32i32", i32, [v32i32])
    lo, hi = thread_range(b, b.mul(M, i64(K // 32)), ith, nth)
    with for_range(b, lo, hi, name="blk") as ib:
        xv = b.load(at(b, src, b.mul(ib, i64(128)), v32f32), align=4)
        ob = b.mul(ib, i64(bb))
        d, q32, q = q8_block(b, xv)
        b.store(b.fptrunc(d, f16), at(b, out, ob, f16), align=1)
        if t == Q8_1:
            s = b.fmul(d, b.sitofp(b.call(vsum, [q32]), f32))
            b.store(b.fptrunc(s, f16), at(b, out, b.add(ob, i64(2)), f16), align=1)
        b.store(q, at(b, out, b.add(ob, i64(bb - 32)), v32i8), align=1)
    b.ret_void()
    return fn


def q8_block(b: ir.IRBuilder, xv: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """quantize_row_q8_0/_q8_1's AVX2 steps for one block of 32 floats (<32 x float>):
    (d = r(amax/127), the codes as cvtps_epi32 gives them (i32), the clamped codes (i8))."""
    mod = b.module
    fabs = intrinsic(mod, "llvm.fabs.v32f32", v32f32, [v32f32])
    vmax = intrinsic(mod, "llvm.vector.reduce.fmax.v32f32", f32, [v32f32])
    rne = intrinsic(mod, "llvm.roundeven.v32f32", v32f32, [v32f32])
    smax = intrinsic(mod, "llvm.smax.v32i32", v32i32, [v32i32, v32i32])
    smin = intrinsic(mod, "llvm.smin.v32i32", v32i32, [v32i32, v32i32])
    amax = b.call(vmax, [b.call(fabs, [xv])])
    d = b.fdiv(amax, f32(127.0))
    nz = b.fcmp_ordered("!=", amax, f32(0.0))
    idv = b.select(nz, b.fdiv(f32(127.0), amax), f32(0.0))
    v = b.call(rne, [b.fmul(xv, splat(b, idv, 32))])
    ok = b.fcmp_ordered("<", b.call(fabs, [v]), splat(b, f32(2.0 ** 31), 32))
    q32 = b.select(ok, b.fptosi(b.select(ok, v, ir.Constant(v32f32, [0.0] * 32)), v32i32),
                   ir.Constant(v32i32, [-(2 ** 31)] * 32))
    q = b.trunc(b.call(smin, [b.call(smax, [q32, ir.Constant(v32i32, [-128] * 32)]),
                              ir.Constant(v32i32, [127] * 32)]), v32i8)
    return d, q32, q
