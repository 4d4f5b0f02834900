"""Build one-node graphs, compile one kernel and call it as nth threads would (one share after another)."""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm import graph as _graph  # noqa: F401  (registers every kernel)
from bankml.backends.llvm import jit, registry
from bankml.ir.graph import Graph
from bankml.ir.node import Node


def graph_of(*nodes: Node) -> Graph:
    g = Graph()
    for n in nodes:
        g.add(n)
    return g


def run_kernel(g: Graph, n: Node, out, ins, nth: int):
    """Compile n's kernel alone and run shares ith = 0..nth-1 (kernels never sync inside)."""
    m = ir.Module(name=f"test_{n.op.value}")
    fn = registry.define(m, g, n)
    fn.linkage = "external"
    eng = jit.compile_module(m)
    for ith in range(nth):
        jit.call_kernel(eng, fn.name, out, ins, ith, nth)
    return out
