"""One FLASH_ATTN kernel timed on its own: for comparing attention kernel changes A/B.

    python bench/attn.py {tiled,split,one_chunk} [--model smollm2|qwen3|bonsai|gemma3] [--rows 512] [--past 2048] [--reps 5]

The kernel is compiled for the node's shapes, data made as tests/backends/llvm/test_llvm_attention.py
makes it (a causal mask over n_past + rows cells, n_kv padded to 256), and called with llama_threads 2
and every share run by this one thread in turn (nth 2: the same work two threads would do). Prints
the median wall time of one call and the median of the thread's CPU time (steadier on a busy
machine). Not a test: a measuring tool for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "backends" / "llvm"))
import test_llvm_attention  # noqa: E402
from test_llvm_attention import _case, _graph  # noqa: E402

from bankml.backends.llvm.jit import call_kernel, compile_module  # noqa: E402
from bankml.backends.llvm.registry import define, kernel_name  # noqa: E402
from bankml.ir.order import FA_REFERENCE, FA_SPLIT, FA_TILED  # noqa: E402


test_llvm_attention.MODELS.setdefault("bonsai", (16, 8, 128))   # Bonsai-1.7B's heads
test_llvm_attention.MODELS.setdefault("gemma3", (4, 1, 256))     # Gemma-3-270M's


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["tiled", "split", "one_chunk"], help="one_chunk: a short prompt's kernel")
    ap.add_argument("--model", default="smollm2", help="smollm2 (9/3 heads, D 64), qwen3 (4/2, D 128), bonsai (16/8, D 128)")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--past", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    rows = 1 if a.kind == "split" else a.rows
    q, k, v, mask, scale = _case(1, rows, a.past, a.model)
    g, n = _graph(q, k, v, mask, scale, {"split": FA_SPLIT, "tiled": FA_TILED, "one_chunk": FA_REFERENCE}[a.kind], 2)
    m = ir.Module()
    define(m, g, n)
    eng = compile_module(m)
    out = np.zeros(q.shape, np.float32)

    def call():
        for ith in range(2):
            call_kernel(eng, kernel_name(n), out, [q, k, v, mask], ith, 2, None, llama_threads=2)
    call()
    times, cpu = [], []
    for _ in range(a.reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        call()
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    print(f"{a.kind} {a.model} rows={rows} past={a.past} n_kv={mask.shape[1]}: median {np.median(times) * 1e3:.3f} ms, "
          f"min {min(times) * 1e3:.3f} ms; thread CPU time median {np.median(cpu) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
