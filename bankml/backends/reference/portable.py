"""The reference backend's lowerings for the portable profile: each op calls the numpy
definition in bankml/profiles/portable/ (the spec). Exact ops (inputs, weights, caches,
reshape) are ggml.py's; every other op is registered under its portable order, so a node that
carries another order finds no lowering.

The K/V cache of a layer is an array of rows of attention.cache_dtype(head_dim), one per
(cell, K/V head).
"""
from __future__ import annotations

import numpy as np

from bankml.backends.reference.lowerings import lowers
from bankml.errors import LoweringError
from bankml.ir.ops import Op
from bankml.profiles.portable import attention, funcs, orders as po, quant, rope
from bankml.profiles.portable.arith import add, mul


@lowers(Op.QUANTIZE, order=po.QUANTIZE, profile="portable")
def _quantize(env, g, n, x):
    return quant.quantize_act(x.reshape(-1, x.shape[-1]))


@lowers(Op.MUL_MAT, order=po.MUL_MAT, profile="portable")
def _mul_mat(env, g, n, w, a):
    wn = g[n.inputs[0]]
    y = quant.mul_mat(w, int(wn.params["ggml_type"]), a)
    return y.reshape(*n.shape[:-1], y.shape[-1])


@lowers(Op.GET_ROWS, order=po.GET_ROWS, profile="portable")
def _get_rows(env, g, n, src, ids):
    w = g[n.inputs[0]]
    if w.op is not Op.WEIGHT:
        raise LoweringError(f"portable profile: get_rows {n.name or n.id} of an activation carries {po.GET_ROWS.kernel}")
    return quant.get_rows(src[ids], int(w.params["ggml_type"]), w.shape[1])


@lowers(Op.GET_ROWS, profile="portable")
def _get_rows_of_rows(env, g, n, src, ids):
    if g[n.inputs[0]].op is Op.WEIGHT:
        raise LoweringError(f"portable profile: get_rows {n.name or n.id} of a weight without {po.GET_ROWS.kernel}")
    return src[ids]


@lowers(Op.RMS_NORM, order=po.RMS_NORM, profile="portable")
def _rms_norm(env, g, n, x):
    return funcs.rmsnorm(x, None, n.params["eps"])


@lowers(Op.MUL, order=po.ELEMENTWISE, profile="portable")
def _mul(env, g, n, x, w):
    return mul(x, w)


@lowers(Op.ADD, order=po.ELEMENTWISE, profile="portable")
def _add(env, g, n, a, b):
    return add(a, b)


@lowers(Op.ROPE, order=po.ROPE, profile="portable")
def _rope(env, g, n, x, pos):
    p = n.params
    if p["ext_factor"] != 0 or p["attn_factor"] != 1:
        raise LoweringError(f"portable profile: rope {n.name or n.id} with YaRN scaling is not defined")
    cos, sin = rope.rope_table(pos, p["n_dims"], p["freq_base"], p["freq_scale"])
    return rope.rope(x, cos, sin, p["mode"])


@lowers(Op.SET_ROWS, order=po.SET_ROWS, profile="portable")
def _set_rows(env, g, n, cache, values, pos):
    cache[pos] = attention.cache_row(values)
    return cache[: n.shape[0]]


@lowers(Op.FLASH_ATTN, order=po.FLASH_ATTN, profile="portable")
def _flash_attn(env, g, n, q, k, v, mask):
    return attention.attention(q, k, v, np.asarray(mask), n.params["scale"])


@lowers(Op.SWIGLU, order=po.SWIGLU, profile="portable")
def _swiglu(env, g, n, gate, up):
    return mul(funcs.silu(gate), up)
