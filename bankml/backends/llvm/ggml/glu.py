"""SWIGLU, SILU, GEGLU, SCALE, SIGMOID and SOFTPLUS kernels, and ggml_v_expf emitted in LLVM IR (GGML_MAP §7).

ggml-cpu/vec.cpp:ggml_vec_swiglu_f32 per row of n = gate.shape[-1], as the reference backend
(bankml/backends/reference/glu.py) spells it:
    8-lane chunks:   y = r( r(g / r(1 + ggml_v_expf(r(0 - g)))) * u )
    the n%8 tail:    y = r( r(g / r(1 + expf(-g))) * u )              # glibc expf
and ggml_vec_silu_f32 (ggml_silu) the same without `* u`.
`v_expf` below is ggml_v_expf(__m256) (ggml-cpu/vec.h, AVX2+FMA branch) on <8 x float>, every
fmadd/fnmadd one llvm.fma, as bankml/numerics/expf.py, with ggml's `any lane |n| > 126` branch
(`v_expf_branch`); the flash-attention tiled kernel takes its halves (v_expf_fast,
v_expf_scaled) to branch once for a row of eight vectors.
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import (f32, for_range, i8, i32, i64, intrinsic, new_function, size,
    thread_range, typed, v8f32)
from bankml.backends.llvm.emit.expf import v_expf_branch
from bankml.backends.llvm.emit.simd import const_vec
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import GEGLU, SCALE, SIGMOID, SILU, SOFTPLUS, SWIGLU

v8i32 = ir.VectorType(i32, 8)


def _silu_elem(b: ir.IRBuilder, g: ir.Value) -> ir.Value:
    """ggml_silu_f32, the scalar tail: r(g / r(1 + expf(-g))), glibc expf."""
    e = b.call(intrinsic(b.module, "expf", f32, [f32]), [b.fneg(g)])
    return b.fdiv(g, b.fadd(f32(1.0), e))


def _silu_vec(b: ir.IRBuilder, g: ir.Value) -> ir.Value:
    """ggml_v_silu on 8 lanes."""
    e = v_expf_branch(b, b.fsub(const_vec(0.0), g))                                         # _mm256_sub_ps(zero, x)
    return b.fdiv(g, b.fadd(const_vec(1.0), e))


@kernel(Op.SWIGLU, order=SWIGLU)
def define_swiglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order != SWIGLU:
        raise LoweringError(f"llvm backend: swiglu lowers only {SWIGLU.describe()!r}, not "
                            f"{n.order.describe() if n.order else None!r} ({n.name or n.id})")
    return _silu_rows(m, n, gated=True)


@kernel(Op.SILU, order=SILU)
def define_silu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order != SILU:
        raise LoweringError(f"llvm backend: silu lowers only {SILU.describe()!r} ({n.name or n.id})")
    return _silu_rows(m, n, gated=False)


def _silu_rows(m: ir.Module, n: Node, gated: bool) -> ir.Function:
    """silu(gate) * up (gated) or silu(x) over rows: ggml_v_silu on each row's 8-lane chunks, the
    scalar form on its n%8 tail."""
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, gate, *rest = fn.args
    up, (ith, nth, dims) = (rest[0], rest[1:]) if gated else (None, rest)
    po, pg = typed(b, out, f32), typed(b, gate, f32)
    pu = typed(b, up, f32) if gated else None
    width = n.shape[-1]
    rows = size(b, dims, n.shape[:-1])
    body, tail = width - width % 8, width % 8

    def chunk(off):                                    # 8 lanes at flat offset off
        vp = lambda p: b.bitcast(b.gep(p, [off]), v8f32.as_pointer())         # noqa: E731
        y = _silu_vec(b, b.load(vp(pg), align=4))
        if gated:
            y = b.fmul(y, b.load(vp(pu), align=4))
        b.store(y, vp(po), align=4)

    if tail == 0:                                      # rows are back to back: split 8-lane chunks
        lo, hi = thread_range(b, b.mul(rows, i64(width // 8)), ith, nth)
        with for_range(b, lo, hi, name="c") as c:
            chunk(b.mul(c, i64(8)))
    else:
        lo, hi = thread_range(b, rows, ith, nth)
        with for_range(b, lo, hi, name="row") as r:
            base = b.mul(r, i64(width))
            with for_range(b, 0, body // 8, name="c") as c:
                chunk(b.add(base, b.mul(c, i64(8))))
            for t in range(tail):
                off = b.add(base, i64(body + t))
                y = _silu_elem(b, b.load(b.gep(pg, [off])))
                if gated:
                    y = b.fmul(y, b.load(b.gep(pu, [off])))
                b.store(y, b.gep(po, [off]))
    b.ret_void()
    return fn


# ---- GEGLU (ggml's GELU f16 table) and SCALE -----------------------------------------------

def _gelu_table(m: ir.Module) -> ir.GlobalVariable:
    """ggml_table_gelu_f16 (bankml/numerics/gelu.py) as a constant of the module, once: its 65,536 f16
    bit patterns as one little-endian byte string (an IR array of 65,536 i16 constants took
    0.2 s to build and print per kernel, and as long again to free)."""
    name = "ggml_table_gelu_f16"
    if name in m.globals:
        return m.globals[name]
    from bankml.numerics.gelu import gelu_table_f16
    data = gelu_table_f16().astype("<f2").tobytes()
    t = ir.ArrayType(i8, len(data))
    gv = ir.GlobalVariable(m, t, name=name)
    gv.global_constant, gv.linkage, gv.align = True, "internal", 64
    gv.initializer = ir.Constant(t, bytearray(data))
    return gv


def _elementwise(m: ir.Module, n: Node, n_in: int, emit) -> ir.Function:
    """A kernel over every element of n, split between threads; emit(b, *inputs) -> output."""
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, *ins = fn.args[:1 + n_in]
    ith, nth, dims = fn.args[1 + n_in:]
    po, pins = typed(b, out, f32), [typed(b, p, f32) for p in ins]
    lo, hi = thread_range(b, size(b, dims, n.shape), ith, nth)
    with for_range(b, lo, hi, name="e") as e:
        b.store(emit(b, *(b.load(b.gep(p, [e])) for p in pins)), b.gep(po, [e]))
    b.ret_void()
    return fn


@kernel(Op.GEGLU, order=GEGLU)
def define_geglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16): x <= -10: 0; x >= 10: r(x*u);
    else r(f32(table[f16(x)]) * u), as bankml/numerics/gelu.py."""
    if n.order != GEGLU:
        raise LoweringError(f"llvm backend: geglu lowers only {GEGLU.describe()!r} ({n.name or n.id})")
    table = _gelu_table(m)

    def emit(b, x, u):
        idx = b.zext(b.bitcast(b.fptrunc(x, ir.HalfType()), ir.IntType(16)), i64)
        h = b.load(b.gep(b.bitcast(table, ir.IntType(16).as_pointer()), [idx]))
        t = b.fpext(b.bitcast(h, ir.HalfType()), f32)
        y = b.fmul(b.select(b.fcmp_ordered(">=", x, f32(10.0)), x, t), u)
        return b.select(b.fcmp_ordered("<=", x, f32(-10.0)), f32(0.0), y)
    return _elementwise(m, n, 2, emit)


