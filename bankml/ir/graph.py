"""A graph of one micro-batch: nodes by id, the outputs, and a networkx view for passes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import networkx as nx

from bankml.ir.dims import Bindings, Dim, concrete, is_symbolic
from bankml.ir.node import Node
from bankml.ir.ops import Op


@dataclass
class Graph:
    nodes: dict[int, Node] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=dict)    # "logits" -> node id
    meta: dict = field(default_factory=dict)                  # n_tokens, n_kv, n_outputs, arch ...

    def add(self, node: Node) -> Node:
        self.nodes[node.id] = node
        return node

    def next_id(self) -> int:
        return max(self.nodes, default=-1) + 1

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def __iter__(self) -> Iterator[Node]:
        """Nodes in execution order: topological, ties broken by creation index."""
        g = self.digraph()
        for i in nx.lexicographical_topological_sort(g):
            yield self.nodes[i]

    def digraph(self) -> nx.DiGraph:
        """The dependency graph derived from each node's inputs."""
        g = nx.DiGraph()
        for n in self.nodes.values():
            g.add_node(n.id)
            for s in n.inputs:
                g.add_edge(s, n.id)
        return g

    def users(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {i: [] for i in self.nodes}
        for n in self.nodes.values():
            for s in n.inputs:
                out[s].append(n.id)
        return out

    def map(self, fn: Callable[[Node], Node | None], op: Op | None = None) -> "Graph":
        """A new graph with fn applied to every node (of one op); None keeps the node."""
        g = Graph(dict(self.nodes), dict(self.outputs), dict(self.meta))
        for n in self.nodes.values():
            if op is None or n.op is op:
                new = fn(n)
                if new is not None:
                    g.nodes[n.id] = new
        return g

    def instantiate(self, values: Bindings) -> "Graph":
        """The concrete graph of a generic one: every Dim (in shapes and meta) by its value."""
        def fix(n: Node) -> Node | None:
            return n.replace(shape=concrete(n.shape, values)) if is_symbolic(n.shape) else None
        g = self.map(fix)
        g.meta = {k: values[v.name] if isinstance(v, Dim) else v for k, v in g.meta.items()}
        return g

    def named(self, name: str) -> list[Node]:
        return [n for n in self if n.name == name]
