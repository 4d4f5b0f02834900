"""The reference backend's lowerings of the ggml profile: each op calls the numpy spec of its
float order in the modules beside this file (matmul, norm, rope, attention, glu). The exact ops
(inputs, weights, caches, reshape) serve both profiles.
"""
from __future__ import annotations

import numpy as np

from bankml.backends.reference import attention, attention_quant, glu, matmul, norm, recurrent, rope
from bankml.backends.reference.lowerings import lowers
from bankml.ir import order as fo
from bankml.ir.ops import Op
from bankml.passes.choose_attention_kernel import attention_order
from bankml.quants import WEIGHT_TYPES

BOTH = ("ggml", "portable")


@lowers(Op.INPUT, profile=BOTH)
def _input(env, g, n):
    return env.inputs[n.params["input"]]


@lowers(Op.WEIGHT, profile=BOTH)
def _weight(env, g, n):
    return env.weights(n.params["tensor"])


@lowers(Op.CACHE, profile=BOTH)
def _cache(env, g, n):
    """The session's cache; in a batch of sequences (param seqs) the list of each row's."""
    return env.caches[(n.params["layer"], n.params["kind"])]


@lowers(Op.GET_ROWS)
def _get_rows(env, g, n, src, ids):
    w = g[n.inputs[0]]
    if w.op is Op.WEIGHT:                 # token embeddings: dequantize the rows (ggml-base to_float)
        return WEIGHT_TYPES[w.params["ggml_type"]].dequantize(src[ids], w.shape[1])
    return src[ids]


@lowers(Op.RMS_NORM, order=fo.RMS_NORM)
def _rms_norm(env, g, n, x):
    return norm.rms_norm(x.reshape(-1, x.shape[-1]), n.params["eps"], n.order).reshape(x.shape)


@lowers(Op.MUL, order=fo.ELEMENTWISE)
def _mul(env, g, n, x, w):
    return norm.mul(x, w, n.order)


@lowers(Op.ADD, order=fo.ELEMENTWISE)
def _add(env, g, n, a, b):
    return glu.add(a, b)


@lowers(Op.QUANTIZE)
def _quantize(env, g, n, x):
    return matmul.quantize_activation(x.reshape(-1, x.shape[-1]), n.params["type"])


@lowers(Op.MUL_MAT, order=fo.MUL_MAT_ORDERS)
def _mul_mat(env, g, n, w, x):
    wn = g[n.inputs[0]]
    lead = n.shape[:-1]
    y, gpu = None, getattr(env, "gpu", None)      # backends/spirv/device.py: decode's Q1_0 matvecs on Vulkan
    if gpu is not None and "device" in n.params:    # placed there by passes/place_on_device.py
        y = gpu.gpu_matvec(wn.params["tensor"], w, x)   # None when the device kernel does not fit
    if y is None and n.params.get("per_column"):     # a batch of sequences: each column as one alone
        y = np.concatenate([matmul.mul_mat(w, wn.params["ggml_type"], _column(x, i), n.order)
                            for i in range(_columns(x))])
    if y is None:
        y = matmul.mul_mat(w, wn.params["ggml_type"], x, n.order)
    return y.reshape(*lead, y.shape[-1])


def _columns(x) -> int:
    return (x.q if isinstance(x, tuple) else x.reshape(-1, x.shape[-1])).shape[0]


def _column(x, i: int):
    """Column i of a mul_mat's activation: f32/f16 rows, or a quantized Q8Act / Q8KAct."""
    if isinstance(x, tuple):
        return type(x)(*(None if a is None else a[i:i + 1] for a in x))
    return x.reshape(-1, x.shape[-1])[i:i + 1]


@lowers(Op.RESHAPE, profile=BOTH)
def _reshape(env, g, n, x):
    return x.reshape(n.shape)


@lowers(Op.ROPE, order=fo.ROPE)
def _rope(env, g, n, x, pos):
    p = n.params
    cos, sin = rope.rope_cache(pos, p["n_dims"], p["freq_base"], p["freq_scale"], p["ext_factor"],
                               p["attn_factor"], p["beta_fast"], p["beta_slow"], p["n_ctx_orig"])
    return rope.rope(x, cos, sin, p["mode"], n.order)


