"""The llvm kernels of the portable profile (docs/PORTABLE.md) except its mat-mul side
(QUANTIZE, GET_ROWS: kernels_portable_rows.py; MUL_MAT: kernels_portable_matmul.py). Each
repeats the numpy spec of bankml/profiles/portable/ step for step with the emitters of
portable_math.py, so its bits are the reference backend's (backends/reference/portable.py) for
every thread count:

- RMS_NORM  funcs.rmsnorm without w: x * rsqrt(fold_sum(x*x) * r(1/n) + eps) (the weight is a MUL)
- ADD, MUL  arith.add / arith.mul, an operand of fewer dims broadcast over the leading ones
- SWIGLU    mul(silu(gate), up)
- ROPE      rope.rope_table (the fraction of a turn from integer arithmetic on t_i's bits) and
            rope.rope, pairs (2i, 2i+1) in mode norm, (i, i + n/2) in mode neox; YaRN refused
- SET_ROWS  attention.quantize_rows into the int8 cache rows (f16 scale, then int8 codes)
- FLASH_ATTN attention.attention per (query row, head) (K/V head h // (H/Hkv)): q quantized per
            32 as quant.quantize_act (32 lanes), each score the exact integer dot of the codes times both
            scales rounded once: eight cells at a time in f64 (_scores8: vpmaddubsw dots, exact
            products and sums while the q blocks' exponent spread is within portable_f64.limit,
            one f64 -> f32 conversion), else (spread past the limit, a nonzero score below
            2^-126 or from 2^127 up) per cell portable_exact.round_shifted (_exact_score, the
            alignment made once per q row); scale and mask on 8 lanes; softmax over the n_kv
            cells in a stack buffer, then per block of 32 cells the power-of-two scale, exact
            int32 sums and one rounding, blocks added in cell order (a block whose weights are all 0 adds -0.0: skipped)

Threads split rows (RMS_NORM), chunks of 8 values (ADD, MUL, SWIGLU), tokens (ROPE),
(token, K/V head) rows (SET_ROWS) or (query row, head) pairs (FLASH_ATTN); no result depends
on the split.

The K/V cache of a layer is the session's array of rows of attention.cache_dtype(D): per
(cell, K/V head) 2 bytes of f16 scale, then D int8 codes (2 + D bytes, packed).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import portable_f64 as pf
from bankml.backends.llvm import portable_math as pm
from bankml.backends.llvm.kernels_matmul import psign, sums_us8
from bankml.backends.llvm.kernels_portable_rows import lane_sums
from bankml.backends.llvm.portable_exact import room, round_shifted
from bankml.backends.llvm.common import (dim, f16, f32, f64, for_range, i1, i8, i16, i32, i64, intrinsic,
                                         new_function, size, thread_range, typed, v8f32)
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import Dim
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.profiles.portable import tables
from bankml.profiles.portable.quant import QK

v8i32 = ir.VectorType(i32, 8)
NEG0 = -0.0


def _check(n: Node, order) -> None:
    if n.order != order:
        got = n.order.describe() if n.order else "no order"
        raise LoweringError(f"llvm portable profile: {n.op.value} {n.name or n.id} carries {got}, not {order.kernel}")


def _vload(b: ir.IRBuilder, p, at, t: ir.Type = v8f32) -> ir.Value:
    return b.load(b.bitcast(b.gep(p, [at]), t.as_pointer()), align=1)


def _vstore(b: ir.IRBuilder, x, p, at) -> None:
    b.store(x, b.bitcast(b.gep(p, [at]), x.type.as_pointer()), align=1)


def _load(b: ir.IRBuilder, p, at, t: ir.Type = f32) -> ir.Value:
    """A canonical f32 (scalar or 8 lanes) read from a float buffer."""
    return pm.canon(b, _vload(b, p, at, t) if t != f32 else b.load(b.gep(p, [at])))


# ---------------------------------------------------------------- RMS_NORM

@kernel(Op.RMS_NORM, profile="portable")
def define_rms_norm(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.RMS_NORM)
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, src, ith, nth, dims = fn.args
    px, py = typed(b, src, f32), typed(b, out, f32)
    k = n.shape[-1]
    body = k - k % 8
    rows = size(b, dims, n.shape[:-1])
    inv_n, eps = f32(float(np.float32(1.0 / k))), f32(float(np.float32(n.params["eps"])))
    acc = b.alloca(v8f32, name="lanes")
    lo, hi = thread_range(b, rows, ith, nth)
    with for_range(b, lo, hi, name="row") as r:
        base = b.mul(r, i64(k))
        b.store(pm.const(v8f32, NEG0), acc)
        with for_range(b, 0, body, 8, name="i") as i:
            x = _load(b, px, b.add(base, i), v8f32)
            b.store(pm.add(b, b.load(acc), pm.mul(b, x, x)), acc)
        lanes = b.load(acc)
        for t in range(k % 8):                   # the tail: lane t adds element body + t
            x = _load(b, px, b.add(base, i64(body + t)))
            lane = b.extract_element(lanes, i32(t))
            lanes = b.insert_element(lanes, pm.add(b, lane, pm.mul(b, x, x)), i32(t))
        v = pm.add(b, pm.mul(b, pm.tree(b, lanes), inv_n), eps)
        s = pm.rsqrt(b, v)
        sv = pm.splat(b, s, v8f32)
        with for_range(b, 0, body, 8, name="j") as j:
            at = b.add(base, j)
            _vstore(b, pm.mul(b, _load(b, px, at, v8f32), sv), py, at)
        for t in range(body, k):
            at = b.add(base, i64(t))
            b.store(pm.mul(b, _load(b, px, at), s), b.gep(py, [at]))
    b.ret_void()
    return fn


# ---------------------------------------------------------------- ADD, MUL, SWIGLU

def _period(g: Graph, n: Node, i: int):
    """How input i is indexed by the output's flat index: None (the same index) or P (index
    mod P: its shape is the output's trailing dims, leading 1s aside)."""
    s = tuple(g[n.inputs[i]].shape)
    if s == tuple(n.shape):
        return None
    while s and s[0] == 1:
        s = s[1:]
    if any(isinstance(d, Dim) for d in s) or tuple(n.shape[len(n.shape) - len(s):]) != s:
        raise LoweringError(f"llvm portable profile: {n.op.value} {n.name or n.id} broadcasts "
                            f"{g[n.inputs[i]].shape} over {n.shape} (only trailing dims)")
    return math.prod(s)


