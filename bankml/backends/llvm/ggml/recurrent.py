"""SSM_CONV and GATED_DELTA_NET kernels (Qwen3.5's recurrence, issue 27), in ggml-cpu's float order
as the reference backend spells it (bankml/backends/reference/recurrent.py); each writes its state
cache in place, as SET_ROWS writes the K/V cache.

- ssm_conv: threads split the channels; per channel and token the d_conv products in GCC's
  vectorized loop order (blocks of 8, then 4, of rounded products added in order from 0, the
  last <= 3 as FMAs), reading [state | x^T] without building it; then the channel's state row
  takes the last d_conv-1 columns. Outputs never meet: 8 channels go at once, token by token
  (whole rows of x and y), the channels left one by one.
- gated_delta_net: threads split the v-heads; per head and token M = r(M*expf(g)) (8 lanes),
  d_j = r(r(v_j - dot(M_j, k))*beta), M_j = fma(k, d_j, M_j), o_j = r(dot(M_j, q)*r(1/sqrtf(S)));
  dot = ggml_vec_dot_f32: four 8-lane FMA accumulators over steps of 32, GGML_F32x8_REDUCE.
  Rows of M never meet (d_j comes from row j alone), so the four passes are fused per row
  (each row read and written once per token: a decode reads the state once).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, fma, for_range, i32, i64, intrinsic, new_function, size, smin, \
    thread_range, typed, v8f32
from bankml.backends.llvm.emit.simd import broadcast, f32x8_reduce, zero8
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import GATED_DELTA_NET, SSM_CONV
from bankml.numerics.floats import inv_sqrtf


def _vec(b: ir.IRBuilder, p: ir.Value, off: ir.Value) -> ir.Value:
    return b.bitcast(b.gep(p, [off]), v8f32.as_pointer())


def _gcc_sum(b: ir.IRBuilder, cols: list, w: list, zero) -> ir.Value:
    """sumf += col_k * w_k over k from 0 as GCC 12 vectorized it: blocks of 8, then 4, of rounded
    products (vmulps) added in order (vaddss), the last <= 3 as FMAs (vfmadd231ss); lane-wise,
    so 8 channels at once take the same steps."""
    nc, acc, i = len(w), zero, 0
    for width in [8] * (nc // 8) + ([4] if nc % 8 >= 4 else []):
        prods = [b.fmul(cols[i + k], w[i + k]) for k in range(width)]
        for p in prods:
            acc = b.fadd(acc, p)
        i += width
    for k in range(i, nc):
        acc = fma(b, cols[k], w[k], acc)
    return acc


def gather8(b: ir.IRBuilder, p: ir.Value, stride: int) -> ir.Value:
    """<p[0], p[stride], ..., p[7 * stride]>."""
    v = ir.Constant(v8f32, ir.Undefined)
    for i in range(8):
        v = b.insert_element(v, b.load(b.gep(p, [i64(i * stride)])), i32(i))
    return v


class Conv(NamedTuple):
    """An SSM_CONV kernel's buffers (y, x, the taps, the state) and sizes: T tokens, ch channels,
    nc taps, keep = nc - 1 state columns per channel."""
    ys: ir.Value
    xs: ir.Value
    ws: ir.Value
    ss: ir.Value
    T: ir.Value
    ch: int
    nc: int
    keep: int


def conv_channels(b: ir.IRBuilder, g: Graph, n: Node, fn: ir.Function,
                  body: Callable[[Conv, ir.Value, int], None]) -> None:
    """The loops of an SSM_CONV kernel (either profile): threads split the channels; body(conv,
    c, lanes) is emitted for channels c .. c + 7 (lanes 8), then for each channel left (lanes 1)."""
    ch, nc = g[n.inputs[1]].shape
    out, px, pw, pst, ith, nth, dims = fn.args
    conv = Conv(*(typed(b, p, f32) for p in (out, px, pw, pst)), size(b, dims, n.shape[:1]), ch, nc, nc - 1)
    lo, hi = thread_range(b, i64(ch), ith, nth)
    n_vec = b.udiv(b.sub(hi, lo), i64(8))
    with for_range(b, 0, n_vec, name="v") as v:
        body(conv, b.add(lo, b.mul(v, i64(8))), 8)
    with for_range(b, b.add(lo, b.mul(n_vec, i64(8))), hi, name="c") as c:
        body(conv, c, 1)


@kernel(Op.SSM_CONV, order=SSM_CONV)
def define_ssm_conv(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order != SSM_CONV:
        raise LoweringError(f"llvm backend: ssm_conv lowers only {SSM_CONV.describe()!r} ({n.name or n.id})")
    fn, b = new_function(m, kernel_name(n), kernel_type(n))

    def channels(k: Conv, c: ir.Value, lanes: int) -> None:
        """8 channels token by token (rows of x and y read and written whole), or one channel."""
        ys, xs, ss, T, ch, nc, keep = k.ys, k.xs, k.ss, k.T, k.ch, k.nc, k.keep
        srow, wrow = b.gep(ss, [b.mul(c, i64(keep))]), b.gep(k.ws, [b.mul(c, i64(nc))])
        if lanes == 1:
            w1 = [b.load(b.gep(wrow, [i64(i)])) for i in range(nc)]

            def column1(j: ir.Value) -> ir.Value:            # [state | x^T][c][j]
                from_state = b.icmp_signed("<", j, i64(keep))
                s = b.load(b.gep(srow, [smin(b, j, i64(keep - 1))]))
                xi = b.select(from_state, i64(0), b.sub(j, i64(keep)))
                x = b.load(b.gep(xs, [b.add(b.mul(xi, i64(ch)), c)]))
                return b.select(from_state, s, x)

            with for_range(b, 0, T, name="t") as t:
                acc = _gcc_sum(b, [column1(b.add(t, i64(i))) for i in range(nc)], w1, f32(0.0))
                b.store(acc, b.gep(ys, [b.add(b.mul(t, i64(ch)), c)]))
            for j in range(keep):
                b.store(column1(b.add(T, i64(j))), b.gep(srow, [i64(j)]))
            return
        w = [gather8(b, b.gep(wrow, [i64(i)]), nc) for i in range(nc)]

        def column(j: ir.Value, x_only: bool) -> ir.Value:      # [state | x^T][c..c+8][j]
            xi = b.sub(j, i64(keep))
            if x_only:
                return b.load(_vec(b, xs, b.add(b.mul(xi, i64(ch)), c)), align=4)
            from_state = b.icmp_signed("<", j, i64(keep))
            st = gather8(b, b.gep(srow, [smin(b, j, i64(keep - 1))]), keep)
            x = b.load(_vec(b, xs, b.add(b.mul(b.select(from_state, i64(0), xi), i64(ch)), c)), align=4)
            return b.select(from_state, st, x)

        for t_lo, t_hi, x_only in ((i64(0), smin(b, T, i64(keep)), False), (i64(keep), T, True)):
            with for_range(b, t_lo, t_hi, name="t") as t:
                acc = _gcc_sum(b, [column(b.add(t, i64(i)), x_only) for i in range(nc)], w, zero8())
                b.store(acc, _vec(b, ys, b.add(b.mul(t, i64(ch)), c)), align=4)
        for j in range(keep):                          # ascending: column(T + j) is never a column written
            col = column(b.add(T, i64(j)), False)
            for i in range(8):
                b.store(b.extract_element(col, i32(i)), b.gep(srow, [i64(i * keep + j)]))

    conv_channels(b, g, n, fn, channels)
    b.ret_void()
    return fn


def _dot_rows(b: ir.IRBuilder, a: list[ir.Value], x: ir.Value) -> ir.Value:
    """ggml_vec_dot_f32 of the 8-lane vectors a (4k of them) and the floats at x: four FMA
    accumulators, GGML_F32x8_REDUCE."""
    accs = [zero8()] * 4
    for i in range(0, len(a), 4):
        accs = [fma(b, a[i + u], b.load(_vec(b, x, i64(8 * (i + u))), align=4), accs[u]) for u in range(4)]
    return f32x8_reduce(b, accs)


class Step(NamedTuple):
    """One (v-head, token) step of a GATED_DELTA_NET kernel: the head's state M [S, S] (row j:
    value j's key-sized weights), the token's q and k rows (its q/k head h % Hk), v and out
    rows, the g and beta buffers and their index th."""
    M: ir.Value
    q: ir.Value
    k: ir.Value
    v: ir.Value
    out: ir.Value
    g: ir.Value
    beta: ir.Value
    th: ir.Value


@contextmanager
def head_token_steps(b: ir.IRBuilder, g: Graph, n: Node, fn: ir.Function) -> Iterator[Step]:
    """The loops of a GATED_DELTA_NET kernel (either profile): threads split the v-heads, each
    head takes its tokens in order; the body is emitted once, inside both."""
    hk = g[n.inputs[0]].shape[1]
    _, hv, S = n.shape
    out, pq, pk, pv, pg, pb, pst, ith, nth, dims = fn.args
    ys, qs, ks, vs, gs, bs, ss = (typed(b, p, f32) for p in (out, pq, pk, pv, pg, pb, pst))
    T = size(b, dims, n.shape[:1])
    lo, hi = thread_range(b, i64(hv), ith, nth)
    with for_range(b, lo, hi, name="h") as h:
        hq = b.urem(h, i64(hk))
        M = b.gep(ss, [b.mul(h, i64(S * S))])
        with for_range(b, 0, T, name="t") as t:
            qk = b.mul(b.add(b.mul(t, i64(hk)), hq), i64(S))
            th = b.add(b.mul(t, i64(hv)), h)
            yield Step(M, b.gep(qs, [qk]), b.gep(ks, [qk]), b.gep(vs, [b.mul(th, i64(S))]),
                       b.gep(ys, [b.mul(th, i64(S))]), gs, bs, th)


@kernel(Op.GATED_DELTA_NET, order=GATED_DELTA_NET)
def define_gated_delta_net(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    if n.order != GATED_DELTA_NET:
        raise LoweringError(f"llvm backend: gated_delta_net lowers only {GATED_DELTA_NET.describe()!r} "
                            f"({n.name or n.id})")
    S = n.shape[-1]
    if S % 32:
        raise LoweringError(f"gated_delta_net {n.name or n.id}: heads of {S}, not a multiple of 32")
    scale = f32(inv_sqrtf(S))
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    expf = intrinsic(m, "expf", f32, [f32])
    with head_token_steps(b, g, n, fn) as st:
        decay = broadcast(b, b.call(expf, [b.load(b.gep(st.g, [st.th]))]))
        beta = b.load(b.gep(st.beta, [st.th]))
        # ggml's four passes over the state (vec_scale, the dots with k, vec_mad, the dots
        # with q) touch row j only through delta[j], which row j alone gives: each row is read
        # once, taken through the four in ggml's order, and written once
        with for_range(b, 0, S, name="j") as j:
            row = b.gep(st.M, [b.mul(j, i64(S))])
            r = [b.fmul(b.load(_vec(b, row, i64(i)), align=4), decay) for i in range(0, S, 8)]
            dj = b.fmul(b.fsub(b.load(b.gep(st.v, [j])), _dot_rows(b, r, st.k)), beta)
            r = [fma(b, b.load(_vec(b, st.k, i64(8 * u)), align=4), broadcast(b, dj), r[u]) for u in range(len(r))]
            for u in range(len(r)):
                b.store(r[u], _vec(b, row, i64(8 * u)), align=4)
            b.store(b.fmul(_dot_rows(b, r, st.q), scale), b.gep(st.out, [j]))
    b.ret_void()
    return fn
