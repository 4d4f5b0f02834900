"""Where the time goes: each kernel of one micro-batch graph timed on its own (llvm backend).

    python bench/profile.py MODEL_NAME_OR_PATH [--tokens N] [--past P] [--threads T] [--reps R]
        [--profile ggml|portable] [--one-thread] [--seqs S]

Runs the compiled graph kernel by kernel (graph_part), summing each kernel's median wall time
per op and weight type; a decode is --tokens 1, a step of S sessions decoding together --seqs S.
On the pool a call's hand-off (tens of us) swamps a decode's small kernels; --one-thread calls
each kernel as thread 0 of 1, less an empty call's cost, which shows what the kernels themselves
cost. Not a timed test: a report for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import bankml
from bankml.ir.ops import Op
from bankml.passes.variants import choose_variant
from bankml.testing import models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--past", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", default="ggml", help="ggml or portable (issue #15)")
    ap.add_argument("--seqs", type=int, default=1,
                    help="S > 1: the decode-seqs graph of S sessions, one token each after --past (Model.batch)")
    ap.add_argument("--one-thread", action="store_true",
                    help="kernel by kernel on this thread alone (nth 1; no pool hand-off, empty call's cost subtracted)")
    a = ap.parse_args()
    path = Path(a.model) if Path(a.model).exists() else models.path(a.model)
    m = bankml.load(path, threads=a.threads, profile=a.profile)
    graph_label, g, caches, inputs, values = (seqs_bindings if a.seqs > 1 else micro_batch_bindings)(m, a)
    be = m.runner
    _, cg, bufs = be.compiled[id(g)]
    bufs.bind(g, cg, m.weight, caches, inputs, values)
    dims = bufs.dims.ctypes.data

    def run_part(k: int) -> float:
        """Seconds of kernel k: on the pool, or (--one-thread) called directly as thread 0 of 1,
        less the cost of an empty call."""
        t0 = time.perf_counter()
        if a.one_thread:
            cg.part(bufs.table, 0, 1, None, dims, k, k + 1)
        else:
            be.call(cg, bufs, k, k + 1)
        return time.perf_counter() - t0

    times = defaultdict(list)
    for _ in range(a.reps):
        for k in range(len(cg.kernels)):       # in graph order: each kernel sees a decode's data
            times[k].append(run_part(k))
    empty = []
    for _ in range(200):
        t0 = time.perf_counter()
        cg.part(bufs.table, 0, 1, None, dims, 0, 0)
        empty.append(time.perf_counter() - t0)
    overhead = float(np.median(empty)) if a.one_thread else 0.0
    per = defaultdict(float)
    count = defaultdict(int)
    for k, n in enumerate(cg.kernels):
        label = n.op.value
        if n.op is Op.MUL_MAT:
            w = g[n.inputs[0]]
            label += f" {w.dtype} {w.shape[0]}x{w.shape[1]}"
        elif n.op is Op.FLASH_ATTN:
            label += f" {n.order.kernel}"
        per[label] += float(np.median(times[k])) - overhead
        count[label] += 1
    total = sum(per.values())
    t0 = time.perf_counter()
    for _ in range(a.reps):
        be.call(cg, bufs, 0, len(cg.kernels))
    whole = (time.perf_counter() - t0) / a.reps
    what = f"{a.seqs} sessions, one token each" if a.seqs > 1 else f"{a.tokens} tokens"
    print(f"{path.name} ({a.profile}): {what} after {a.past} ({graph_label}), {a.threads} threads: "
          f"whole graph {whole * 1e3:.2f} ms, kernel by kernel{' (one thread)' if a.one_thread else ''} "
          f"{total * 1e3:.2f} ms")
    for label, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {t * 1e3:8.3f} ms  {100 * t / total:5.1f}%  {count[label]:4d} x {t / count[label] * 1e6:7.1f} us  {label}")


def micro_batch_bindings(m, a):
    """(label, graph, caches, inputs, sizes) of one micro-batch of --tokens after --past, zeros for tokens."""
    T, used = a.tokens, a.past + a.tokens
    n_kv = m.n_kv(used)
    n_kv_swa = m.n_kv_swa_for(n_kv) if m.kv_size_swa else None      # a sliding-window cache (gemma3)
    v, values = choose_variant(m.variants, T, n_kv, 1, n_kv_swa)
    m.prepare(v)
    pos = np.arange(a.past, used, dtype=np.int32)
    mask = np.where(np.arange(n_kv)[None, :] <= pos[:, None], np.float16(0), np.float16(-np.inf)).astype(np.float16)
    inputs = {"tokens": np.zeros(T, np.int32), "pos": pos, "kq_mask": mask, "out_ids": np.asarray([T - 1], np.int32)}
    if n_kv_swa:
        cells = np.arange(n_kv_swa)[None, :]        # the cells hold their positions (no wrap yet)
        window = (cells <= pos[:, None]) & (pos[:, None] - cells < m.hparams.n_swa)
        inputs |= {"swa_idxs": pos, "kq_mask_swa": np.where(window, np.float16(0), np.float16(-np.inf))}
    return f"{v.name} graph, n_kv {n_kv}", m.generic_graph(v), m.session().caches, inputs, values


def seqs_bindings(m, a):
    """(label, graph, caches, inputs, sizes) of one decode-seqs step of --seqs sessions, each after --past
    tokens (zeros) of its own, as Model.batch(...).decode runs it."""
    sessions = [m.session() for _ in range(a.seqs)]
    for s in sessions:
        if a.past:
            s.prefill([0] * a.past, outputs="last")
    S, KV, inputs, caches, n_kv_swa = m.batch(sessions).step_inputs(0, sessions, [0] * a.seqs)
    g, values = m.seqs_graph(S, KV, n_kv_swa)
    return f"{m.seqs_variant.name} graph, n_kv {KV}", g, caches, inputs, values


if __name__ == "__main__":
    main()
