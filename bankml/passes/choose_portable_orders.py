"""The portable profile's float orders, attached by op (bankml/profiles/portable/orders.py).

No portable order depends on sizes or threads, so this one pass replaces what
choose_matmul_kernel, choose_attention_kernel and the builder's fixed orders do for ggml.
The K/V cache nodes become int8 rows with f16 scales (dtype "i8r").
"""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po

_BY_OP = {Op.MUL_MAT: po.MUL_MAT, Op.RMS_NORM: po.RMS_NORM, Op.MUL: po.ELEMENTWISE, Op.ADD: po.ELEMENTWISE,
          Op.ROPE: po.ROPE, Op.SWIGLU: po.SWIGLU, Op.SET_ROWS: po.SET_ROWS, Op.FLASH_ATTN: po.FLASH_ATTN}


def choose_portable_orders(g: Graph) -> Graph:
    def pick(n: Node) -> Node | None:
        if n.op in _BY_OP:
            dtype = po.CACHE_TYPE if n.op is Op.SET_ROWS else n.dtype
            return n.replace(order=_BY_OP[n.op], dtype=dtype)
        if n.op is Op.CACHE:
            return n.replace(dtype=po.CACHE_TYPE)
        if n.op is Op.GET_ROWS and g[n.inputs[0]].op is Op.WEIGHT:
            return n.replace(order=po.GET_ROWS)
        return None
    return g.map(pick)
