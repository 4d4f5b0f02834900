"""The portable profile's float orders, attached by op (bankml/profiles/portable/orders.py).

No portable order depends on sizes or threads, so this one pass replaces what
choose_matmul_kernel, choose_attention_kernel and the builder's fixed orders do for ggml.
The K/V cache nodes become int8 rows with f16 scales (dtype "i8r"); a recurrent layer's state
stays f32. The ggml graph's L2 norm (build_gdn_l2_norm: rms_norm with eps/n, then a scale by
1/sqrt(n), marked l2_eps by the builder) becomes one L2_NORM node, the document's l2norm.
Under ActScaling PerBlock (g.meta["act_scaling"]) a MUL_MAT takes coded.dot_blocks' order and a
FLASH_ATTN quantizes each query head as one block.
"""
from __future__ import annotations

import numpy as np

from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import STATE_KINDS, Op
from bankml.profiles.portable import orders as po

_BY_OP = {Op.MUL_MAT: po.MUL_MAT, Op.RMS_NORM: po.RMS_NORM, Op.MUL: po.ELEMENTWISE, Op.ADD: po.ELEMENTWISE,
          Op.ROPE: po.ROPE, Op.SWIGLU: po.SWIGLU, Op.SET_ROWS: po.SET_ROWS, Op.FLASH_ATTN: po.FLASH_ATTN,
          Op.SILU: po.SILU, Op.SIGMOID: po.SIGMOID, Op.SOFTPLUS: po.SOFTPLUS, Op.SSM_CONV: po.SSM_CONV}


def choose_portable_orders(g: Graph) -> Graph:
    per_block = g.meta.get("act_scaling") == "PerBlock"

    def pick(n: Node) -> Node | None:
        if n.op in (Op.MUL_MAT, Op.FLASH_ATTN) and per_block:
            return n.replace(order=po.MUL_MAT_BLOCKS if n.op is Op.MUL_MAT else po.FLASH_ATTN_BLOCKS)
        if n.op is Op.GATED_DELTA_NET:          # the read-out's scale, 1.0f / sqrtf(S) as ggml's op takes it
            S = np.float32(n.shape[-1])
            return n.replace(order=po.GATED_DELTA_NET, params={**n.params, "scale": float(np.float32(1) / np.sqrt(S))})
        if n.op in _BY_OP:
            dtype = po.CACHE_TYPE if n.op is Op.SET_ROWS else n.dtype
            return n.replace(order=_BY_OP[n.op], dtype=dtype)
        if n.op is Op.SCALE and "l2_eps" in n.params:
            norm = g[n.inputs[0]]
            return n.replace(op=Op.L2_NORM, inputs=norm.inputs, order=po.L2_NORM, params={"eps": n.params["l2_eps"]})
        if n.op is Op.CACHE and n.params.get("kind") not in STATE_KINDS:
            return n.replace(dtype=po.CACHE_TYPE)
        if n.op is Op.GET_ROWS and g[n.inputs[0]].op is Op.WEIGHT:
            return n.replace(order=po.GET_ROWS)
        return None
    return g.map(pick)
