"""The llvm backend: a whole micro-batch graph compiled with llvmlite (haswell AVX2, no fast-math)
and run natively on a thread pool, bit-identical to the reference backend.

    from bankml.backends.llvm import LlvmBackend, run
    be = LlvmBackend(weights, threads=2)     # a model's compiled graphs (the runtime's interface)
    out = run(g, weights, caches, inputs)    # one concrete graph, compiled and run once

registry.py holds the kernel contract; graph.py compiles graphs; runner.py runs them.
"""
from bankml.backends.llvm.backend import LlvmBackend, run

__all__ = ["LlvmBackend", "run"]
