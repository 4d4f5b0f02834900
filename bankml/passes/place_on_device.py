"""Which nodes run on the model's device (g.meta["device"], set by the model when it has one).

The rule (docs/spirv.md, backends/spirv/device.py): a mul_mat of a Q1_0 weight in ggml's vec_dot
order (Q1_0_DOT, ggml_vec_dot_q1_0_q8_0, what choose_matmul_kernel gives Q1_0) by one activation
row, as a decode step has, runs on the device; the device's kernel has the same bits. Such a
node gets params["device"] = the graph's device; the backends run it there, and with its CPU
kernel when the device kernel does not take its shape. Without a device the graph is unchanged.
"""
from __future__ import annotations

import math

from bankml.ir.dims import is_symbolic
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import Q1_0_DOT


def place_on_device(g: Graph) -> Graph:
    device = g.meta.get("device")
    if device is None:
        return g

    def place(n: Node) -> Node | None:
        if (n.order is Q1_0_DOT and g[n.inputs[0]].op is Op.WEIGHT and not is_symbolic(n.shape)
                and math.prod(n.shape[:-1]) == 1):
            return n.replace(params={**n.params, "device": device})
        return None
    return g.map(place, Op.MUL_MAT)
