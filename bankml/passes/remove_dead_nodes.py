"""Remove nodes that neither an output nor a state write (set_rows) depends on."""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.ir.ops import EFFECTS


def remove_dead_nodes(g: Graph) -> Graph:
    """One walk up the inputs from every root at once (an output or an effect): what it reaches lives."""
    live = set(g.outputs.values()) | {n.id for n in g.nodes.values() if n.op in EFFECTS}
    todo = list(live)
    while todo:
        for s in g.nodes[todo.pop()].inputs:
            if s not in live:
                live.add(s)
                todo.append(s)
    return Graph({i: n for i, n in g.nodes.items() if i in live}, dict(g.outputs), dict(g.meta))