def _elementwise(m: ir.Module, g: Graph, n: Node, step) -> ir.Function:
    """out[i] = step(a[i'], b[i'']) over the flat output, 8 lanes at a time where every
    operand's period allows, split over threads in chunks of 8."""
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, pa, pb, ith, nth, dims = fn.args
    po_, srcs = typed(b, out, f32), [typed(b, pa, f32), typed(b, pb, f32)]
    periods = [_period(g, n, 0), _period(g, n, 1)]
    total = size(b, dims, n.shape)
    vec = all(p is None or p % 8 == 0 for p in periods) and not (isinstance(n.shape[-1], int) and n.shape[-1] % 8)
    step_n = 8 if vec else 1
    t = v8f32 if vec else f32
    chunks = b.sdiv(b.add(total, i64(step_n - 1)), i64(step_n))
    lo, hi = thread_range(b, chunks, ith, nth)
    with for_range(b, lo, hi, name="c") as c:
        at = b.mul(c, i64(step_n))
        args = [_load(b, p, at if per is None else b.srem(at, i64(per)), t) for p, per in zip(srcs, periods)]
        y = step(b, *args)
        if vec:
            _vstore(b, y, po_, at)
        else:
            b.store(y, b.gep(po_, [at]))
    b.ret_void()
    return fn


@kernel(Op.ADD, profile="portable")
def define_add(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.ELEMENTWISE)
    return _elementwise(m, g, n, pm.add)


@kernel(Op.MUL, profile="portable")
def define_mul(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.ELEMENTWISE)
    return _elementwise(m, g, n, pm.mul)


@kernel(Op.SWIGLU, profile="portable")
def define_swiglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SWIGLU)
    if any(g[i].shape != n.shape for i in n.inputs):
        raise LoweringError(f"llvm portable profile: swiglu {n.name or n.id} needs gate and up of its shape")
    return _elementwise(m, g, n, lambda b, gate, up: pm.mul(b, pm.silu(b, gate), up))


# ---------------------------------------------------------------- ROPE

def _rope_cos_sin(b: ir.IRBuilder, pos: ir.Value, sig: ir.Value, s: ir.Value, C, S):
    """rope.rope_table at one position (i64) for one pair: t = sig * 2^-s turns (i64 sig, s)."""
    c = tables.constants()
    prod = b.mul(pos, sig)                                                        # < 2^41
    sm = b.select(b.icmp_signed("<", s, i64(62)), s, i64(62))
    frac = b.and_(prod, b.sub(b.shl(i64(1), sm), i64(1)))
    shift = b.sub(s, i64(8))
    shift = b.select(b.icmp_signed("<", shift, i64(62)), shift, i64(62))
    j = b.ashr(frac, shift)
    rest = b.sub(frac, b.shl(j, shift))
    scale = b.bitcast(b.shl(b.sub(i64(1023), s), i64(52)), f64)                  # 2^-s
    d = pm.canon(b, b.fptrunc(b.fmul(b.fpext(b.sitofp(rest, f32), f64), scale), f32))
    rho = pm.mul(b, d, f32(float(c["TWO_PI"])))
    r2 = pm.mul(b, rho, rho)
    sin_r = pm.sub(b, rho, pm.mul(b, pm.mul(b, r2, f32(float(c["SIXTH"]))), rho))
    cos_r = pm.sub(b, f32(1.0), pm.mul(b, r2, pm.sub(b, f32(0.5), pm.mul(b, r2, f32(float(c["TWENTYFOURTH"]))))))
    jj = b.trunc(b.and_(j, i64(tables.SINCOS_N - 1)), i32)
    cj, sj = pm.lookup(b, C, jj), pm.lookup(b, S, jj)
    cos = pm.sub(b, pm.mul(b, cj, cos_r), pm.mul(b, sj, sin_r))
    sin = pm.add(b, pm.mul(b, sj, cos_r), pm.mul(b, cj, sin_r))
    return cos, sin


