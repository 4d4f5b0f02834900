"""The machine's memory read bandwidth with T threads: the bound of a decode that reads its
weights once per token.

    python bench/bandwidth.py [--threads 2] [--mb 1024] [--reps 5]

A JIT-compiled loop (the llvm backend's target: AVX2, 32-byte loads, four independent f32
accumulators so the adds never limit it) sums a buffer far larger than the caches; T Python
threads each call it on a contiguous share at once (ctypes releases the GIL). Best of --reps,
in GB/s of bytes read (1 GB = 1e9 bytes).
"""
from __future__ import annotations

import argparse
import ctypes
import threading
import time

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import f32, for_range, i8, i64, new_function, v8f32


def _read_kernel():
    """void read_sum(i8* p, i64 n_bytes, float* out): out = a sum of every f32 in p (n_bytes % 128 == 0)."""
    m = ir.Module(name="bandwidth")
    fn, b = new_function(m, "read_sum", ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i64, f32.as_pointer()]))
    p, n, out = fn.args
    vp = b.bitcast(p, v8f32.as_pointer())
    slots = []
    for k in range(4):
        with b.goto_entry_block():
            slots.append(b.alloca(v8f32))
        b.store(ir.Constant(v8f32, [0.0] * 8), slots[k])
    with for_range(b, 0, b.udiv(n, i64(128)), name="rd") as i:
        for k in range(4):
            v = b.load(b.gep(vp, [b.add(b.mul(i, i64(4)), i64(k))]), align=32)
            b.store(b.fadd(b.load(slots[k]), v), slots[k])
    s = b.fadd(b.fadd(b.load(slots[0]), b.load(slots[1])), b.fadd(b.load(slots[2]), b.load(slots[3])))
    b.store(b.extract_element(s, ir.Constant(ir.IntType(32), 0)), out)
    b.ret_void()
    eng = jit.compile_module(m)
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)
    return eng, proto(eng.get_function_address("read_sum"))


def read_bandwidth(threads: int = 2, mb: int = 1024, reps: int = 5) -> float:
    """Best of reps: bytes read per second (GB/s) by `threads` threads summing mb MiB at once."""
    eng, fn = _read_kernel()
    buf = np.ones(mb * 2**20 // 4, np.float32)           # touched: every page is mapped before timing
    share = buf.nbytes // threads // 128 * 128
    outs = np.zeros(threads, np.float32)
    best = 0.0
    for _ in range(reps + 1):                             # the first pass warms the pages and the threads
        start = threading.Barrier(threads + 1)

        def work(k):
            start.wait()
            fn(buf.ctypes.data + k * share, share, outs.ctypes.data + 4 * k)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        best = max(best, share * threads / (time.perf_counter() - t0) / 1e9)
    del eng
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"read bandwidth, {a.threads} threads: {read_bandwidth(a.threads, a.mb, a.reps):.1f} GB/s")


if __name__ == "__main__":
    main()
