"""The reference backend: runs an IR graph in numpy, one lowering per op.

Each lowering follows the node's FloatOrder through the kernel modules beside this file
(matmul, norm, rope, attention, glu); it is the readable spec of every op's bits.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from bankml.backends.reference import attention, attention_quant, glu, matmul, norm, rope
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FWHT
from bankml.quants import WEIGHT_TYPES

LOWERINGS: dict[Op, Callable] = {}


def lowers(op: Op):
    def register(fn):
        LOWERINGS[op] = fn
        return fn
    return register


class Env:
    """What a graph reads and writes besides its nodes: weights, K/V caches, inputs."""

    def __init__(self, weights: Callable[[str], np.ndarray], caches: dict, inputs: dict):
        self.weights, self.caches, self.inputs = weights, caches, inputs


class ReferenceBackend:
    """The reference backend behind the runtime's interface (bankml.backends): a generic graph
    is made concrete for each call's sizes, then run in numpy."""

    def __init__(self, weights: Callable[[str], np.ndarray], gpu=None):
        self.weights, self.gpu = weights, gpu

    def prepare(self, g: Graph) -> float:
        return 0.0

    def run(self, g: Graph, values, inputs: dict, caches: dict, trace=None) -> dict[str, np.ndarray]:
        env = Env(self.weights, caches, inputs)
        env.gpu = self.gpu
        return run(g.instantiate(values) if values else g, env, trace)

    def close(self) -> None:
        pass


def run(g: Graph, env: Env, trace: Callable[[Node, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
    """Execute g; returns its outputs by key. trace(node, value) sees every named node."""
    vals: dict[int, np.ndarray] = {}
    table = LOWERINGS
    if g.meta.get("profile") == "portable":
        from bankml.backends.reference.portable import _lowerings
        table = _lowerings()
    for n in g:
        fn = table.get(n.op)
        if fn is None:
            raise LoweringError(f"no reference lowering for {n.op.value} ({n.name or n.id})")
        vals[n.id] = fn(env, g, n, *(vals[i] for i in n.inputs))
        if trace is not None and n.name and n.op not in (Op.WEIGHT, Op.CACHE, Op.INPUT):
            trace(n, vals[n.id])
    return {k: vals[i] for k, i in g.outputs.items()}


@lowers(Op.INPUT)
def _input(env, g, n):
    return env.inputs[n.params["input"]]


@lowers(Op.WEIGHT)
def _weight(env, g, n):
    return env.weights(n.params["tensor"])


@lowers(Op.CACHE)
def _cache(env, g, n):
    return env.caches[(n.params["layer"], n.params["kind"])]


@lowers(Op.GET_ROWS)
def _get_rows(env, g, n, src, ids):
    w = g[n.inputs[0]]
    if w.op is Op.WEIGHT:                 # token embeddings: dequantize the rows (ggml-base to_float)
        return WEIGHT_TYPES[w.params["ggml_type"]].dequantize(src[ids], w.shape[1])
    return src[ids]


@lowers(Op.RMS_NORM)
def _rms_norm(env, g, n, x):
    return norm.rms_norm(x.reshape(-1, x.shape[-1]), n.params["eps"], n.order).reshape(x.shape)


@lowers(Op.MUL)
def _mul(env, g, n, x, w):
    return norm.mul(x, w, n.order)


@lowers(Op.ADD)
def _add(env, g, n, a, b):
    return glu.add(a, b)


@lowers(Op.QUANTIZE)
def _quantize(env, g, n, x):
    return matmul.quantize_activation(x.reshape(-1, x.shape[-1]), n.params["type"])


@lowers(Op.MUL_MAT)
def _mul_mat(env, g, n, w, x):
    wn = g[n.inputs[0]]
    lead = n.shape[:-1]
    y, gpu = None, getattr(env, "gpu", None)      # runtime/gpu.py: decode's Q1_0 matvecs on Vulkan
    if gpu is not None and gpu.takes(g, n):
        y = gpu.gpu_matvec(wn.params["tensor"], w, x)   # None when the device kernel does not fit
    if y is None:
        y = matmul.mul_mat(w, wn.params["ggml_type"], x, n.order)
    return y.reshape(*lead, y.shape[-1])


@lowers(Op.RESHAPE)
def _reshape(env, g, n, x):
    return x.reshape(n.shape)


@lowers(Op.ROPE)
def _rope(env, g, n, x, pos):
    p = n.params
    cos, sin = rope.rope_cache(pos, p["n_dims"], p["freq_base"], p["freq_scale"], p["ext_factor"],
                               p["attn_factor"], p["beta_fast"], p["beta_slow"], p["n_ctx_orig"])
    return rope.rope(x, cos, sin, p["mode"], n.order)


@lowers(Op.SET_ROWS)
def _set_rows(env, g, n, cache, values, pos):
    if n.dtype == "f16":
        cache[pos] = values.astype(np.float16)      # ggml_cpu_fp32_to_fp16: RNE
    else:                                           # a quantized cache: quantize_row_q8_0 / _q4_0_ref
        cache[pos] = attention_quant.quantize_rows(values.reshape(len(pos), -1), n.dtype)
    return cache[: n.shape[0]]


@lowers(Op.FLASH_ATTN)
def _flash_attn(env, g, n, q, k, v, mask):
    kn, vn = g[n.inputs[1]], g[n.inputs[2]]
    if (kn.dtype, vn.dtype) != ("f16", "f16"):
        return attention_quant.flash_attn_quant(q, k, v, kn.dtype, vn.dtype, kn.shape[1], mask, n.params["scale"],
                                                n.order)
    return attention.flash_attn(q, k, v, mask, n.params["scale"], n.order, n.params.get("n_threads", 1))


@lowers(Op.HADAMARD)
def _hadamard(env, g, n, x):
    if n.order != FWHT:
        raise LoweringError(f"hadamard {n.name or n.id}: no reference lowering for {n.order}")
    return attention_quant.fwht(x, n.params["n"])


@lowers(Op.SWIGLU)
def _swiglu(env, g, n, gate, up):
    return glu.swiglu(gate, up, n.order)


@lowers(Op.GEGLU)
def _geglu(env, g, n, gate, up):
    return glu.geglu(gate, up, n.order)


@lowers(Op.SCALE)
def _scale(env, g, n, x):
    return glu.scale(x, n.params["scale"], n.order)
