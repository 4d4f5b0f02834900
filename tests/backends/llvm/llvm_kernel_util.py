"""Build one-node graphs, compile one kernel and call it as nth threads would (one share after another)."""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm import compile as _graph  # noqa: F401  (registers every kernel)
from bankml.backends.llvm import jit, registry
from bankml.ir.graph import Graph
from bankml.ir.node import Node


def graph_of(*nodes: Node) -> Graph:
    g = Graph()
    for n in nodes:
        g.add(n)
    return g


def compile_kernel(g: Graph, n: Node):
    """n's kernel alone in a module: (engine, function name)."""
    m = ir.Module(name=f"test_{n.op.value}")
    fn = registry.define(m, g, n)
    fn.linkage = "external"
    return jit.compile_module(m), fn.name


def run_kernel(g: Graph, n: Node, out, ins, nth: int, sizes: dict | None = None, kernel=None):
    """Run shares ith = 0..nth-1 of n's kernel (kernels never sync inside); sizes: a generic
    node's Dim values."""
    eng, name = kernel or compile_kernel(g, n)
    for ith in range(nth):
        jit.call_kernel(eng, name, out, ins, ith, nth, sizes, arg=registry.kernel_arg(g, n))
    return out