@kernel(Op.ROPE, profile="portable")
def define_rope(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.ROPE)
    p = n.params
    if p["ext_factor"] != 0 or p["attn_factor"] != 1:
        raise LoweringError(f"portable profile: rope {n.name or n.id} with YaRN scaling is not defined")
    T, H, hd = n.shape
    if p["mode"] not in ("norm", "neox") or p["n_dims"] != hd or p.get("freq_factors") is not None:
        raise LoweringError(f"llvm portable profile: rope {n.name or n.id} mode {p['mode']!r} n_dims {p['n_dims']} "
                            f"over head dim {hd} (norm/neox over the whole head only)")
    half = hd // 2
    turns = tables.rope_turns(hd, float(p["freq_base"]), float(p["freq_scale"]))
    e = (turns.view(np.uint32) >> 23).astype(np.int64) & 0xFF
    sig = np.where(e == 0, 0, (turns.view(np.uint32) & 0x7FFFFF).astype(np.int64) | 0x800000)
    tag = f"{p['freq_base']!r}_{p['freq_scale']!r}_{hd}".replace(".", "p").replace("-", "m").replace("+", "")
    g_sig = pm.table(m, f"portable_rope_sig_{tag}", sig.astype(np.int64))
    g_s = pm.table(m, f"portable_rope_s_{tag}", (150 - e).astype(np.int64))
    cs, sn = tables.sincos_table()
    C, S = pm.table(m, "portable_cos256", cs), pm.table(m, "portable_sin256", sn)
    neox = p["mode"] == "neox"

    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, src, posp, ith, nth, dims = fn.args
    px, py, pp = typed(b, src, f32), typed(b, out, f32), typed(b, posp, i32)
    cos_t = b.alloca(f32, size=half, name="cos")
    sin_t = b.alloca(f32, size=half, name="sin")
    lo, hi = thread_range(b, dim(b, dims, T), ith, nth)
    with for_range(b, lo, hi, name="t") as t:
        pos = b.sext(b.load(b.gep(pp, [t])), i64)
        with for_range(b, 0, half, name="i") as i:
            cos, sin = _rope_cos_sin(b, pos, b.load(b.gep(g_sig, [i32(0), i])), b.load(b.gep(g_s, [i32(0), i])), C, S)
            b.store(cos, b.gep(cos_t, [i]))
            b.store(sin, b.gep(sin_t, [i]))
        with for_range(b, 0, H, name="h") as h:
            base = b.mul(b.add(b.mul(t, i64(H)), h), i64(hd))
            with for_range(b, 0, half, name="k") as k:
                i0 = b.add(base, k if neox else b.mul(k, i64(2)))
                i1 = b.add(i0, i64(half if neox else 1))
                x0, x1 = _load(b, px, i0), _load(b, px, i1)
                c, s = b.load(b.gep(cos_t, [k])), b.load(b.gep(sin_t, [k]))
                b.store(pm.sub(b, pm.mul(b, x0, c), pm.mul(b, x1, s)), b.gep(py, [i0]))
                b.store(pm.add(b, pm.mul(b, x0, s), pm.mul(b, x1, c)), b.gep(py, [i1]))
    b.ret_void()
    return fn


# ---------------------------------------------------------------- SET_ROWS

def _quantize_row(b: ir.IRBuilder, px, src_at, row: ir.Value, D: int) -> None:
    """attention.quantize_rows of D values at px[src_at:] into the cache row at byte pointer row."""
    amax = f32(0.0)
    nan = i1(0)
    with_amax = b.alloca(f32)
    with_nan = b.alloca(i1)
    b.store(amax, with_amax)
    b.store(nan, with_nan)
    with for_range(b, 0, D, name="a") as i:
        x = _load(b, px, b.add(src_at, i))
        a = pm.fabs(b, x)
        cur = b.load(with_amax)
        b.store(b.select(b.fcmp_ordered(">", a, cur), a, cur), with_amax)
        b.store(b.or_(b.load(with_nan), pm.is_nan(b, x)), with_nan)
    amax = pm.with_bits(b, b.load(with_nan), pm.QNAN, b.load(with_amax))        # np.max: NaN wins
    s16 = b.fptrunc(pm.mul(b, amax, f32(float(tables.constants()["INV_127"]))), f16)
    b.store(s16, b.bitcast(row, f16.as_pointer()), align=1)
    s = b.fpext(s16, f64)
    ok = b.and_(b.fcmp_ordered("!=", s, f64(0.0)), b.fcmp_ordered("<", pm.fabs64(b, s), f64(float("inf"))))
    codes = b.gep(row, [i64(2)])
    with for_range(b, 0, D, name="q") as i:
        x = b.fpext(_load(b, px, b.add(src_at, i)), f64)
        y = b.fdiv(x, b.select(ok, s, f64(1.0)))
        fin = b.fcmp_ordered("<", pm.fabs64(b, y), f64(float("inf")))
        r = pm.roundeven(b, y)
        r = b.select(b.fcmp_ordered(">", r, f64(127.0)), f64(127.0), r)
        r = b.select(b.fcmp_ordered("<", r, f64(-127.0)), f64(-127.0), r)
        q = b.select(b.and_(ok, fin), b.fptosi(r, i8), i8(0))
        b.store(q, b.gep(codes, [i]))


