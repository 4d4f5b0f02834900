"""SWIGLU kernel, and ggml_v_expf emitted in LLVM IR (GGML_MAP §7).

ggml-cpu/vec.cpp:ggml_vec_swiglu_f32 per row of n = gate.shape[-1], as the reference backend
(bankml/backends/reference/glu.py) spells it:
    8-lane chunks:   y = r( r(g / r(1 + ggml_v_expf(r(0 - g)))) * u )
    the n%8 tail:    y = r( r(g / r(1 + expf(-g))) * u )              # glibc expf
`v_expf` below is ggml_v_expf(__m256) (ggml-cpu/vec.h, AVX2+FMA branch) on <8 x float>, every
fmadd/fnmadd one llvm.fma, as bankml/expf.py, with ggml's `any lane |n| > 126` branch
(`v_expf_branch`); the flash-attention tiled kernel takes its halves (v_expf_fast,
v_expf_scaled) to branch once for a row of eight vectors.
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.common import f32, fma, for_range, i8, i32, i64, intrinsic, new_function, size, \
    thread_range, typed, v8f32
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


def v_expf_fast(b: ir.IRBuilder, x: ir.Value):
    """ggml_v_expf up to its branch: (y = fma(j, k, k), the `|n| > 126` lanes c, and what the
    scaled path needs: n, e = z << 23, j)."""
    R = splat(_c("0x1.8p23"))
    z = fma(b, x, splat(_c("0x1.715476p+0")), R)                                # fmadd(x, log2e, r)
    n = b.fsub(z, R, name="n")
    nn = b.fsub(splat(-0.0), n)                                                 # -n (fnmadd negates n*c)
    bb = fma(b, nn, splat(_c("0x1.7f7d1cp-20")), fma(b, nn, splat(_c("0x1.62e4p-1")), x))
    e = b.shl(b.bitcast(z, v8i32), splat(23, v8i32))
    k = b.bitcast(b.add(e, splat(0x3F800000, v8i32)), v8f32)
    absn = b.call(intrinsic(b.module, "llvm.fabs.v8f32", v8f32, [v8f32]), [n])
    c = b.fcmp_ordered(">", absn, splat(126.0))
    u = b.fmul(bb, bb)
    j = fma(b, fma(b, fma(b, splat(_c("0x1.0e4020p-7")), bb, splat(_c("0x1.573e2ep-5"))), u,
                   fma(b, splat(_c("0x1.555e66p-3")), bb, splat(_c("0x1.fffdb6p-2")))),
            u, b.fmul(splat(_c("0x1.ffffecp-1")), bb))
    return fma(b, j, k, k), c, (n, absn, e, j)


def v_expf_scaled(b: ir.IRBuilder, y: ir.Value, c: ir.Value, parts) -> ir.Value:
    """ggml_v_expf's scaled path: |n| > 192: s1*s1, else |n| > 126: (s2 + s2*j)*s1, else y.
    s1 is 2^127 or 2^-125, so s1*s1 is +inf (n > 0) or +0 (n <= 0): selected, not multiplied.
    The big product takes s1 = s2 = 1 in the lanes that do not use it, so no unselected lane
    underflows (an underflowing vector op costs a microcode assist on this machine: tens of cycles)."""
    n, absn, e, j = parts
    neg = b.fcmp_ordered("<=", n, splat(0.0))                                   # _CMP_LE_OQ
    g = b.select(neg, splat(0x82000000 - (1 << 32), v8i32), splat(0, v8i32))
    d = b.fcmp_ordered(">", absn, splat(192.0))
    used = b.and_(c, b.xor(d, ir.Constant(d.type, [1] * 8)))                   # lanes that take big
    s1 = b.select(used, b.bitcast(b.add(g, splat(0x7F000000, v8i32)), v8f32), splat(1.0))
    s2 = b.select(used, b.bitcast(b.sub(e, g), v8f32), splat(1.0))
    big = b.fmul(fma(b, s2, j, s2), s1)
    huge = b.select(neg, splat(0.0), splat(float("inf")))
    return b.select(d, huge, b.select(c, big, y), name="vexpf")


def v_expf_branch(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """ggml_v_expf on <8 x float>, bit for bit (bankml/expf.py), with ggml's branch: the scaled
    path only when some lane has |n| > 126."""
    y, c, parts = v_expf_fast(b, x)
    any_c = b.icmp_unsigned("!=", b.bitcast(c, ir.IntType(8)), ir.IntType(8)(0))
    fast_block = b.block
    with b.if_then(any_c, likely=False):
        scaled = v_expf_scaled(b, y, c, parts)
        scaled_block = b.block
    out = b.phi(v8f32, name="vexpf")
    out.add_incoming(y, fast_block)
    out.add_incoming(scaled, scaled_block)
    return out


def _swiglu_elem(b: ir.IRBuilder, g: ir.Value, u: ir.Value) -> ir.Value:
    """The scalar tail: r(r(g / r(1 + expf(-g))) * u), glibc expf."""
    e = b.call(intrinsic(b.module, "expf", f32, [f32]), [b.fneg(g)])
    return b.fmul(b.fdiv(g, b.fadd(f32(1.0), e)), u)


def _swiglu_vec(b: ir.IRBuilder, g: ir.Value, u: ir.Value) -> ir.Value:
    e = v_expf_branch(b, b.fsub(splat(0.0), g))                                         # _mm256_sub_ps(zero, x)
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
    """ggml_table_gelu_f16 (bankml/gelu.py) as a constant of the module, once: its 65,536 f16
    bit patterns as one little-endian byte string (an IR array of 65,536 i16 constants took
    0.2 s to build and print per kernel, and as long again to free)."""
    name = "ggml_table_gelu_f16"
    if name in m.globals:
        return m.globals[name]
    from bankml.gelu import gelu_table_f16
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


@kernel(Op.GEGLU)
def define_geglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16): x <= -10: 0; x >= 10: r(x*u);
    else r(f32(table[f16(x)]) * u), as bankml/gelu.py."""
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


@kernel(Op.SCALE)
def define_scale(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """ggml_vec_scale_f32: r(x*s)."""
    if n.order != SCALE:
        raise LoweringError(f"llvm backend: scale lowers only {SCALE.describe()!r} ({n.name or n.id})")
    s = f32(float(n.params["scale"]))
    return _elementwise(m, n, 1, lambda b, x: b.fmul(x, s))