@kernel(Op.SCALE, order=SCALE)
def define_scale(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """ggml_vec_scale_f32: r(x*s)."""
    if n.order != SCALE:
        raise LoweringError(f"llvm backend: scale lowers only {SCALE.describe()!r} ({n.name or n.id})")
    s = f32(float(n.params["scale"]))
    return _elementwise(m, n, 1, lambda b, x: b.fmul(x, s))


# ---- SIGMOID and SOFTPLUS (ggml-cpu/unary-ops.cpp, glibc's expf and logf as the haswell build calls them) ----

def _libm(b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    return b.call(intrinsic(b.module, name, f32, [f32]), [x])


@kernel(Op.SIGMOID, order=SIGMOID)
def define_sigmoid(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """op_sigmoid: r(1 / r(1 + expf(-x)))."""
    if n.order != SIGMOID:
        raise LoweringError(f"llvm backend: sigmoid lowers only {SIGMOID.describe()!r} ({n.name or n.id})")
    return _elementwise(m, n, 1, lambda b, x: b.fdiv(f32(1.0), b.fadd(f32(1.0), _libm(b, "expf", b.fneg(x)))))


@kernel(Op.SOFTPLUS, order=SOFTPLUS)
def define_softplus(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """op_softplus: x > 20 ? x : logf(r(1 + expf(x)))."""
    if n.order != SOFTPLUS:
        raise LoweringError(f"llvm backend: softplus lowers only {SOFTPLUS.describe()!r} ({n.name or n.id})")

    def emit(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        y = _libm(b, "logf", b.fadd(f32(1.0), _libm(b, "expf", x)))
        return b.select(b.fcmp_ordered(">", x, f32(20.0)), x, y)
    return _elementwise(m, n, 1, emit)
