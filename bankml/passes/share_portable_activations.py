"""One portable quantization of each activation, shared by every mul_mat that reads it.

The portable profile quantizes activations the same way for every weight type
(bankml/profiles/portable/quant.py:quantize_act), so Q, K, V share one quantize of
attn_norm, gate and up one of ffn_norm, whatever the weight types. Under ActScaling PerBlock
(g.meta["act_scaling"]) an activation is quantized per the weight's own block (quant.
quantize_blocks), so the mul_mats that read it share one quantize per block size, and a weight
without a block (F16) is refused, naming it.
"""
from __future__ import annotations

from bankml.errors import BankmlError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import coded, orders as po
from bankml.profiles.portable.quant import QK


def share_portable_activations(g: Graph) -> Graph:
    out = Graph(dict(g.nodes), dict(g.outputs), dict(g.meta))
    per_block = g.meta.get("act_scaling") == "PerBlock"
    made: dict[tuple[int, int], Node] = {}
    for n in g:
        if n.op is not Op.MUL_MAT:
            continue
        w, x = g[n.inputs[0]], g[n.inputs[1]]
        block = _block(w) if per_block else QK
        if (x.id, block) not in made:
            order, params = (po.QUANTIZE_BLOCKS, {"type": po.ACT_TYPE, "block": block}) if per_block else \
                (po.QUANTIZE, {"type": po.ACT_TYPE})
            made[x.id, block] = out.add(Node(out.next_id(), Op.QUANTIZE, (x.id,), x.shape, po.ACT_TYPE, order=order,
                                             params=params))
        out.nodes[n.id] = n.replace(inputs=(w.id, made[x.id, block].id))
    return out


def _block(w: Node) -> int:
    """The block a PerBlock activation takes against weight w: its format's own."""
    try:
        return coded.block_of(int(w.params["ggml_type"]))
    except ValueError:
        raise BankmlError(f"tensor {w.name} is {w.dtype}: ActScaling PerBlock reads block formats (its scales "
                          f"are the weight blocks'); F16 has no block (docs/PORTABLE.md)") from None
