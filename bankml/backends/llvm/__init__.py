"""The llvm backend: a whole micro-batch graph compiled with llvmlite (haswell AVX2, no fast-math)
and run natively on a thread pool, bit-identical to the reference backend.

    from bankml.backends.llvm import LlvmBackend, run
    be = LlvmBackend(weights, threads=2)     # a model's compiled graphs (the runtime's interface)
    out = run(g, weights, caches, inputs)    # one concrete graph, compiled and run once

The engine: registry.py (the kernel contract and the table kernels register in), compile.py (a
graph as a glue module plus one module per distinct kernel), jit.py and jit_cache.py (MCJIT and
the on-disk object cache), pool.py (the native thread pool), backend.py (a model's compiled
graphs, buffers and runs). The kernels: emit/ (the LLVM and SIMD vocabulary), ggml/ (llama.cpp's
float orders), portable/ (the portable profile's arithmetic).
"""
from bankml.backends.llvm.backend import LlvmBackend, run

__all__ = ["LlvmBackend", "run"]