@kernel(Op.SET_ROWS, profile="portable")
def define_set_rows(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SET_ROWS)
    cache, values = g[n.inputs[0]], g[n.inputs[1]]
    if cache.dtype != po.CACHE_TYPE or tuple(values.shape[1:]) != tuple(cache.shape[1:]):
        raise LoweringError(f"llvm portable profile: set_rows {n.name or n.id} writes {values.shape} into "
                            f"{cache.dtype}{cache.shape}")
    T = values.shape[0]
    Hkv, D = cache.shape[1], cache.shape[2]
    row_bytes = 2 + D
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, _cache, src, posp, ith, nth, dims = fn.args
    px, pp = typed(b, src, f32), typed(b, posp, i32)
    lo, hi = thread_range(b, b.mul(dim(b, dims, T), i64(Hkv)), ith, nth)
    with for_range(b, lo, hi, name="r") as r:
        t, h = b.sdiv(r, i64(Hkv)), b.srem(r, i64(Hkv))
        cell = b.sext(b.load(b.gep(pp, [t])), i64)
        row = b.gep(out, [b.mul(b.add(b.mul(cell, i64(Hkv)), h), i64(row_bytes))])
        _quantize_row(b, px, b.mul(r, i64(D)), row, D)
    b.ret_void()
    return fn


# ---------------------------------------------------------------- FLASH_ATTN

TERM_BITS = 34            # a score's term per block: |dot| < 2^19, m <= 15, |k scale significand| < 2^11


def _vector(b: ir.IRBuilder, xs: list, t: ir.VectorType) -> ir.Value:
    v = ir.Constant(t, ir.Undefined)
    for lane, x in enumerate(xs):
        v = b.insert_element(v, x, i32(lane))
    return v


