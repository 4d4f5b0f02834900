"""One mul_mat kernel timed on its own, one thread: for comparing kernel changes A/B.

    python bench/kernel.py Q1_0 2048 6144 1 [--reps 200] [--cold]

TYPE K N M: weight type name, row length, weight rows, activation columns. Random bytes (the
speed of a kernel does not depend on the values); prints the median time of one call and
weight bytes per second, and the calling thread's CPU time (steadier on a busy machine). --cold:
each call reads its own copy of the weights from 256 MB of copies (out of every cache, as in a
graph, where each matrix is read once per forward pass). Not a test: a measuring tool for
docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "backends" / "llvm"))
from llvm_kernel_util import compile_kernel, graph_of  # noqa: E402

from bankml.backends.llvm import jit  # noqa: E402
from bankml.gguf.reader import ggml_type_name  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import F16, WEIGHT_TYPES  # noqa: E402

ACT_BYTES = {"Q8_0": 34, "Q8_1": 36}


def q8_k_activation(rng, m: int, k: int) -> np.ndarray:
    """q8_K rows (292 bytes per 256 values: f32 d, 256 int8, 16 int16 sums of 16) with true sums."""
    q = rng.integers(-127, 128, (m, k // 256, 256), dtype=np.int8)
    blocks = np.zeros((m, k // 256, 292), np.uint8)
    blocks[:, :, 0:4] = np.array([0.01], np.float32).view(np.uint8)
    blocks[:, :, 4:260] = q.view(np.uint8)
    sums = q.reshape(m, k // 256, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    blocks[:, :, 260:292] = sums.view(np.uint8)
    return blocks.reshape(m, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("type")
    ap.add_argument("k", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("m", type=int)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--cold", action="store_true", help="weights out of every cache: a copy per call")
    a = ap.parse_args()
    t = next(code for code, wt in WEIGHT_TYPES.items() if wt.name == a.type)
    wt = WEIGHT_TYPES[t]
    x = Node(0, Op.INPUT, (), (a.m, a.k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (a.n, a.k), wt.name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (a.m, a.k), ggml_type_name(wt.act_type), params={"type": wt.act_type})
    mm = Node(3, Op.MUL_MAT, (1, 2), (a.m, a.n), "f32", name="mm", order=matmul_order(t, a.n, a.m))
    g = graph_of(x, w, q, mm)
    t0 = time.perf_counter()
    kern = compile_kernel(g, mm)
    print(f"compiled in {time.perf_counter() - t0:.2f} s")
    rng = np.random.default_rng(0)
    wb = rng.integers(0, 256, (a.n, wt.row_bytes(a.k)), dtype=np.uint8)
    if t == F16:
        wb = rng.standard_normal((a.n, a.k)).astype(np.float16).view(np.uint8)
        xb = rng.standard_normal((a.m, a.k)).astype(np.float16).view(np.uint8)
    elif ggml_type_name(wt.act_type) == "Q8_K":
        xb = q8_k_activation(rng, a.m, a.k)
    else:
        xb = rng.integers(-127, 128, (a.m, a.k // 32 * ACT_BYTES[ggml_type_name(wt.act_type)]), dtype=np.int8)
        xb = xb.view(np.uint8)
        xb.reshape(a.m, -1, ACT_BYTES[ggml_type_name(wt.act_type)])[:, :, 0:2] = np.uint8(0)
    if wt.name != "F16":
        wb.reshape(a.n, -1, wt.block_bytes)[:, :, 0:2] = np.array([0.01], np.float16).view(np.uint8)
    copies = [wb] + [wb.copy() for _ in range((256 << 20) // wb.nbytes if a.cold else 0)]
    out = np.zeros((a.m, a.n), np.float32)
    sizes = {"T": a.m, "O": a.m}
    for _ in range(5):
        jit.call_kernel(kern[0], kern[1], out, [wb, xb], 0, 1, sizes, arg=a.n)
    times, cpu = [], []
    for rep in range(a.reps):
        w = copies[rep % len(copies)]
        t0, c0 = time.perf_counter(), time.thread_time()
        jit.call_kernel(kern[0], kern[1], out, [w, xb], 0, 1, sizes, arg=a.n)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    med = float(np.median(times))
    print(f"{a.type} K={a.k} N={a.n} M={a.m}: median {med * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms, "
          f"{wb.nbytes / med / 1e9:.2f} GB/s of weights; thread CPU time median {np.median(cpu) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
