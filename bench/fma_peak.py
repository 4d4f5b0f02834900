"""This machine's peak of 256-bit FMA (AVX2, the code bankml generates), on 1 and on N threads.

    python bench/fma_peak.py [--threads 2] [--seconds 1]

A loop of 12 independent fma chains on registers (no memory), JIT-compiled for haswell like
bankml's kernels, run on each thread at once; GFLOP/s counts an fma as 2 flops on 8 lanes.
The bound a mul_mat of ggml's products (one fma per weight and column) cannot pass: see
docs/PERFORMANCE.md, "Where the time goes". Not a test: a measuring tool.
"""
from __future__ import annotations

import argparse
import ctypes
import threading
import time

from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import fma, for_range, i64, new_function

CHAINS = 12
v8 = ir.VectorType(ir.FloatType(), 8)


def _module() -> ir.Module:
    """float f(i64 n): n rounds of acc[c] = fma(acc[c], 0.5, 0.25) for 12 chains; returns a lane
    of their sum (so that no chain is dead code)."""
    m = ir.Module(name="fma_peak")
    fn, b = new_function(m, "f", ir.FunctionType(ir.FloatType(), [i64]))
    half, quarter = ir.Constant(v8, [0.5] * 8), ir.Constant(v8, [0.25] * 8)
    slots = []
    with b.goto_entry_block():
        for _ in range(CHAINS):
            slots.append(b.alloca(v8))
    for s in slots:
        b.store(ir.Constant(v8, [1.0] * 8), s)
    with for_range(b, 0, fn.args[0], name="i"):
        for s in slots:
            b.store(fma(b, b.load(s), half, quarter), s)
    total = b.load(slots[0])
    for s in slots[1:]:
        total = b.fadd(total, b.load(s))
    b.ret(b.extract_element(total, ir.Constant(ir.IntType(32), 0)))
    return m


def fma_peak(threads: int = 2, seconds: float = 1.0) -> dict[int, float]:
    """GFLOP/s of 256-bit fma on 1 and on `threads` threads at once: {1: ..., threads: ...}."""
    eng = jit.compile_module(_module())
    f = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(eng.get_function_address("f"))
    t0 = time.perf_counter()
    f(10_000_000)
    rounds = max(1, int(10_000_000 * seconds / (time.perf_counter() - t0)))
    out = {}
    for nth in sorted({1, threads}):
        ts = [threading.Thread(target=f, args=(rounds,)) for _ in range(nth)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[nth] = nth * rounds * CHAINS * 16 / (time.perf_counter() - t0) / 1e9
    del eng
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0, help="about how long each measurement runs")
    a = ap.parse_args()
    for nth, gflops in fma_peak(a.threads, a.seconds).items():
        print(f"{nth} thread{'s' if nth > 1 else ''}: {gflops:.1f} GFLOP/s (256-bit fma, {CHAINS} chains a thread)")


if __name__ == "__main__":
    main()
