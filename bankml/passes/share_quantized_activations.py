"""One quantized activation per (activation, vec_dot type), shared by every mul_mat reading it.

ggml-cpu/ggml-cpu.c:ggml_compute_forward_mul_mat converts src1 to the weight's vec_dot type
for each mul_mat; the bits are the same each time, so Q, K and V share one conversion of
attn_norm, and gate and up share one of ffn_norm.
"""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.quants import ACT_TYPES, WEIGHT_TYPES


def share_quantized_activations(g: Graph) -> Graph:
    out = Graph(dict(g.nodes), dict(g.outputs), dict(g.meta))
    made: dict[tuple[int, int], Node] = {}
    for n in g:
        if n.op is not Op.MUL_MAT:
            continue
        w, x = g[n.inputs[0]], g[n.inputs[1]]
        act = WEIGHT_TYPES[w.params["ggml_type"]].act_type
        key = (x.id, act)
        if key not in made:
            made[key] = out.add(Node(out.next_id(), Op.QUANTIZE, (x.id,), x.shape, ACT_TYPES[act].name, params={"type": act}))
        out.nodes[n.id] = n.replace(inputs=(w.id, made[key].id))
    return out
