"""The llvm kernels of the portable profile for Qwen3.5's ops (docs/PORTABLE.md, "Qwen3.5 in the
profile"), each the numpy spec of bankml/profiles/portable/ step for step with the emitters of
backends/llvm/portable/funcs.py, so its bits are the reference backend's
(backends/reference/portable.py) for every thread count:

- SILU, SIGMOID, SOFTPLUS  funcs.silu / sigmoid / softplus per element, 8 lanes (a tail of
  fewer one by one); threads split chunks of 8
- SSM_CONV  gdn.conv_sum per token and channel: the products of [state | x^T]'s columns t ..
  t + d_conv - 1 with the channel's taps, added in tap order from +0; then the state holds the
  last d_conv - 1 columns (canonical, as the spec's ring). Threads split the channels, 8 at a
  time (lanes are channels: no bit depends on it), the rest one by one
- GATED_DELTA_NET  gdn.gdn_row per token, v-head and value row: row·q and row·k as fdot (8
  lanes from -0.0 in index order, then the tree), coef = beta·(v - decay·(row·k)), the row
  decay·row + coef·k, the read-out (decay·(row·q) + coef·(k·q))·scale; decay = exp(g), k·q once
  per token and head. Threads split the v-heads (q/k head h % Hk).
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, for_range, i32, i64, new_function, size, thread_range, typed, v8f32
from bankml.backends.llvm.ggml.recurrent import Conv, conv_channels, gather8, head_token_steps
from bankml.backends.llvm.portable import funcs as pm
from bankml.backends.llvm.portable.ops import NEG0, _check, _load, _vstore
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po


def _unary(m: ir.Module, n: Node, step) -> ir.Function:
    """out[i] = step(x[i]) over the flat output: chunks of 8 split over threads, the tail (fewer
    than 8) on the last thread one by one."""
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, src, ith, nth, dims = fn.args
    py, px = typed(b, out, f32), typed(b, src, f32)
    total = size(b, dims, n.shape)
    chunks = b.sdiv(total, i64(8))
    lo, hi = thread_range(b, chunks, ith, nth)
    with for_range(b, lo, hi, name="c") as c:
        at = b.mul(c, i64(8))
        _vstore(b, step(b, _load(b, px, at, v8f32)), py, at)
    with b.if_then(b.icmp_signed("==", ith, b.sub(nth, i64(1)))):
        with for_range(b, b.mul(chunks, i64(8)), total, name="t") as t:
            b.store(step(b, _load(b, px, t)), b.gep(py, [t]))
    b.ret_void()
    return fn


@kernel(Op.SILU, order=po.SILU, profile="portable")
def define_silu(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SILU)
    return _unary(m, n, pm.silu)


@kernel(Op.SIGMOID, order=po.SIGMOID, profile="portable")
def define_sigmoid(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SIGMOID)
    return _unary(m, n, pm.sigmoid)


@kernel(Op.SOFTPLUS, order=po.SOFTPLUS, profile="portable")
def define_softplus(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SOFTPLUS)
    return _unary(m, n, pm.softplus)


def _gather8(b: ir.IRBuilder, p: ir.Value, stride: int) -> ir.Value:
    """<p[0], p[stride], ..., p[7 * stride]>, canonical."""
    return pm.canon(b, gather8(b, p, stride))


@kernel(Op.SSM_CONV, order=po.SSM_CONV, profile="portable")
def define_ssm_conv(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.SSM_CONV)
    fn, b = new_function(m, kernel_name(n), kernel_type(n))

    def channels(k: Conv, c: ir.Value, lanes: int) -> None:
        """Channels c .. c + lanes - 1 (lanes 8 or 1) through every token, then their state rows."""
        ys, xs, ss, ch, nc, keep = k.ys, k.xs, k.ss, k.ch, k.nc, k.keep
        t_ = v8f32 if lanes == 8 else f32
        srow, wrow = b.gep(ss, [b.mul(c, i64(keep))]), b.gep(k.ws, [b.mul(c, i64(nc))])
        if lanes == 8:
            w = [_gather8(b, b.gep(wrow, [i64(i)]), nc) for i in range(nc)]
        else:
            w = [_load(b, wrow, i64(i)) for i in range(nc)]

        def column(j: ir.Value) -> ir.Value:           # [state | x^T][c ..][j], canonical
            from_state = b.icmp_signed("<", j, i64(keep))
            st = _gather8(b, b.gep(srow, [b.select(from_state, j, i64(0))]), keep) if lanes == 8 else \
                _load(b, srow, b.select(from_state, j, i64(0)))
            xi = b.select(from_state, i64(0), b.sub(j, i64(keep)))
            x = _load(b, xs, b.add(b.mul(xi, i64(ch)), c), t_)
            return b.select(from_state, st, x)

        with for_range(b, 0, k.T, name="t") as t:
            acc = pm.const(t_, 0.0)
            for i in range(nc):
                acc = pm.add(b, acc, pm.mul(b, column(b.add(t, i64(i))), w[i]))
            at = b.add(b.mul(t, i64(ch)), c)
            if lanes == 8:
                _vstore(b, acc, ys, at)
            else:
                b.store(acc, b.gep(ys, [at]))
        cols = [column(b.add(k.T, i64(j))) for j in range(keep)]     # read all before writing any
        for j, col in enumerate(cols):
            for i in range(lanes):
                x = b.extract_element(col, i32(i)) if lanes == 8 else col
                b.store(x, b.gep(srow, [i64(i * keep + j)]))

    conv_channels(b, g, n, fn, channels)
    b.ret_void()
    return fn


def _fdot(b: ir.IRBuilder, a: list[ir.Value], p: ir.Value) -> ir.Value:
    """arith.fdot of the 8-lane vectors a and the floats at p (canonical): lane sums from -0.0 in
    index order, then the tree."""
    acc = pm.const(v8f32, NEG0)
    for u, x in enumerate(a):
        acc = pm.add(b, acc, pm.mul(b, x, _load(b, p, i64(8 * u), v8f32)))
    return pm.tree(b, acc)


@kernel(Op.GATED_DELTA_NET, order=po.GATED_DELTA_NET, profile="portable")
def define_gated_delta_net(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, po.GATED_DELTA_NET)
    S = n.shape[-1]
    if S % 8:
        raise LoweringError(f"llvm portable profile: gated_delta_net {n.name or n.id}: heads of {S}, "
                            "not a multiple of 8")
    scale = f32(float(n.params["scale"]))
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    with head_token_steps(b, g, n, fn) as st:
        kv = [_load(b, st.k, i64(i), v8f32) for i in range(0, S, 8)]
        kq = _fdot(b, kv, st.q)
        decay = pm.exp(b, _load(b, st.g, st.th))
        beta = _load(b, st.beta, st.th)
        d8 = pm.splat(b, decay, v8f32)
        with for_range(b, 0, S, name="r") as r:
            row = b.gep(st.M, [b.mul(r, i64(S))])
            rv = [_load(b, row, i64(i), v8f32) for i in range(0, S, 8)]
            rq, rk = _fdot(b, rv, st.q), _fdot(b, rv, st.k)
            coef = pm.mul(b, beta, pm.sub(b, _load(b, st.v, r), pm.mul(b, decay, rk)))
            c8 = pm.splat(b, coef, v8f32)
            for u in range(len(rv)):
                _vstore(b, pm.add(b, pm.mul(b, d8, rv[u]), pm.mul(b, c8, kv[u])), row, i64(8 * u))
            y = pm.mul(b, pm.add(b, pm.mul(b, decay, rq), pm.mul(b, coef, kq)), scale)
            b.store(y, b.gep(st.out, [r]))
    b.ret_void()
    return fn
