"""bankml vs llama-bench, side by side in one run: pp512 and tg128 tokens/s and their ratio.

    python bench/run.py [--backend llvm] [--threads 2] [--reps 2] [--models smollm2-q4_1,...] [--write-docs]

For each model, bankml and the oracle build's `llama-bench` run interleaved on the same
machine with the same thread count: pp512 is one 512-token prompt (one llama_decode, last
row's logits, as llama-bench's), tg128 is 128 single-token decodes from an empty cache.
Each is the best of --reps. Peak memory is each process's max RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import bankml
from bankml.oracle.build import build
from bankml.oracle.paths import bin_dir
from bankml.testing import models

DEFAULT_MODELS = ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "bonsai-1.7b-q1_0",
                  "bonsai-1.7b-q2_0"]


def _child(cmd: list[str]) -> tuple[str, float]:
    """Run cmd; its stdout and its own peak RSS in MB (os.wait4: this child only)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed with exit code {p.returncode}")
    return out, usage.ru_maxrss / 1024


def llama_bench(path: Path, threads: int, reps: int) -> dict:
    cmd = [str(bin_dir() / "llama-bench"), "-m", str(path), "-p", "512", "-n", "128", "-t", str(threads),
           "-r", str(reps), "-o", "json"]
    stdout, rss = _child(cmd)
    out = {"rss_mb": rss}
    for row in json.loads(stdout):
        key = "pp512" if row["n_prompt"] == 512 else "tg128"
        out[key] = row["avg_ts"]
    return out


def bankml_bench(path: Path, backend: str, threads: int, reps: int) -> dict:
    m = bankml.load(path, backend=backend, threads=threads)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, m.hparams.n_vocab, 512).tolist()
    m.session().prefill(prompt[:8], outputs="last")             # warm-up (and compile, for llvm)
    pp = tg = 0.0
    for _ in range(reps):
        s = m.session()
        t0 = time.perf_counter()
        s.prefill(prompt, outputs="last")
        pp = max(pp, 512 / (time.perf_counter() - t0))
        s = m.session()
        tok = int(prompt[0])
        t0 = time.perf_counter()
        for _ in range(128):
            tok = int(np.argmax(s.decode(tok)))
        tg = max(tg, 128 / (time.perf_counter() - t0))
    return {"pp512": pp, "tg128": tg}


def bankml_child(path: Path, backend: str, threads: int, reps: int) -> dict:
    """bankml_bench in its own process, so its peak RSS is its own."""
    stdout, rss = _child([sys.executable, __file__, "--one", str(path), "--backend", backend,
                          "--threads", str(threads), "--reps", str(reps)])
    return {**json.loads(stdout), "rss_mb": rss}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="llvm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)        # internal: bench one model, print JSON
    a = ap.parse_args()
    if a.one:
        print(json.dumps(bankml_bench(Path(a.one), a.backend, a.threads, a.reps)))
        return
    build()
    rows = []
    for name in a.models.split(","):
        path = models.path(name)
        ours = bankml_child(path, a.backend, a.threads, a.reps)
        theirs = llama_bench(path, a.threads, a.reps)
        for test in ("pp512", "tg128"):
            rows.append((name, test, ours[test], theirs[test], ours[test] / theirs[test], ours["rss_mb"],
                         theirs["rss_mb"]))
            print(f"{name:20} {test}  bankml {ours[test]:8.2f} tok/s   llama.cpp {theirs[test]:8.2f} tok/s   "
                  f"ratio {ours[test] / theirs[test]:6.3f}", flush=True)
    if a.write_docs:
        lines = ["# Performance", "",
                 f"`python bench/run.py --backend {a.backend} --threads {a.threads}` on {platform.processor() or platform.machine()}, "
                 f"{time.strftime('%Y-%m-%d')}: bankml and llama-bench (b11434, AVX2 build) interleaved in one run, "
                 f"{a.threads} threads, best of {a.reps}.", "",
                 "| model | test | bankml tok/s | llama.cpp tok/s | ratio | bankml max RSS (MB) | llama-bench max RSS (MB) |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.3f} | {r[5]:.0f} | {r[6]:.0f} |")
        Path(__file__).resolve().parent.parent.joinpath("docs", "PERFORMANCE.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
