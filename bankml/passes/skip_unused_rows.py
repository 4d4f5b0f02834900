"""Drop the last layer's get_rows when every row is an output (out_ids is 0..n-1).

src/llama-graph.cpp:build_inp_out_ids always makes out_ids and both architectures gather
the last layer's rows with it; when all rows are wanted that gather copies every row in
order, so it can go. With fewer outputs it stays: the last layer's FFN, the output norm and
the logits then run on n_outputs rows only (which changes the F16 mul_mat path).
"""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.ir.ops import Op


def skip_unused_rows(g: Graph) -> Graph:
    if g.meta["n_outputs"] != g.meta["n_tokens"] or not g.meta.get("outputs_in_order", True):
        return g
    out = Graph(dict(g.nodes), dict(g.outputs), dict(g.meta))
    forward = {n.id: n.inputs[0] for n in g.nodes.values()
               if n.op is Op.GET_ROWS and g[n.inputs[0]].op is not Op.WEIGHT}
    for n in g.nodes.values():
        if any(i in forward for i in n.inputs):
            out.nodes[n.id] = n.replace(inputs=tuple(forward.get(i, i) for i in n.inputs))
    for i in forward:
        del out.nodes[i]
    return out
