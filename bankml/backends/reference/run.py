"""The reference backend: runs an IR graph in numpy, one lowering per (profile, op, float order).

Each lowering (lowerings.py's table, filled by ggml.py and portable.py) follows the node's
FloatOrder through the spec modules beside this file; it is the readable spec of every op's bits.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from bankml.backends.reference import ggml, portable  # noqa: F401  (their lowerings register)
from bankml.backends.reference.lowerings import LOWERINGS
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op


class Env:
    """What a graph reads and writes besides its nodes: weights, K/V caches, inputs."""

    def __init__(self, weights: Callable[[str], np.ndarray], caches: dict, inputs: dict):
        self.weights, self.caches, self.inputs = weights, caches, inputs


class ReferenceBackend:
    """The reference backend behind the runtime's interface (bankml.backends): a generic graph
    is made concrete for each call's sizes, then run in numpy."""

    def __init__(self, weights: Callable[[str], np.ndarray], gpu=None):
        self.weights, self.gpu = weights, gpu

    def prepare(self, g: Graph) -> float:
        return 0.0

    def run(self, g: Graph, values, inputs: dict, caches: dict, trace=None) -> dict[str, np.ndarray]:
        env = Env(self.weights, caches, inputs)
        env.gpu = self.gpu
        return run(g.instantiate(values) if values else g, env, trace)

    def close(self) -> None:
        pass


def run(g: Graph, env: Env, trace: Callable[[Node, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
    """Execute g; returns its outputs by key. trace(node, value) sees every named node."""
    vals: dict[int, np.ndarray] = {}
    for n in g:
        fn = LOWERINGS.lookup(g, n)
        vals[n.id] = fn(env, g, n, *(vals[i] for i in n.inputs))
        if trace is not None and n.name and n.op not in (Op.WEIGHT, Op.CACHE, Op.INPUT):
            trace(n, vals[n.id])
    return {k: vals[i] for k, i in g.outputs.items()}
