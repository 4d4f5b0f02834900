"""The reference backend's lowerings for the portable profile: each op calls the numpy
definition in bankml/profiles/portable/ (the spec). Exact ops (inputs, weights, caches,
reshape) are ggml.py's; every other op is registered under its portable order, so a node that
carries another order finds no lowering.

The K/V cache of a layer is an array of rows of attention.cache_dtype(head_dim), one per
(cell, K/V head). A Qwen3.5 layer's recurrent states (the conv ring, the Gated-DeltaNet rows)
are f32 arrays that SSM_CONV and GATED_DELTA_NET update in place, token by token.
"""
from __future__ import annotations

import numpy as np

from bankml.backends.reference.lowerings import lowers
from bankml.errors import LoweringError
from bankml.ir.ops import Op
from bankml.profiles.portable import arith, attention, coded, funcs, gdn, orders as po, quant, rotary
from bankml.profiles.portable.arith import add, mul


@lowers(Op.QUANTIZE, order=po.QUANTIZE, profile="portable")
def _quantize(env, g, n, x):
    return quant.quantize_act(x.reshape(-1, x.shape[-1]))


@lowers(Op.MUL_MAT, order=po.MUL_MAT, profile="portable")
def _mul_mat(env, g, n, w, a):
    wn = g[n.inputs[0]]
    y = coded.dot_sub32(w, int(wn.params["ggml_type"]), a)
    return y.reshape(*n.shape[:-1], y.shape[-1])


@lowers(Op.QUANTIZE, order=po.QUANTIZE_BLOCKS, profile="portable")
def _quantize_blocks(env, g, n, x):
    return quant.quantize_blocks(x.reshape(-1, x.shape[-1]), n.params["block"])


@lowers(Op.MUL_MAT, order=po.MUL_MAT_BLOCKS, profile="portable")
def _mul_mat_blocks(env, g, n, w, a):
    wn = g[n.inputs[0]]
    y = coded.dot_blocks(w, int(wn.params["ggml_type"]), a)
    return y.reshape(*n.shape[:-1], y.shape[-1])


@lowers(Op.GET_ROWS, order=po.GET_ROWS, profile="portable")
def _get_rows(env, g, n, src, ids):
    w = g[n.inputs[0]]
    if w.op is not Op.WEIGHT:
        raise LoweringError(f"portable profile: get_rows {n.name or n.id} of an activation carries {po.GET_ROWS.kernel}")
    return coded.get_rows(src[ids], int(w.params["ggml_type"]), w.shape[1])


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
    """The first n_dims of each head rotated (Qwen3.5's partial rope), the rest as they are."""
    p = n.params
    if p["ext_factor"] != 0 or p["attn_factor"] != 1:
        raise LoweringError(f"portable profile: rope {n.name or n.id} with YaRN scaling is not defined")
    nd = p["n_dims"]
    cos, sin = rotary.rope_table(pos, nd, p["freq_base"], p["freq_scale"])
    y = rotary.rope(x[..., :nd], cos, sin, p["mode"])
    return y if nd == x.shape[-1] else np.concatenate([y, arith.canon(x[..., nd:])], axis=-1)


@lowers(Op.SET_ROWS, order=po.SET_ROWS, profile="portable")
def _set_rows(env, g, n, cache, values, pos):
    cache[pos] = attention.cache_row(values)
    return cache[: n.shape[0]]


@lowers(Op.FLASH_ATTN, order=po.FLASH_ATTN, profile="portable")
def _flash_attn(env, g, n, q, k, v, mask):
    return attention.attention(q, k, v, np.asarray(mask), n.params["scale"])


@lowers(Op.FLASH_ATTN, order=po.FLASH_ATTN_BLOCKS, profile="portable")
def _flash_attn_blocks(env, g, n, q, k, v, mask):
    return attention.attention(q, k, v, np.asarray(mask), n.params["scale"], quant.ActScaling.PER_BLOCK)


@lowers(Op.SWIGLU, order=po.SWIGLU, profile="portable")
def _swiglu(env, g, n, gate, up):
    return mul(funcs.silu(gate), up)


@lowers(Op.SILU, order=po.SILU, profile="portable")
def _silu(env, g, n, x):
    return funcs.silu(x)


@lowers(Op.SIGMOID, order=po.SIGMOID, profile="portable")
def _sigmoid(env, g, n, x):
    return funcs.sigmoid(x)


@lowers(Op.SOFTPLUS, order=po.SOFTPLUS, profile="portable")
def _softplus(env, g, n, x):
    return funcs.softplus(x)


@lowers(Op.L2_NORM, order=po.L2_NORM, profile="portable")
def _l2_norm(env, g, n, x):
    return funcs.l2norm(x, n.params["eps"])


@lowers(Op.SSM_CONV, order=po.SSM_CONV, profile="portable")
def _ssm_conv(env, g, n, x, w, state):
    """gdn.conv_sum token by token; the state [ch, d_conv - 1] (the ring, oldest column first)
    is left holding the last d_conv - 1 tokens (canonical, as the spec reads them), in place."""
    ring = arith.canon(np.asarray(state).T)
    out = np.empty(x.shape, np.float32)
    for t in range(x.shape[0]):
        out[t] = gdn.conv_sum(ring, x[t], w)
        ring = np.concatenate([ring[1:], arith.canon(x[t])[None]])
    state[...] = ring.T
    return out


@lowers(Op.GATED_DELTA_NET, order=po.GATED_DELTA_NET, profile="portable")
def _gated_delta_net(env, g, n, q, k, v, gate, beta, state):
    """gdn.gdn_row token by token, for every v-head h (its q/k head h % Hk, as ggml reads them) and
    value row of the state [Hv, S, S] (row r: value r's key-sized weights), updated in place;
    decay exp(g), scale 1/sqrtf(S) (the attention scale's constant)."""
    hk, scale = q.shape[1], np.float32(n.params["scale"])
    out = np.empty(v.shape, np.float32)
    heads = np.arange(v.shape[1]) % hk
    for t in range(v.shape[0]):
        qt, kt = q[t, heads], k[t, heads]                      # [Hv, S]
        kq = arith.fdot(kt, qt)
        decay = funcs.exp(gate[t])
        for h in range(v.shape[1]):
            out[t, h] = gdn.gdn_row(state[h], kt[h], qt[h], v[t, h], decay[h], beta[t, h], kq[h], scale)
    return out
