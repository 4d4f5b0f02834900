"""The llvm kernels of the portable profile (docs/PORTABLE.md) except its mat-mul side
(QUANTIZE, GET_ROWS: backends/llvm/portable/rows.py; MUL_MAT: backends/llvm/portable/matmul.py) and its
attention (FLASH_ATTN: backends/llvm/portable/attention.py). Each repeats the numpy spec of
bankml/profiles/portable/ step for step with the emitters of backends/llvm/portable/funcs.py, so its bits are the
reference backend's (backends/reference/portable.py) for every thread count:

- RMS_NORM  funcs.rmsnorm without w: x * rsqrt(fold_sum(x*x) / n + eps) (the weight is a MUL)
- L2_NORM   funcs.l2norm: x * rsqrt(fold_sum(x*x) + eps)
- ADD, MUL  arith.add / arith.mul, an operand of fewer dims broadcast over the leading ones
- SWIGLU    mul(silu(gate), up)
- ROPE      rotary.rope_table (the fraction of a turn from integer arithmetic on t_i's bits) and
            rotary.rope, pairs (2i, 2i+1) in mode norm, (i, i + n/2) in mode neox, over the first
            n_dims of each head (the rest as they are: Qwen3.5's partial rope); YaRN refused
- SET_ROWS  attention.cache_row into the int8 cache rows (f16 scale, then int8 codes)

Vector width: ADD and MUL 8 lanes (a broadcast operand's index carried from chunk to chunk,
wrapping at its period); SWIGLU 32 lanes a pass where the row length allows (four independent
exp/recip chains overlap), else 8 or 1; ROPE's cos/sin table and rotation 8 pairs at a time
where half the head dim is a multiple of 8 (mode norm's pairs split and merged by shuffles),
else one; SET_ROWS quantizes a row on 8 lanes where D allows. Lanes change no bit: every step
is elementwise, and the only folds (RMS_NORM's sum, SET_ROWS's max |x|) keep the spec's order
or need none.

Threads split rows (RMS_NORM), chunks of 32, 8 or 1 values (ADD, MUL, SWIGLU), tokens (ROPE),
or (token, K/V head) rows (SET_ROWS); no result depends on the split.

The K/V cache of a layer is the session's array of rows of attention.cache_dtype(D): per
(cell, K/V head) 2 bytes of f16 scale, then D int8 codes (2 + D bytes, packed).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.portable import funcs as pm
from bankml.backends.llvm.emit.core import (dim, f16, f32, f64, for_range, i1, i8, i32, i64, new_function,
    size, thread_range, typed, v8f32)
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.dims import Dim
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.profiles.portable import tables
from bankml.profiles.portable.arith import canon

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

@kernel(Op.RMS_NORM, order=po.RMS_NORM, profile="portable")
def define_rms_norm(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.RMS_NORM)
    return _norm(m, n, mean=True)


@kernel(Op.L2_NORM, order=po.L2_NORM, profile="portable")
def define_l2_norm(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.L2_NORM)
    return _norm(m, n, mean=False)


def _norm(m: ir.Module, n: Node, mean: bool) -> ir.Function:
    """Each row times rsqrt(fold_sum(x*x) / n + eps) (funcs.rmsnorm without w; mean) or
    rsqrt(fold_sum(x*x) + eps) (funcs.l2norm)."""
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, src, ith, nth, dims = fn.args
    px, py = typed(b, src, f32), typed(b, out, f32)
    k = n.shape[-1]
    body = k - k % 8
    rows = size(b, dims, n.shape[:-1])
    n_f, eps = f32(float(k)), f32(float(canon(np.float32(n.params["eps"]))))      # a denormal eps reads as 0
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
        v = pm.add(b, pm.div(b, pm.tree(b, lanes), n_f) if mean else pm.tree(b, lanes), eps)
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


def _elementwise(m: ir.Module, g: Graph, n: Node, step, wide: int = 8) -> ir.Function:
    """out[i] = step(a[i'], b[i'']) over the flat output, `wide` lanes at a time (8, or 16: two
    ymm registers whose independent chains overlap) where every operand's period and the last
    dim allow, else 8 or 1; split over threads in chunks of that many."""
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, pa, pb, ith, nth, dims = fn.args
    po_, srcs = typed(b, out, f32), [typed(b, pa, f32), typed(b, pb, f32)]
    periods = [_period(g, n, 0), _period(g, n, 1)]
    total = size(b, dims, n.shape)
    last = n.shape[-1]

    def fits(k: int) -> bool:         # a symbolic last dim: 8 lanes (a row of 8s), never wider
        return all(p is None or p % k == 0 for p in periods) and \
            (last % k == 0 if isinstance(last, int) else k == 8)
    step_n = wide if fits(wide) else 8 if fits(8) else 1
    vec = step_n > 1
    t = ir.VectorType(f32, step_n) if vec else f32
    chunks = b.sdiv(b.add(total, i64(step_n - 1)), i64(step_n))
    lo, hi = thread_range(b, chunks, ith, nth)
    # a broadcast operand's index at mod P, carried from chunk to chunk (wrapping at P) on
    # 8 lanes, not divided per chunk
    wraps = {per: b.alloca(i64, name=f"mod{per}") for per in set(periods) if per is not None and vec}
    for per, slot in wraps.items():
        b.store(b.srem(b.mul(lo, i64(step_n)), i64(per)), slot)
    with for_range(b, lo, hi, name="c") as c:
        at = b.mul(c, i64(step_n))
        idx = {per: b.load(slot) for per, slot in wraps.items()}
        args = [_load(b, p, at if per is None else idx[per] if per in idx else b.srem(at, i64(per)), t)
                for p, per in zip(srcs, periods)]
        for per, slot in wraps.items():
            nxt = b.add(idx[per], i64(step_n))
            b.store(b.select(b.icmp_signed("==", nxt, i64(per)), i64(0), nxt), slot)
        y = step(b, *args)
        if vec:
            _vstore(b, y, po_, at)
        else:
            b.store(y, b.gep(po_, [at]))
    b.ret_void()
    return fn


@kernel(Op.ADD, order=po.ELEMENTWISE, profile="portable")
def define_add(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.ELEMENTWISE)
    return _elementwise(m, g, n, pm.add)


@kernel(Op.MUL, order=po.ELEMENTWISE, profile="portable")
def define_mul(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.ELEMENTWISE)
    return _elementwise(m, g, n, pm.mul)


@kernel(Op.SWIGLU, order=po.SWIGLU, profile="portable")
def define_swiglu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SWIGLU)
    if any(g[i].shape != n.shape for i in n.inputs):
        raise LoweringError(f"llvm portable profile: swiglu {n.name or n.id} needs gate and up of its shape")
    return _elementwise(m, g, n, lambda b, gate, up: pm.mul(b, pm.silu(b, gate), up), wide=32)


# ---------------------------------------------------------------- ROPE

def _rope_turn(b: ir.IRBuilder, pos: ir.Value, sig: ir.Value, s: ir.Value):
    """rotary.rope_table's integer part at one position for one pair or 8 (pos, sig, s i64 of one
    lane count; t = sig * 2^-s turns): (j, the table point as i32; rest as f32, rounded once;
    the f64 scale 2^-s). frac and j are >= 0: logical shifts."""
    it = s.type
    c = lambda x: pm.const(it, x)                                                 # noqa: E731
    t32 = ir.VectorType(i32, it.count) if isinstance(it, ir.VectorType) else i32
    tf = ir.VectorType(f32, it.count) if isinstance(it, ir.VectorType) else f32
    t64 = ir.VectorType(f64, it.count) if isinstance(it, ir.VectorType) else f64
    prod = b.mul(pos, sig)                                                        # < 2^41
    sm = b.select(b.icmp_signed("<", s, c(62)), s, c(62))
    frac = b.and_(prod, b.sub(b.shl(c(1), sm), c(1)))
    shift = b.sub(s, c(8))
    shift = b.select(b.icmp_signed("<", shift, c(62)), shift, c(62))
    j = b.lshr(frac, shift)
    rest = b.sub(frac, b.shl(j, shift))
    scale = b.bitcast(b.shl(b.sub(c(1023), s), c(52)), t64)                       # 2^-s
    return b.trunc(b.and_(j, c(tables.SINCOS_N - 1)), t32), b.sitofp(rest, tf), scale


def _rope_cos_sin(b: ir.IRBuilder, jj: ir.Value, rest: ir.Value, scale: ir.Value, C, S):
    """rotary.rope_table's f32 steps for one pair or 8 (jj i32, rest f32, scale f64 of one lane
    count): d = rest * 2^-s rounded to f32 (flushed), rho, the polynomials, the table points."""
    c = tables.constants()
    t = rest.type
    t64 = ir.VectorType(f64, t.count) if isinstance(t, ir.VectorType) else f64
    k = lambda x: pm.fconst(t, x)                                                 # noqa: E731
    d = pm.canon(b, b.fptrunc(b.fmul(b.fpext(rest, t64), scale), t))
    rho = pm.mul(b, d, k(c["TWO_PI"]))
    r2 = pm.mul(b, rho, rho)
    sin_r = pm.sub(b, rho, pm.mul(b, pm.mul(b, r2, k(c["SIXTH"])), rho))
    cos_r = pm.sub(b, k(1.0), pm.mul(b, r2, pm.sub(b, k(0.5), pm.mul(b, r2, k(c["TWENTYFOURTH"])))))
    cj, sj = pm.lookup(b, C, jj), pm.lookup(b, S, jj)
    cos = pm.sub(b, pm.mul(b, cj, cos_r), pm.mul(b, sj, sin_r))
    sin = pm.add(b, pm.mul(b, sj, cos_r), pm.mul(b, cj, sin_r))
    return cos, sin


def _rotate(b: ir.IRBuilder, x0, x1, c, s):
    """(y0, y1) = (x0 c - x1 s, x0 s + x1 c), each step rounded and canonical."""
    return pm.sub(b, pm.mul(b, x0, c), pm.mul(b, x1, s)), pm.add(b, pm.mul(b, x0, s), pm.mul(b, x1, c))


@kernel(Op.ROPE, order=po.ROPE, profile="portable")
def define_rope(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.ROPE)
    p = n.params
    if p["ext_factor"] != 0 or p["attn_factor"] != 1:
        raise LoweringError(f"portable profile: rope {n.name or n.id} with YaRN scaling is not defined")
    T, H, hd = n.shape
    nd = p["n_dims"]
    if p["mode"] not in ("norm", "neox") or not 0 < nd <= hd or nd % 2 or p.get("freq_factors") is not None:
        raise LoweringError(f"llvm portable profile: rope {n.name or n.id} mode {p['mode']!r} n_dims {nd} "
                            f"over head dim {hd} (norm/neox over the first n_dims only)")
    half = nd // 2
    turns = tables.rope_turns(nd, float(p["freq_base"]), float(p["freq_scale"]))
    e = (turns.view(np.uint32) >> 23).astype(np.int64) & 0xFF
    sig = np.where(e == 0, 0, (turns.view(np.uint32) & 0x7FFFFF).astype(np.int64) | 0x800000)
    tag = f"{p['freq_base']!r}_{p['freq_scale']!r}_{nd}".replace(".", "p").replace("-", "m").replace("+", "")
    g_sig = pm.table(m, f"portable_rope_sig_{tag}", sig.astype(np.int64))
    g_s = pm.table(m, f"portable_rope_s_{tag}", (150 - e).astype(np.int64))
    cs, sn = tables.sincos_table()
    C, S = pm.table(m, "portable_cos256", cs), pm.table(m, "portable_sin256", sn)
    neox = p["mode"] == "neox"
    vec = half % 8 == 0
    lanes = 8 if vec else 1
    v8i32 = ir.VectorType(i32, 8)

    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, src, posp, ith, nth, dims = fn.args
    px, py, pp = typed(b, src, f32), typed(b, out, f32), typed(b, posp, i32)
    cos_t = b.alloca(f32, size=half, name="cos")
    sin_t = b.alloca(f32, size=half, name="sin")
    lo, hi = thread_range(b, dim(b, dims, T), ith, nth)
    with for_range(b, lo, hi, name="t") as t:
        pos = b.sext(b.load(b.gep(pp, [t])), i64)
        # the table at this position (8 pairs at a time where half allows)
        with for_range(b, 0, half, lanes, name="i") as i:
            if vec:
                v8i64 = ir.VectorType(i64, 8)
                sig_i = _vload(b, b.gep(g_sig, [i32(0), i32(0)]), i, v8i64)
                s_i = _vload(b, b.gep(g_s, [i32(0), i32(0)]), i, v8i64)
                cos, sin = _rope_cos_sin(b, *_rope_turn(b, pm.splat(b, pos, v8i64), sig_i, s_i), C, S)
                _vstore(b, cos, cos_t, i)
                _vstore(b, sin, sin_t, i)
            else:
                sig_i, s_i = b.load(b.gep(g_sig, [i32(0), i])), b.load(b.gep(g_s, [i32(0), i]))
                cos, sin = _rope_cos_sin(b, *_rope_turn(b, pos, sig_i, s_i), C, S)
                b.store(cos, b.gep(cos_t, [i]))
                b.store(sin, b.gep(sin_t, [i]))
        with for_range(b, 0, H, name="h") as h:
            base = b.mul(b.add(b.mul(t, i64(H)), h), i64(hd))
            if vec and neox:                     # x0 = x[k:k+8], x1 = x[half+k:half+k+8]
                with for_range(b, 0, half, 8, name="k") as k:
                    i0, i1 = b.add(base, k), b.add(base, b.add(k, i64(half)))
                    y0, y1 = _rotate(b, _load(b, px, i0, v8f32), _load(b, px, i1, v8f32),
                                     _vload(b, cos_t, k), _vload(b, sin_t, k))
                    _vstore(b, y0, py, i0)
                    _vstore(b, y1, py, i1)
            elif vec:                            # pairs (2i, 2i+1): 16 values, split and merged
                ev = ir.Constant(v8i32, list(range(0, 16, 2)))
                od = ir.Constant(v8i32, list(range(1, 16, 2)))
                with for_range(b, 0, half, 8, name="k") as k:
                    i0 = b.add(base, b.mul(k, i64(2)))
                    i1 = b.add(i0, i64(8))
                    a0, a1 = _load(b, px, i0, v8f32), _load(b, px, i1, v8f32)
                    y0, y1 = _rotate(b, b.shuffle_vector(a0, a1, ev), b.shuffle_vector(a0, a1, od),
                                     _vload(b, cos_t, k), _vload(b, sin_t, k))
                    _vstore(b, b.shuffle_vector(y0, y1, ir.Constant(v8i32, [0, 8, 1, 9, 2, 10, 3, 11])), py, i0)
                    _vstore(b, b.shuffle_vector(y0, y1, ir.Constant(v8i32, [4, 12, 5, 13, 6, 14, 7, 15])), py, i1)
            else:
                with for_range(b, 0, half, name="k") as k:
                    i0 = b.add(base, k if neox else b.mul(k, i64(2)))
                    i1 = b.add(i0, i64(half if neox else 1))
                    y0, y1 = _rotate(b, _load(b, px, i0), _load(b, px, i1),
                                     b.load(b.gep(cos_t, [k])), b.load(b.gep(sin_t, [k])))
                    b.store(y0, b.gep(py, [i0]))
                    b.store(y1, b.gep(py, [i1]))
            with for_range(b, nd, hd, name="rest") as k:           # the dims past n_dims, as they are
                at = b.add(base, k)
                b.store(_load(b, px, at), b.gep(py, [at]))
    b.ret_void()
    return fn


# ---------------------------------------------------------------- SET_ROWS

def _quantize_row(b: ir.IRBuilder, px, src_at, row: ir.Value, D: int) -> None:
    """attention.cache_row of D values at px[src_at:] into the cache row at byte pointer row:
    8 lanes at a time where D allows (absmax's maximum in any order), else one value at a time.
    absmax: `a > m` is false for a NaN a, which is passed over; codes: int8_codes, r(x * inv)
    rounded to even and clamped, a NaN product or an infinite inv giving 0."""
    lanes = 8 if D % 8 == 0 else 1
    t = v8f32 if lanes == 8 else f32
    ti1, ti8 = (ir.VectorType(i1, 8), ir.VectorType(i8, 8)) if lanes == 8 else (i1, i8)
    with_amax = b.alloca(t)
    b.store(pm.const(t, 0.0), with_amax)
    with for_range(b, 0, D, lanes, name="a") as i:
        a = pm.fabs(b, _load(b, px, b.add(src_at, i), t))
        cur = b.load(with_amax)
        b.store(b.select(b.fcmp_ordered(">", a, cur), a, cur), with_amax)
    amax = b.load(with_amax)
    if lanes == 8:
        m = b.extract_element(amax, i32(0))
        for lane in range(1, 8):
            x = b.extract_element(amax, i32(lane))
            m = b.select(b.fcmp_ordered(">", x, m), x, m)
        amax = m
    s16 = b.fptrunc(pm.mul(b, amax, f32(float(tables.constants()["INV_127"]))), f16)
    b.store(s16, b.bitcast(row, f16.as_pointer()), align=1)
    inv = pm.recip(b, b.fpext(s16, f32))
    zero = b.fcmp_ordered("==", pm.fabs(b, inv), f32(float("inf")))            # s rounded to 0
    inv_t, zero_t = pm.splat(b, inv, t), pm.splat(b, zero, ti1)
    codes = b.gep(row, [i64(2)])
    with for_range(b, 0, D, lanes, name="q") as i:
        p = pm.mul(b, _load(b, px, b.add(src_at, i), t), inv_t)
        r = pm.roundeven(b, p)
        r = b.select(b.fcmp_ordered(">", r, pm.const(t, 127.0)), pm.const(t, 127.0), r)
        r = b.select(b.fcmp_ordered("<", r, pm.const(t, -127.0)), pm.const(t, -127.0), r)
        r = b.select(pm.is_nan(b, r), pm.const(t, 0.0), r)
        q = b.select(zero_t, pm.const(ti8, 0), b.fptosi(r, ti8))
        b.store(q, b.bitcast(b.gep(codes, [i]), ti8.as_pointer()), align=1)


@kernel(Op.SET_ROWS, order=po.SET_ROWS, profile="portable")
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
