"""Remove nodes that neither an output nor a state write (set_rows) depends on."""
from __future__ import annotations

import networkx as nx

from bankml.ir.graph import Graph
from bankml.ir.ops import EFFECTS


def remove_dead_nodes(g: Graph) -> Graph:
    dg = g.digraph()
    roots = set(g.outputs.values()) | {n.id for n in g.nodes.values() if n.op in EFFECTS}
    live = set(roots)
    for r in roots:
        live |= nx.ancestors(dg, r)
    return Graph({i: n for i, n in g.nodes.items() if i in live}, dict(g.outputs), dict(g.meta))
