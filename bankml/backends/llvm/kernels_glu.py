"""SWIGLU kernel, and ggml_v_expf emitted in LLVM IR (GGML_MAP §7).

ggml-cpu/vec.cpp:ggml_vec_swiglu_f32 per row of n = gate.shape[-1], as the reference backend
(bankml/backends/reference/glu.py) spells it:
    8-lane chunks:   y = r( r(g / r(1 + ggml_v_expf(r(0 - g)))) * u )
    the n%8 tail:    y = r( r(g / r(1 + expf(-g))) * u )              # glibc expf
`v_expf` below is ggml_v_expf(__m256) (ggml-cpu/vec.h, AVX2+FMA branch) on <8 x float>, every
fmadd/fnmadd one llvm.fma, as bankml/expf.py; the `any lane |n| > 126` branch of ggml is a
lane-wise select here (lanes are independent, so the bits are the same). The flash-attention
tiled kernel imports it.
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.common import f32, fma, for_range, i32, i64, intrinsic, new_function, size, thread_range, typed, v8f32
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import GEGLU, SCALE, SWIGLU

v8i32 = ir.VectorType(i32, 8)


def _c(hexfloat: str) -> float:
    return float.fromhex(hexfloat)


def splat(x, t: ir.Type = v8f32) -> ir.Constant:
    return ir.Constant(t, [x] * t.count)


def broadcast(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A scalar f32 in all 8 lanes."""
    v = b.insert_element(ir.Constant(v8f32, ir.Undefined), x, i32(0))
    return b.shuffle_vector(v, ir.Constant(v8f32, ir.Undefined), ir.Constant(v8i32, [0] * 8))


def v_expf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """ggml_v_expf on <8 x float>, bit for bit (bankml/expf.py)."""
    bits = lambda v: b.bitcast(v, v8i32)                                        # noqa: E731
    flt = lambda v: b.bitcast(v, v8f32)                                         # noqa: E731
    R = splat(_c("0x1.8p23"))
    z = fma(b, x, splat(_c("0x1.715476p+0")), R)                                # fmadd(x, log2e, r)
    n = b.fsub(z, R, name="n")
    nn = b.fsub(splat(-0.0), n)                                                 # -n (fnmadd negates n*c)
    bb = fma(b, nn, splat(_c("0x1.7f7d1cp-20")), fma(b, nn, splat(_c("0x1.62e4p-1")), x))
    e = b.shl(bits(z), splat(23, v8i32))
    k = flt(b.add(e, splat(0x3F800000, v8i32)))
    absn = b.call(intrinsic(b.module, "llvm.fabs.v8f32", v8f32, [v8f32]), [n])
    c = b.fcmp_ordered(">", absn, splat(126.0))
    u = b.fmul(bb, bb)
    j = fma(b, fma(b, fma(b, splat(_c("0x1.0e4020p-7")), bb, splat(_c("0x1.573e2ep-5"))), u,
                   fma(b, splat(_c("0x1.555e66p-3")), bb, splat(_c("0x1.fffdb6p-2")))),
            u, b.fmul(splat(_c("0x1.ffffecp-1")), bb))
    y = fma(b, j, k, k)
    g = b.select(b.fcmp_ordered("<=", n, splat(0.0)), splat(0x82000000 - (1 << 32), v8i32), splat(0, v8i32))
    s1 = flt(b.add(g, splat(0x7F000000, v8i32)))
    s2 = flt(b.sub(e, g))
    d = b.fcmp_ordered(">", absn, splat(192.0))
    big = b.fmul(fma(b, s2, j, s2), s1)
    huge = b.fmul(s1, s1)
    return b.select(d, huge, b.select(c, big, y), name="vexpf")


def _swiglu_elem(b: ir.IRBuilder, g: ir.Value, u: ir.Value) -> ir.Value:
    """The scalar tail: r(r(g / r(1 + expf(-g))) * u), glibc expf."""
    e = b.call(intrinsic(b.module, "expf", f32, [f32]), [b.fneg(g)])
    return b.fmul(b.fdiv(g, b.fadd(f32(1.0), e)), u)


def _swiglu_vec(b: ir.IRBuilder, g: ir.Value, u: ir.Value) -> ir.Value:
    e = v_expf(b, b.fsub(splat(0.0), g))                                         # _mm256_sub_ps(zero, x)
    return b.fmul(b.fdiv(g, b.fadd(splat(1.0), e)), u)


@kernel(Op.SWIGLU)
def define_swiglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order != SWIGLU:
        raise LoweringError(f"llvm backend: swiglu lowers only {SWIGLU.describe()!r}, not "
                            f"{n.order.describe() if n.order else None!r} ({n.name or n.id})")
    name = kernel_name(n)
    fn, b = new_function(m, name, kernel_type(n))
    out, gate, up, ith, nth, dims = fn.args
    po, pg, pu = typed(b, out, f32), typed(b, gate, f32), typed(b, up, f32)
    width = n.shape[-1]
    rows = size(b, dims, n.shape[:-1])
    body, tail = width - width % 8, width % 8

    def chunk(off):                                    # 8 lanes at flat offset off
        vp = lambda p: b.bitcast(b.gep(p, [off]), v8f32.as_pointer())         # noqa: E731
        y = _swiglu_vec(b, b.load(vp(pg), align=4), b.load(vp(pu), align=4))
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
                y = _swiglu_elem(b, b.load(b.gep(pg, [off])), b.load(b.gep(pu, [off])))
                b.store(y, b.gep(po, [off]))
    b.ret_void()
    return fn


# ---- GEGLU (ggml's GELU f16 table) and SCALE -----------------------------------------------

def _gelu_table(m: ir.Module) -> ir.GlobalVariable:
    """ggml_table_gelu_f16 (bankml/gelu.py) as a constant [65536 x i16] of the module, once."""
    name = "ggml_table_gelu_f16"
    if name in m.globals:
        return m.globals[name]
    from bankml.gelu import gelu_table_f16
    t = ir.ArrayType(ir.IntType(16), 1 << 16)
    gv = ir.GlobalVariable(m, t, name=name)
    gv.global_constant, gv.linkage = True, "internal"
    gv.initializer = ir.Constant(t, [int(v) for v in gelu_table_f16().view("uint16")])
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


@kernel(Op.GEGLU)
def define_geglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16): x <= -10: 0; x >= 10: r(x*u);
    else r(f32(table[f16(x)]) * u), as bankml/gelu.py."""
    if n.order != GEGLU:
        raise LoweringError(f"llvm backend: geglu lowers only {GEGLU.describe()!r} ({n.name or n.id})")
    table = _gelu_table(m)

    def emit(b, x, u):
        idx = b.zext(b.bitcast(b.fptrunc(x, ir.HalfType()), ir.IntType(16)), i64)
        h = b.load(b.gep(table, [i64(0), idx]))
        t = b.fpext(b.bitcast(h, ir.HalfType()), f32)
        y = b.fmul(b.select(b.fcmp_ordered(">=", x, f32(10.0)), x, t), u)
        return b.select(b.fcmp_ordered("<=", x, f32(-10.0)), f32(0.0), y)
    return _elementwise(m, n, 2, emit)


@kernel(Op.SCALE)
def define_scale(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """ggml_vec_scale_f32: r(x*s)."""
    if n.order != SCALE:
        raise LoweringError(f"llvm backend: scale lowers only {SCALE.describe()!r} ({n.name or n.id})")
    s = f32(float(n.params["scale"]))
    return _elementwise(m, n, 1, lambda b, x: b.fmul(x, s))