def _any8(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1: any lane of an <8 x i1> is set."""
    return b.icmp_unsigned("!=", b.bitcast(v, ir.IntType(8)), ir.IntType(8)(0))


def _all_lanes(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1: every lane of an <n x i1> is set."""
    n = v.type.count
    return b.icmp_unsigned("==", b.bitcast(v, ir.IntType(n)), ir.IntType(n)((1 << n) - 1))


def _all8(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1: every lane of an <8 x i1> is set."""
    return b.icmp_unsigned("==", b.bitcast(v, ir.IntType(8)), ir.IntType(8)(255))


def _act_scale(b: ir.IRBuilder, amax: ir.Value):
    """quant.act_scale of a finite amax >= 0: (m, e) as i64."""
    u = b.zext(pm.bits(b, amax), i64)
    c = b.or_(b.and_(u, i64(0x7FFFFF)), i64(0x800000))
    p = b.sub(b.and_(b.lshr(u, i64(23)), i64(255)), i64(127))
    d13 = 127 << 13
    m1 = b.udiv(b.add(c, i64(d13 - 1)), i64(d13))
    m2 = b.udiv(b.add(c, i64(2 * d13 - 1)), i64(2 * d13))
    small = b.icmp_signed("<=", m1, i64(15))
    zero = b.fcmp_ordered("==", amax, f32(0.0))
    m = b.select(zero, i64(0), b.select(small, m1, m2))
    e = b.select(zero, i64(0), b.select(small, b.sub(p, i64(10)), b.sub(p, i64(9))))
    return m, e


def _pow2(b: ir.IRBuilder, e: ir.Value) -> ir.Value:
    """2^e as f64 for an i64 e in the normal range."""
    return b.bitcast(b.shl(b.add(e, i64(1023)), i64(52)), f64)


def _f16_parts(b: ir.IRBuilder, h: ir.Value):
    """quant.f16_parts of f16 bits h (i16): (signed significand i64, exponent i32, bad i1)."""
    u = b.zext(h, i64)
    e5, m10 = b.and_(b.lshr(u, i64(10)), i64(31)), b.and_(u, i64(1023))
    sub_ = b.icmp_signed("==", e5, i64(0))
    sig = b.select(sub_, m10, b.or_(m10, i64(1024)))
    ex = b.select(sub_, i64(-24), b.sub(e5, i64(25)))
    sig = b.select(b.icmp_unsigned("!=", b.and_(u, i64(0x8000)), i64(0)), b.sub(i64(0), sig), sig)
    return sig, b.trunc(ex, i32), b.icmp_signed("==", e5, i64(31))


class _Var:
    """A mutable local (an alloca that mem2reg makes a register)."""

    def __init__(self, b: ir.IRBuilder, t: ir.Type, init, entry: ir.IRBuilder):
        entry.position_at_start(b.function.entry_basic_block)
        self.b, self.p = b, entry.alloca(t)
        b.store(init, self.p)

    def get(self):
        return self.b.load(self.p)

    def set(self, x) -> None:
        self.b.store(x, self.p)


@kernel(Op.FLASH_ATTN, profile="portable")
def define_flash_attn(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.FLASH_ATTN)
    qn, kn, vn, mn = (g[i] for i in n.inputs)
    M, H, D = qn.shape
    Hkv, n_kv = kn.shape[1], mn.shape[1]
    if (kn.dtype, vn.dtype) != (po.CACHE_TYPE, po.CACHE_TYPE) or D % QK or D > 256 or H % Hkv \
            or tuple(kn.shape[1:]) != (Hkv, D) or tuple(vn.shape[1:]) != (Hkv, D) or mn.dtype != "f16":
        raise LoweringError(f"llvm portable profile: flash_attn {n.name or n.id}: q{qn.shape} k {kn.dtype}{kn.shape} "
                            f"v {vn.dtype}{vn.shape} mask {mn.dtype}{mn.shape} do not fit")
    nsub, R, grp = D // QK, 2 + D, H // Hkv
    scale = f32(float(np.float32(n.params["scale"])))
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, q, k, v, mask, ith, nth, dims = fn.args
    pq, pout, pmask = typed(b, q, f32), typed(b, out, f32), typed(b, mask, f16)
    nkv = dim(b, dims, n_kv)
    entry = ir.IRBuilder()
    qcodes = b.alloca(i8, size=D, name="qcodes")
    scores = b.alloca(f32, size=nkv, name="scores")
    sums = b.alloca(i32, size=D, name="sums")
    raw_slot = b.alloca(ir.ArrayType(f32, 8), name="raw8")
    need_slot = b.alloca(ir.ArrayType(i8, 8), name="need8")
    v32i8, v32i32 = ir.VectorType(i8, QK), ir.VectorType(i32, QK)
    lo, hi = thread_range(b, b.mul(dim(b, dims, M), i64(H)), ith, nth)
    with for_range(b, lo, hi, name="task") as task:
        mrow, h = b.sdiv(task, i64(H)), b.srem(task, i64(H))
        hk = b.sdiv(h, i64(grp))
        qbase = b.mul(task, i64(D))
        # 1. q in blocks of 32 (quant.quantize_act)
        badq = i1(0)
        ms, es = [], []
        v32f32, v32f64, v32i64 = ir.VectorType(f32, QK), ir.VectorType(f64, QK), ir.VectorType(i64, QK)
        rne = intrinsic(m, "llvm.roundeven.v32f64", v32f64, [v32f64])
        for sb in range(nsub):         # 32 lanes: the same steps per value as the scalar spec
            x = _load(b, pq, b.add(qbase, i64(sb * QK)), v32f32)
            a = pm.fabs(b, x)
            fin = b.fcmp_ordered("<", a, pm.const(v32f32, float("inf")))
            blk_bad = b.not_(_all_lanes(b, fin))
            abits = b.select(fin, pm.bits(b, a), pm.const(v32i32, 0))           # |x| bits order as |x|
            umax = intrinsic(m, "llvm.vector.reduce.umax.v32i32", i32, [v32i32])
            amax = b.bitcast(b.call(umax, [abits]), f32)
            mq, eq = _act_scale(b, b.select(blk_bad, f32(0.0), amax))
            inv = _pow2(b, b.sub(i64(0), eq))
            div = b.sitofp(b.select(b.icmp_signed("==", mq, i64(0)), i64(1), mq), f64)
            zero_codes = b.or_(blk_bad, b.icmp_signed("==", mq, i64(0)))
            y = b.fdiv(b.fmul(b.fpext(x, v32f64), pm.splat(b, inv, v32f64)), pm.splat(b, div, v32f64))
            y = b.call(rne, [y])
            y = b.select(b.fcmp_ordered(">", y, pm.const(v32f64, 127.0)), pm.const(v32f64, 127.0), y)
            y = b.select(b.fcmp_ordered("<", y, pm.const(v32f64, -127.0)), pm.const(v32f64, -127.0), y)
            ya = b.and_(b.bitcast(y, v32i64), pm.const(v32i64, (1 << 63) - 1))
            finy = b.icmp_unsigned("<", ya, pm.const(v32i64, 0x7FF0000000000000))
            ok = b.and_(finy, pm.splat(b, b.not_(zero_codes), ir.VectorType(i1, QK)))
            code = b.select(ok, b.fptosi(y, v32i8), pm.const(v32i8, 0))
            b.store(code, b.bitcast(b.gep(qcodes, [i64(sb * QK)]), v32i8.as_pointer()), align=1)
            badq = b.or_(badq, blk_bad)
            ms.append(mq)
            es.append(eq)
        # the exact score's alignment: the least exponent of the nonzero blocks, and the spread
        big = i64(1 << 40)
        emin = big
        for mq, eq in zip(ms, es):
            emin = b.select(b.and_(b.icmp_signed("!=", mq, i64(0)), b.icmp_signed("<", eq, emin)), eq, emin)
        emin = b.select(b.icmp_signed("==", emin, big), i64(0), emin)
        shifts, spread = [], i64(0)
        for mq, eq in zip(ms, es):
            sh = b.select(b.icmp_signed("!=", mq, i64(0)), b.sub(eq, emin), i64(0))
            shifts.append(sh)
            spread = b.select(b.icmp_signed(">", sh, spread), sh, spread)
        fits = b.icmp_signed("<=", spread, i64(room(TERM_BITS, nsub)))
        vn32 = ir.VectorType(i32, nsub)
        sh_v = _vector(b, [b.trunc(sh, i32) for sh in shifts], vn32)
        ae_v = _vector(b, [b.trunc(eq, i32) for eq in es], vn32)
        emin32 = b.trunc(emin, i32)
        qv = [b.sext(b.load(b.bitcast(b.gep(qcodes, [i64(sb * QK)]), v32i8.as_pointer()), align=1), v32i32)
              for sb in range(nsub)]
        red = intrinsic(m, "llvm.vector.reduce.add.v32i32", i32, [v32i32])
        # 2. scores: exact q.k rounded once, * scale, + mask; their max and any NaN
        # eight cells at a time: lane-wise running max (a tie of +-0 picks either: no bit
        # depends on the max's zero sign) and any NaN, folded after the cells
        v8i1, v8i8 = ir.VectorType(i1, 8), ir.VectorType(i8, 8)
        vmx, vnan = _Var(b, v8f32, pm.const(v8f32, float("-inf")), entry), _Var(b, v8i1, pm.const(v8i1, 0), entry)
        kv_mask_row = b.mul(mrow, nkv)
        # a masked cell's score is -inf (NaN with a bad scale) whenever r(score * scale) is
        # finite, which holds for every K row when |score| < 2^(emax + 42) (|dot| < 2^19,
        # m < 2^4, |k| < 2^16, nsub <= 8) and |scale| < 2^(scale_e + 1) stay below 2^128
        scale_e = int(np.frexp(np.float32(n.params["scale"]))[1]) - 1
        bounded = b.icmp_signed("<", b.add(emin, spread), i64(128 - 43 - scale_e - 1))
        qf = [b.fmul(b.sitofp(mq, f64), _pow2(b, eq)) for mq, eq in zip(ms, es)]    # m * 2^e, 0 for m = 0
        f64_row = b.icmp_signed("<=", spread, i64(pf.limit(TERM_BITS, nsub)))
        qb = [b.load(b.bitcast(b.gep(qcodes, [i64(sb * QK)]), v32i8.as_pointer()), align=1) for sb in range(nsub)]
        scale8, ninf8 = pm.splat(b, scale, v8f32), pm.const(v8f32, float("-inf"))
        with for_range(b, 0, nkv, 8, name="j8") as j8:
            rows = [b.gep(k, [b.mul(b.add(b.mul(b.add(j8, i64(c)), i64(Hkv)), hk), i64(R))]) for c in range(8)]
            words = ir.Constant(pf.v8i16, [0] * 8)                     # the eight K scales' f16 bits
            for c, row in enumerate(rows):
                words = b.insert_element(words, b.load(b.bitcast(row, i16.as_pointer()), align=1), i32(c))
            mk = pm.canon(b, b.fpext(_vload(b, pmask, b.add(kv_mask_row, j8), ir.VectorType(f16, 8)), v8f32))
            kbad = b.icmp_unsigned("==", b.and_(words, pm.const(pf.v8i16, 0x7C00)), pm.const(pf.v8i16, 0x7C00))
            bad = b.or_(pm.splat(b, badq, v8i1), kbad)
            masked = b.and_(pm.splat(b, bounded, v8i1), b.fcmp_ordered("==", mk, ninf8))
            with b.if_then(b.not_(_all8(b, masked))):                  # eight masked cells: no dots
                raw8, need8 = _scores8(b, rows, words, qb, qf, f64_row, nsub)
                need8 = b.and_(need8, b.not_(masked))
                b.store(raw8, b.bitcast(raw_slot, v8f32.as_pointer()), align=4)
                with b.if_then(_any8(b, need8), likely=False):
                    b.store(b.zext(need8, v8i8), b.bitcast(need_slot, v8i8.as_pointer()), align=1)
                    with for_range(b, 0, 8, name="jc") as jc:
                        with b.if_then(b.icmp_unsigned("!=", b.load(b.gep(need_slot, [i32(0), jc])), i8(0))):
                            krow = b.gep(k, [b.mul(b.add(b.mul(b.add(j8, jc), i64(Hkv)), hk), i64(R))])
                            ks, kx, _ = _f16_parts(b, b.load(b.bitcast(krow, i16.as_pointer()), align=1))
                            b.store(_exact_score(b, krow, qv, ms, ks, kx, sh_v, emin32, fits, ae_v, nsub, red),
                                    b.gep(raw_slot, [i32(0), jc]))
            score = b.load(b.bitcast(raw_slot, v8f32.as_pointer()), align=4)
            sc = pm.add(b, pm.mul(b, pm.with_bits(b, bad, pm.QNAN, score), scale8), mk)
            sc = b.select(masked, pm.with_bits(b, bad, pm.QNAN, ninf8), sc)
            _vstore(b, sc, scores, j8)
            cur = vmx.get()
            vmx.set(b.select(b.fcmp_ordered(">", sc, cur), sc, cur))
            vnan.set(b.or_(vnan.get(), pm.is_nan(b, sc)))
        lanes = vmx.get()
        mx_all = b.extract_element(lanes, i32(0))
        for lane in range(1, 8):
            x = b.extract_element(lanes, i32(lane))
            mx_all = b.select(b.fcmp_ordered(">", x, mx_all), x, mx_all)
        mx = _Var(b, f32, mx_all, entry)
        anynan = _Var(b, i1, _any8(b, vnan.get()), entry)
        obase = qbase
        rownan = _Var(b, i1, anynan.get(), entry)
        neg0 = pm.const(v8f32, NEG0)
        with for_range(b, 0, D, 8, name="o") as o:
            _vstore(b, neg0, pout, b.add(obase, o))
        with b.if_then(b.not_(anynan.get())):
            # 3. softmax (funcs.softmax): e = exp(x - max), one recip of the tree8 sum, products
            minf = b.fcmp_ordered("==", mx.get(), f32(float("-inf")))
            mxs = pm.splat(b, b.select(minf, f32(0.0), mx.get()), v8f32)
            lanes = _Var(b, v8f32, neg0, entry)
            with for_range(b, 0, nkv, 8, name="e") as j:
                e = pm.exp(b, pm.sub(b, _vload(b, scores, j), mxs))
                _vstore(b, e, scores, j)
                lanes.set(pm.add(b, lanes.get(), e))
            r = pm.recip(b, pm.tree(b, lanes.get()))
            # 4. values: w = r(p * s_v), 2^E per 32 cells, exact integer block sums, blocks in order
            with for_range(b, 0, b.sdiv(nkv, i64(QK)), name="blk") as blk:
                vamax = _Var(b, v8f32, pm.const(v8f32, 0.0), entry)      # |w| lane-wise: max in any order
                wnan, winf = _Var(b, v8i1, pm.const(v8i1, 0), entry), _Var(b, v8i1, pm.const(v8i1, 0), entry)
                r8, zero8f = pm.splat(b, r, v8f32), pm.const(v8f32, 0.0)
                with for_range(b, 0, QK, 8, name="w") as jj:
                    j = b.add(b.mul(blk, i64(QK)), jj)
                    svw = ir.Constant(ir.VectorType(f16, 8), ir.Undefined)
                    for c in range(8):
                        vrow = b.gep(v, [b.mul(b.add(b.mul(b.add(j, i64(c)), i64(Hkv)), hk), i64(R))])
                        svw = b.insert_element(svw, b.load(b.bitcast(vrow, f16.as_pointer()), align=1), i32(c))
                    p = b.select(pm.splat(b, minf, v8i1), zero8f, pm.mul(b, _vload(b, scores, j), r8))
                    w = pm.mul(b, p, pm.canon(b, b.fpext(svw, v8f32)))
                    _vstore(b, w, scores, j)
                    a = pm.fabs(b, w)
                    cur = vamax.get()
                    vamax.set(b.select(b.fcmp_ordered(">", a, cur), a, cur))
                    wnan.set(b.or_(wnan.get(), pm.is_nan(b, w)))
                    winf.set(b.or_(winf.get(), b.fcmp_ordered("==", a, pm.const(v8f32, float("inf")))))
                lanes8 = vamax.get()
                amax = _Var(b, f32, b.extract_element(lanes8, i32(0)), entry)
                for lane in range(1, 8):
                    x, cur = b.extract_element(lanes8, i32(lane)), amax.get()
                    amax.set(b.select(b.fcmp_ordered(">", x, cur), x, cur))
                wnan, winf = _any8(b, wnan.get()), _any8(b, winf.get())
                with b.if_then(wnan):
                    rownan.set(i1(1))
                nonzero = b.fcmp_ordered(">", amax.get(), f32(0.0))
                with b.if_else(winf) as (then, otherwise):
                    with then:       # the spec's W*v of an infinite w is NaN, cast to int64's least value
                        ninf = pm.const(v8f32, float("-inf"))
                        with for_range(b, 0, D, 8, name="oi") as o:
                            at = b.add(obase, o)
                            _vstore(b, pm.add(b, _vload(b, pout, at), ninf), pout, at)
                    with otherwise:
                        with b.if_then(b.and_(nonzero, b.not_(wnan))):
                            _value_block(b, pout, obase, scores, sums, v, blk, amax.get(), hk, Hkv, R, D)
        with b.if_then(rownan.get()):
            nan = pm.const(v8f32, float("nan"))
            with for_range(b, 0, D, 8, name="on") as o:
                _vstore(b, pm.canon(b, nan), pout, b.add(obase, o))
    b.ret_void()
    return fn


def _scores8(b, rows: list, words, qb: list, qf: list, f64_row, nsub: int):
    """The scores of eight cells (their K rows, one K/V head; words their scales' f16 bits) in
    f64 (portable_f64's argument): each sub-block's exact integer dot (vpmaddubsw lanes), times
    the q block's scale m * 2^e, summed over the sub-blocks, times the K row's f16 scale: every
    product and sum exact when the q blocks' exponent spread is within
    portable_f64.limit(TERM_BITS, nsub) (f64_row), and one f64 -> f32 conversion rounds it once
    as round_exact does, +0 for an exact zero. Returns <8 x f32> the scores and <8 x i1> true
    where the exact path must give the cell's score instead (f64_row false, or a nonzero |score|
    below 2^-126 or at least 2^127). A bad K scale gives NaN or inf here; its cell is NaN
    either way (the caller's bad select)."""
    acc = None
    for sb in range(nsub):
        lanes = []
        for row in rows:
            kc = b.load(b.bitcast(b.gep(row, [i64(2 + sb * QK)]), qb[sb].type.as_pointer()), align=1)
            lanes.append(sums_us8(b, psign(b, kc, kc), psign(b, qb[sb], kc)))     # pair sums < 2^15
        t = b.fmul(b.sitofp(lane_sums(b, lanes), pf.v8f64), pm.splat(b, qf[sb], pf.v8f64))
        acc = t if acc is None else b.fadd(acc, t)
    s = b.fmul(acc, pf.f16_values(b, words))
    v8i64 = ir.VectorType(i64, 8)
    a = b.bitcast(b.and_(b.bitcast(s, v8i64), pm.const(v8i64, (1 << 63) - 1)), pf.v8f64)       # |s|
    tiny = b.and_(b.fcmp_ordered("<", a, pm.const(pf.v8f64, pf.TINY)), b.fcmp_ordered("!=", a, pm.const(pf.v8f64, 0.0)))
    need = b.or_(b.or_(tiny, b.fcmp_ordered(">=", a, pm.const(pf.v8f64, 2.0 ** 127))),
                 pm.splat(b, b.not_(f64_row), ir.VectorType(i1, 8)))
    r = b.fadd(b.fptrunc(s, v8f32), pm.const(v8f32, 0.0))
    return r, need


def _exact_score(b, krow, qv: list, ms: list, ks, kx, sh_v, emin32, fits, ae_v, nsub: int, red):
    """The cell's score by the exact path: q block sb . k block sb times both scales'
    significands, the terms aligned once (portable_exact.round_shifted)."""
    terms = []
    for sb in range(nsub):
        kc = b.sext(b.load(b.bitcast(b.gep(krow, [i64(2 + sb * QK)]), ir.VectorType(i8, QK).as_pointer()), align=1),
                    qv[sb].type)
        dot = b.sext(b.call(red, [b.mul(kc, qv[sb])]), i64)                      # |.| < 2^19
        terms.append(b.mul(b.mul(dot, ms[sb]), ks))                             # |.| < 2^34
    kxv = pm.splat(b, kx, ae_v.type)
    return round_shifted(b, _vector(b, terms, ir.VectorType(i64, nsub)), sh_v, b.add(emin32, kx), fits,
                         b.add(ae_v, kxv))


def _value_block(b, pout, obase, w_at, sums, v, blk, amax, hk, Hkv: int, R: int, D: int) -> None:
    """One block of 32 cells with max |w| = amax > 0 (finite): E, W_j = rint(w_j / 2^E), the
    exact sums Σ W_j v_j (int32), r(2^E * sum) (-0.0 for 0) added into the output row."""
    v8i8 = ir.VectorType(i8, 8)
    u = b.zext(pm.bits(b, amax), i64)
    c = b.or_(b.and_(u, i64(0x7FFFFF)), i64(0x800000))
    p = b.sub(b.and_(b.lshr(u, i64(23)), i64(255)), i64(127))
    E = b.select(b.icmp_signed("<=", c, i64(127 << 17)), b.sub(p, i64(6)), b.sub(p, i64(5)))
    inv = _pow2(b, b.sub(i64(0), E))
    zero8 = pm.const(v8i32, 0)
    with for_range(b, 0, D, 8, name="z") as o:
        _vstore(b, zero8, sums, o)
    with for_range(b, 0, QK, name="wc") as jj:
        j = b.add(b.mul(blk, i64(QK)), jj)
        w = b.fpext(b.load(b.gep(w_at, [j])), f64)
        W = b.fptosi(pm.roundeven(b, b.fmul(w, inv)), i32)                          # exact, |W| <= 127
        with b.if_then(b.icmp_signed("!=", W, i32(0))):
            vcodes = b.gep(v, [b.add(b.mul(b.add(b.mul(j, i64(Hkv)), hk), i64(R)), i64(2))])
            Wv = pm.splat(b, W, v8i32)
            with for_range(b, 0, D, 8, name="acc") as o:
                vc = b.sext(_vload(b, vcodes, o, v8i8), v8i32)
                _vstore(b, b.add(_vload(b, sums, o, v8i32), b.mul(Wv, vc)), sums, o)
    E8 = pm.splat(b, b.trunc(E, i32), v8i32)
    neg0 = pm.const(v8f32, NEG0)
    with for_range(b, 0, D, 8, name="r") as o:
        s = _vload(b, sums, o, v8i32)
        r = pm.scale2(b, b.sitofp(s, v8f32), E8)
        r = b.select(b.icmp_signed("==", s, zero8), neg0, r)
        at = b.add(obase, o)
        _vstore(b, pm.add(b, _vload(b, pout, at), r), pout, at)
