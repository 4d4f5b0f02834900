"""ggml_v_expf (ggml-cpu/vec.h, AVX2) in LLVM: its fast half for every lane, the scaled half
for lanes whose exponent leaves the fast range, and the branch ggml takes between them."""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import fma, intrinsic, v8f32
from bankml.backends.llvm.emit.simd import const_vec, v8i32


def _c(hexfloat: str) -> float:
    return float.fromhex(hexfloat)


def v_expf_fast(b: ir.IRBuilder, x: ir.Value):
    """ggml_v_expf up to its branch: (y = fma(j, k, k), the `|n| > 126` lanes c, and what the
    scaled path needs: n, e = z << 23, j)."""
    R = const_vec(_c("0x1.8p23"))
    z = fma(b, x, const_vec(_c("0x1.715476p+0")), R)                                # fmadd(x, log2e, r)
    n = b.fsub(z, R, name="n")
    nn = b.fsub(const_vec(-0.0), n)                                                 # -n (fnmadd negates n*c)
    bb = fma(b, nn, const_vec(_c("0x1.7f7d1cp-20")), fma(b, nn, const_vec(_c("0x1.62e4p-1")), x))
    e = b.shl(b.bitcast(z, v8i32), const_vec(23, v8i32))
    k = b.bitcast(b.add(e, const_vec(0x3F800000, v8i32)), v8f32)
    absn = b.call(intrinsic(b.module, "llvm.fabs.v8f32", v8f32, [v8f32]), [n])
    c = b.fcmp_ordered(">", absn, const_vec(126.0))
    u = b.fmul(bb, bb)
    j = fma(b, fma(b, fma(b, const_vec(_c("0x1.0e4020p-7")), bb, const_vec(_c("0x1.573e2ep-5"))), u,
                   fma(b, const_vec(_c("0x1.555e66p-3")), bb, const_vec(_c("0x1.fffdb6p-2")))),
            u, b.fmul(const_vec(_c("0x1.ffffecp-1")), bb))
    return fma(b, j, k, k), c, (n, absn, e, j)


def v_expf_scaled(b: ir.IRBuilder, y: ir.Value, c: ir.Value, parts) -> ir.Value:
    """ggml_v_expf's scaled path: |n| > 192: s1*s1, else |n| > 126: (s2 + s2*j)*s1, else y.
    s1 is 2^127 or 2^-125, so s1*s1 is +inf (n > 0) or +0 (n <= 0): selected, not multiplied.
    The big product takes s1 = s2 = 1 in the lanes that do not use it, so no unselected lane
    underflows (an underflowing vector op costs a microcode assist on this machine: tens of cycles)."""
    n, absn, e, j = parts
    neg = b.fcmp_ordered("<=", n, const_vec(0.0))                                   # _CMP_LE_OQ
    g = b.select(neg, const_vec(0x82000000 - (1 << 32), v8i32), const_vec(0, v8i32))
    d = b.fcmp_ordered(">", absn, const_vec(192.0))
    used = b.and_(c, b.xor(d, ir.Constant(d.type, [1] * 8)))                   # lanes that take big
    s1 = b.select(used, b.bitcast(b.add(g, const_vec(0x7F000000, v8i32)), v8f32), const_vec(1.0))
    s2 = b.select(used, b.bitcast(b.sub(e, g), v8f32), const_vec(1.0))
    big = b.fmul(fma(b, s2, j, s2), s1)
    huge = b.select(neg, const_vec(0.0), const_vec(float("inf")))
    return b.select(d, huge, b.select(c, big, y), name="vexpf")


def v_expf_branch(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """ggml_v_expf on <8 x float>, bit for bit (bankml/numerics/expf.py), with ggml's branch: the scaled
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
