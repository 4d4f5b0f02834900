"""The passes, in order: the table of contents of compilation."""
from __future__ import annotations

from bankml.gguf.reader import ggml_type_name
from bankml.ir import verify
from bankml.ir.graph import Graph
from bankml.passes.choose_attention_kernel import choose_attention_kernel
from bankml.passes.choose_matmul_kernel import choose_matmul_kernel
from bankml.passes.choose_portable_orders import choose_portable_orders
from bankml.passes.place_on_device import place_on_device
from bankml.passes.remove_dead_nodes import remove_dead_nodes
from bankml.passes.share_portable_activations import share_portable_activations
from bankml.passes.share_quantized_activations import share_quantized_activations
from bankml.passes.skip_unused_rows import skip_unused_rows
from bankml.profiles.portable import orders as po
from bankml.quants import WEIGHT_TYPES
from bankml.quants.kv_cache import CACHE_TYPES

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


# the dtype names the IR verifier checks against (bankml/ir/verify.py)
TYPES = verify.Types(
    weight_name=ggml_type_name,
    act_type=lambda t: WEIGHT_TYPES[t].act_type if t in WEIGHT_TYPES else None,
    caches=frozenset(CACHE_TYPES) | {po.CACHE_TYPE},
    portable_act=po.ACT_TYPE,
)


def passes_of(g: Graph) -> list:
    """The passes of the graph's profile."""
    return PORTABLE_PASSES if g.meta.get("profile") == "portable" else PASSES


def run_passes(g: Graph, until: str | None = None) -> Graph:
    """All passes of the graph's profile, or those up to and including `until`; with
    verify.enabled() (tests, BANKML_DEBUG>=1) the builder's graph and each pass's are checked."""
    check = verify.enabled()
    if check:
        verify.check(g, "the builder", TYPES)
    for p in passes_of(g):
        g = p(g)
        if check:
            verify.check(g, p.__name__, TYPES)
        if p.__name__ == until:
            break
    return g
