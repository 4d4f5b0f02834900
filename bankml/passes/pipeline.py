"""The passes, in order: the table of contents of compilation."""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.passes.choose_attention_kernel import choose_attention_kernel
from bankml.passes.choose_matmul_kernel import choose_matmul_kernel
from bankml.passes.choose_portable_orders import choose_portable_orders
from bankml.passes.place_on_device import place_on_device
from bankml.passes.remove_dead_nodes import remove_dead_nodes
from bankml.passes.share_portable_activations import share_portable_activations
from bankml.passes.share_quantized_activations import share_quantized_activations
from bankml.passes.skip_unused_rows import skip_unused_rows

PASSES = [
    skip_unused_rows,
    choose_matmul_kernel,
    choose_attention_kernel,
    share_quantized_activations,
    place_on_device,
    remove_dead_nodes,
]

# the portable profile (g.meta["profile"]): its orders depend on no size, one pass attaches them
PORTABLE_PASSES = [
    skip_unused_rows,
    choose_portable_orders,
    share_portable_activations,
    remove_dead_nodes,
]


def run_passes(g: Graph, until: str | None = None) -> Graph:
    """All passes of the graph's profile, or those up to and including `until`."""
    for p in PORTABLE_PASSES if g.meta.get("profile") == "portable" else PASSES:
        g = p(g)
        if p.__name__ == until:
            break
    return g
