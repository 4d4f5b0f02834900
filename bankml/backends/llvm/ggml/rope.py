"""ROPE kernel (GGML_MAP §4): the cos/sin cache per token, then the rotation, with the bits of
bankml/backends/reference/rope.py (rope_cache, rope).

Inputs x f32 [T, n_head, head_dim] and pos i32 [T]; out f32 like x. Tokens are split over
threads; each computes its tokens' cache on the stack exactly as ggml_rope_cache_init does:
    theta_scale = powf(freq_base, -2/n_dims)                       # glibc powf, once per call
    theta = (float)p; per pair k: ti = r(freq_scale*theta)
        YaRN (ext_factor != 0): mix = r(ramp(k)*ext_factor); ti = fma(ti, r(1-mix), r(theta*mix))
        sincosf(ti); cos = r(c*mscale); sin = r(s*mscale); theta = r(theta*theta_scale)
with ggml_rope_yarn_corr_dims (glibc logf, floor/ceil) and mscale = r(attn_factor * fma(0.1,
logf(r(1/freq_scale)), 1)) computed by glibc calls in the kernel too. Rotation (rotate_pairs):
    y0 = fma(x0, cos, -r(x1*sin)),  y1 = fma(x0, sin, r(x1*cos))
except a last odd pair in NORM mode: y0 = r(r(x0*cos) - r(x1*sin)), y1 = r(r(x0*sin) + r(x1*cos)).
NEOX pairs (k, k + n_dims/2), NORM pairs (2k, 2k+1); dims past n_dims are copied.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.emit.core import (dim, f32, fma, for_range, i32, i64, intrinsic, new_function, opaque,
    thread_range, typed, void)
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import ROPE

f32p = f32.as_pointer()


def _c(x) -> ir.Constant:
    """An f32 constant from a value already representable in f32."""
    return f32(float(np.float32(x)))


def _gt_select(b, x, y):
    """Python's max(y, x) on f32: x if x > y else y (as the reference's max(f32(0), v))."""
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _lt_select(b, x, y):
    """Python's min(y, x): x if x < y else y."""
    return b.select(b.fcmp_ordered("<", x, y), x, y)


def _corr_dims(b, m, p):
    """ggml_rope_yarn_corr_dims as reference rope.yarn_corr_dims: (lo, hi) f32 values."""
    logf = intrinsic(m, "logf", f32, [f32])
    log_base2 = b.fmul(b.call(logf, [_c(p["freq_base"])]), _c(2.0))

    def corr_dim(n_rot: float):
        nr = np.float32(n_rot)
        denom = np.float32(np.float32(nr + nr) * np.float32(math.pi))         # constant, plain f32 ops
        lg = b.call(logf, [_c(np.float32(p["n_ctx_orig"]) / denom)])
        return b.fdiv(b.fmul(_c(p["n_dims"]), lg), log_base2)

    floor = intrinsic(m, "llvm.floor.f32", f32, [f32])
    ceil = intrinsic(m, "llvm.ceil.f32", f32, [f32])
    lo = _gt_select(b, b.call(floor, [corr_dim(p["beta_fast"])]), _c(0.0))
    hi = _lt_select(b, b.call(ceil, [corr_dim(p["beta_slow"])]), _c(p["n_dims"] - 1))
    return lo, hi