@lowers(Op.SET_ROWS, order=(fo.SET_ROWS_F16, fo.SET_ROWS_Q8_0, fo.SET_ROWS_Q4_0))
def _set_rows(env, g, n, cache, values, pos):
    if g[n.inputs[0]].params.get("seqs"):        # row t into its own sequence's cache, at its position
        for t, (c, p) in enumerate(zip(cache, pos)):
            c[p] = values[t].astype(np.float16)
        return cache
    if n.dtype == "f16":
        cache[pos] = values.astype(np.float16)      # ggml_cpu_fp32_to_fp16: RNE
    else:                                           # a quantized cache: quantize_row_q8_0 / _q4_0_ref
        cache[pos] = attention_quant.quantize_rows(values.reshape(len(pos), -1), n.dtype)
    return cache[: n.shape[0]]


@lowers(Op.FLASH_ATTN, order=(fo.FA_REFERENCE, fo.FA_TILED, fo.FA_SPLIT, *fo.FA_QUANT_CACHE))
def _flash_attn(env, g, n, q, k, v, mask):
    kn, vn = g[n.inputs[1]], g[n.inputs[2]]
    if (kn.dtype, vn.dtype) != ("f16", "f16"):
        return attention_quant.flash_attn_quant(q, k, v, kn.dtype, vn.dtype, kn.shape[1], mask, n.params["scale"],
                                                n.order)
    return attention.flash_attn(q, k, v, mask, n.params["scale"], n.order, n.params.get("n_threads", 1))


@lowers(Op.FLASH_ATTN, order=fo.FA_ROWS)
def _flash_attn_rows(env, g, n, q, k, v, mask, cells):
    """A batch of sequences: row t over the first cells[t] cells of its own caches, by the kernel
    its decode takes alone (choose_attention_kernel.attention_order of one row and its cells)."""
    return np.concatenate([attention.flash_attn(q[t:t + 1], k[t][:c], v[t][:c], mask[t:t + 1, :c], n.params["scale"],
                                                attention_order(1, int(c)), n.params["n_threads"])
                           for t, c in enumerate(cells)])


@lowers(Op.HADAMARD, order=fo.FWHT)
def _hadamard(env, g, n, x):
    return attention_quant.fwht(x, n.params["n"])


@lowers(Op.SWIGLU, order=fo.SWIGLU)
def _swiglu(env, g, n, gate, up):
    return glu.swiglu(gate, up, n.order)


@lowers(Op.GEGLU, order=fo.GEGLU)
def _geglu(env, g, n, gate, up):
    return glu.geglu(gate, up, n.order)


@lowers(Op.SLICE, profile=BOTH)
def _slice(env, g, n, x):
    return np.ascontiguousarray(x[..., n.params["lo"]:n.params["hi"]])


@lowers(Op.SILU, order=fo.SILU)
def _silu(env, g, n, x):
    return glu.silu(x, n.order)


@lowers(Op.SIGMOID, order=fo.SIGMOID)
def _sigmoid(env, g, n, x):
    return glu.sigmoid(x, n.order)


@lowers(Op.SOFTPLUS, order=fo.SOFTPLUS)
def _softplus(env, g, n, x):
    return glu.softplus(x, n.order)


@lowers(Op.SSM_CONV, order=fo.SSM_CONV)
def _ssm_conv(env, g, n, x, w, state):
    """The state cache is written in place, as set_rows writes the K/V cache."""
    return recurrent.ssm_conv_step(x, w, state)


@lowers(Op.GATED_DELTA_NET, order=fo.GATED_DELTA_NET)
def _gated_delta_net(env, g, n, q, k, v, gate, beta, state):
    return recurrent.gated_delta_net_step(q, k, v, gate, beta, state)


@lowers(Op.SCALE, order=fo.SCALE)
def _scale(env, g, n, x):
    return glu.scale(x, n.params["scale"], n.order)
