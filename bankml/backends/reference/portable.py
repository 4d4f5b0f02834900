"""The reference backend's lowerings for the portable profile: each op calls the numpy
definition in bankml/profiles/portable/ (the spec). Exact ops (inputs, weights, reshape,
get_rows of activations) are the ggml profile's lowerings; every other op checks that its
node carries the portable order and raises LoweringError otherwise.

The K/V cache of a layer is an array of rows of attention.cache_dtype(head_dim), one per
(cell, K/V head).
"""
from __future__ import annotations

import numpy as np

from bankml.errors import LoweringError
from bankml.ir.ops import Op
from bankml.profiles.portable import attention, funcs, orders as po, quant, rope
from bankml.profiles.portable.arith import add, mul


def _lowerings() -> dict:
    from bankml.backends.reference import run
    table = {op: run.LOWERINGS[op] for op in (Op.INPUT, Op.WEIGHT, Op.CACHE, Op.RESHAPE)}
    table.update(LOWERINGS)
    return table


LOWERINGS: dict = {}


def lowers(op: Op, order):
    def register(fn):
        def checked(env, g, n, *args):
            if n.order != order:
                got = n.order.describe() if n.order else "no order"
                raise LoweringError(f"portable profile: {n.op.value} {n.name or n.id} carries {got}, "
                                    f"not {order.kernel}")
            return fn(env, g, n, *args)
        LOWERINGS[op] = checked
        return fn
    return register


@lowers(Op.QUANTIZE, po.QUANTIZE)
def _quantize(env, g, n, x):
    return quant.quantize_act(x.reshape(-1, x.shape[-1]))


@lowers(Op.MUL_MAT, po.MUL_MAT)
def _mul_mat(env, g, n, w, a):
    wn = g[n.inputs[0]]
    y = quant.mul_mat(w, int(wn.params["ggml_type"]), a)
    return y.reshape(*n.shape[:-1], y.shape[-1])


def _get_rows_any(env, g, n, src, ids):
    w = g[n.inputs[0]]
    if w.op is Op.WEIGHT:
        if n.order != po.GET_ROWS:
            raise LoweringError(f"portable profile: get_rows {n.name or n.id} of a weight without {po.GET_ROWS.kernel}")
        return quant.get_rows(src[ids], int(w.params["ggml_type"]), w.shape[1])
    return src[ids]


LOWERINGS[Op.GET_ROWS] = _get_rows_any


@lowers(Op.RMS_NORM, po.RMS_NORM)
def _rms_norm(env, g, n, x):
    return funcs.rmsnorm(x, None, n.params["eps"])


@lowers(Op.MUL, po.ELEMENTWISE)
def _mul(env, g, n, x, w):
    return mul(x, w)


@lowers(Op.ADD, po.ELEMENTWISE)
def _add(env, g, n, a, b):
    return add(a, b)


@lowers(Op.ROPE, po.ROPE)
def _rope(env, g, n, x, pos):
    p = n.params
    if p["ext_factor"] != 0 or p["attn_factor"] != 1:
        raise LoweringError(f"portable profile: rope {n.name or n.id} with YaRN scaling is not defined")
    cos, sin = rope.rope_table(pos, p["n_dims"], p["freq_base"], p["freq_scale"])
    return rope.rope(x, cos, sin, p["mode"])


@lowers(Op.SET_ROWS, po.SET_ROWS)
def _set_rows(env, g, n, cache, values, pos):
    cache[pos] = attention.quantize_rows(values)
    return cache[: n.shape[0]]


@lowers(Op.FLASH_ATTN, po.FLASH_ATTN)
def _flash_attn(env, g, n, q, k, v, mask):
    return attention.attention(q, k, v, np.asarray(mask), n.params["scale"])


@lowers(Op.SWIGLU, po.SWIGLU)
def _swiglu(env, g, n, gate, up):
    return mul(funcs.silu(gate), up)