@kernel(Op.ROPE, order=ROPE)
def define_rope(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    p = n.params
    if n.order != ROPE or p["mode"] not in ("norm", "neox") or p.get("freq_factors") is not None:
        raise LoweringError(f"llvm backend: rope lowers {ROPE.describe()!r} in norm/neox mode without "
                            f"freq_factors, not {n.order.describe() if n.order else None!r} mode "
                            f"{p['mode']!r} ({n.name or n.id})")
    name = kernel_name(n)
    T, H, hd = n.shape
    n_dims, half = p["n_dims"], p["n_dims"] // 2
    neox = p["mode"] == "neox"
    ext = np.float32(p["ext_factor"]) != 0
    fn, b = new_function(m, name, kernel_type(n))
    out, src, pos, ith, nth, dims = fn.args
    T = dim(b, dims, T)
    px, py, pp = typed(b, src, f32), typed(b, out, f32), typed(b, pos, i32)
    sincosf = intrinsic(m, "sincosf", void, [f32, f32p, f32p])
    powf = intrinsic(m, "powf", f32, [f32, f32])

    cos_c = b.alloca(f32, size=i64(half), name="cos")
    sin_c = b.alloca(f32, size=i64(half), name="sin")
    sv, cv = b.alloca(f32, name="sincos.s"), b.alloca(f32, name="sincos.c")
    theta_p = b.alloca(f32, name="theta")

    theta_scale = b.call(powf, [_c(p["freq_base"]), _c(np.float32(-2.0) / np.float32(n_dims))], name="theta_scale")
    freq_scale, ext_factor = _c(p["freq_scale"]), _c(p["ext_factor"])
    mscale = _c(p["attn_factor"])
    if ext:
        lo, hi = _corr_dims(b, m, p)
        span = _gt_select(b, b.fsub(hi, lo), _c(0.001))
        log_scale = b.call(intrinsic(m, "logf", f32, [f32]), [_c(np.float32(1) / np.float32(p["freq_scale"]))])
        mscale = b.fmul(mscale, fma(b, _c(0.1), log_scale, _c(1.0)), name="mscale")

    t_lo, t_hi = thread_range(b, T, ith, nth)
    with for_range(b, t_lo, t_hi, name="t") as t:
        b.store(b.sitofp(b.load(b.gep(pp, [t])), f32), theta_p)
        with for_range(b, 0, half, name="k") as k:                      # ggml_rope_cache_init
            te = b.load(theta_p)
            ti = b.fmul(freq_scale, te)
            if ext:
                y = b.fdiv(b.fsub(b.sitofp(k, f32), lo), span)
                ramp = b.fsub(_c(1.0), _lt_select(b, _gt_select(b, y, _c(0.0)), _c(1.0)))
                mix = b.fmul(ramp, ext_factor)
                ti = fma(b, ti, b.fsub(_c(1.0), mix), b.fmul(te, mix))
            b.call(sincosf, [ti, sv, cv])
            b.store(b.fmul(b.load(cv), mscale), b.gep(cos_c, [k]))
            b.store(b.fmul(b.load(sv), mscale), b.gep(sin_c, [k]))
            b.store(b.fmul(te, theta_scale), theta_p)
        with for_range(b, 0, opaque(b, i64(H)), name="h") as h:   # not unrolled: SmolLM2's 9 heads
            base = b.mul(b.add(b.mul(t, i64(H)), h), i64(hd))      # compiled in 0.14 s unrolled, 0.03 s not
            with for_range(b, 0, half, name="k") as k:                  # rotate_pairs
                if neox:
                    i0, i1 = b.add(base, k), b.add(base, b.add(k, i64(half)))
                else:
                    i0 = b.add(base, b.mul(k, i64(2)))
                    i1 = b.add(i0, i64(1))
                x0, x1 = b.load(b.gep(px, [i0])), b.load(b.gep(px, [i1]))
                c, s = b.load(b.gep(cos_c, [k])), b.load(b.gep(sin_c, [k]))
                y0 = fma(b, x0, c, b.fneg(b.fmul(x1, s)))
                y1 = fma(b, x0, s, b.fmul(x1, c))
                if not neox and half % 2 == 1:                             # the last pair: no FMA
                    last = b.icmp_signed("==", k, i64(half - 1))
                    y0 = b.select(last, b.fsub(b.fmul(x0, c), b.fmul(x1, s)), y0)
                    y1 = b.select(last, b.fadd(b.fmul(x0, s), b.fmul(x1, c)), y1)
                b.store(y0, b.gep(py, [i0]))
                b.store(y1, b.gep(py, [i1]))
            if n_dims < hd:
                with for_range(b, n_dims, hd, name="d") as d:
                    at = b.add(base, d)
                    b.store(b.load(b.gep(px, [at])), b.gep(py, [at]))
    b.ret_void()
    return fn
