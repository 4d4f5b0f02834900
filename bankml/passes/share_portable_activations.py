"""One portable quantization of each activation, shared by every mul_mat that reads it.

The portable profile quantizes activations the same way for every weight type
(bankml/profiles/portable/quant.py:quantize_act), so Q, K, V share one quantize of
attn_norm, gate and up one of ffn_norm, whatever the weight types.
"""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po


def share_portable_activations(g: Graph) -> Graph:
    out = Graph(dict(g.nodes), dict(g.outputs), dict(g.meta))
    made: dict[int, Node] = {}
    for n in g:
        if n.op is not Op.MUL_MAT:
            continue
        w, x = g[n.inputs[0]], g[n.inputs[1]]
        if x.id not in made:
            made[x.id] = out.add(Node(out.next_id(), Op.QUANTIZE, (x.id,), x.shape, po.ACT_TYPE, order=po.QUANTIZE,
                                      params={"type": po.ACT_TYPE}))
        out.nodes[n.id] = n.replace(inputs=(w.id, made[x.id].id))
    return out
