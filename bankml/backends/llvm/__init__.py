"""The llvm backend: a whole micro-batch graph compiled with llvmlite (haswell AVX2, no fast-math)
and run natively on a thread pool, bit-identical to the reference backend.

    from bankml.backends.llvm import run
    out = run(g, env)            # env as backends.reference.run.Env; threads = getattr(env, "threads", 1)

registry.py holds the kernel contract; graph.py compiles and caches graphs; runner.py runs them.
"""
from bankml.backends.llvm.runner import run

__all__ = ["run"]
