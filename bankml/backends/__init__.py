"""Backends, and the one interface the runtime uses to talk to them.

    be = open_backend("llvm", weights, threads=2, gpu=None)
    seconds = be.prepare(g)          # make g ready to run (compile it); 0 when it already is
    out = be.run(g, values, inputs, caches, trace=None)
    be.close()                       # release compiled code, buffers, threads

g is a graph after the passes, generic (sizes T, KV, O: bankml.ir.dims) or concrete; values
gives this call's sizes ({} for a concrete graph). inputs maps tokens, pos, kq_mask and out_ids
to arrays of this call's shapes; caches maps (layer, "k" | "v") to the session's caches (each
the array quants/kv_cache.cache_array lays out for its CACHE node), which run writes in place;
weights(name) is a tensor's bytes. run returns the graph's outputs by key ({"logits": f32
[rows, n_vocab]}); trace(node, value) sees every named node. gpu is the model's device
(backends/spirv/device.py), or None; it runs the nodes passes/place_on_device.py marked
(params["device"]).
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from bankml.errors import BankmlError
from bankml.ir.dims import Bindings
from bankml.ir.graph import Graph
from bankml.ir.node import Node

BACKENDS = ("reference", "llvm")


class Backend(Protocol):
    def prepare(self, g: Graph) -> float: ...

    def run(self, g: Graph, values: Bindings, inputs: dict, caches: dict,
            trace: Callable[[Node, np.ndarray], None] | None = None) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


def open_backend(name: str, weights: Callable[[str], np.ndarray], threads: int = 1, gpu=None) -> Backend:
    if name == "llvm":
        from bankml.backends.llvm.backend import LlvmBackend
        return LlvmBackend(weights, threads, gpu)
    if name == "reference":
        from bankml.backends.reference.run import ReferenceBackend
        return ReferenceBackend(weights, gpu)
    raise BankmlError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
