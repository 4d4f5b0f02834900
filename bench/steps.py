"""The decode steps of a fresh process: does any step wait for something a session could have
loaded before it (a graph variant from the JIT cache, a buffer)?

    python bench/steps.py [--model smollm2-q4_1 | PATH] [-n 1100] [--threads 2] [--reps 1]

Each rep is a new process (this script again, with --child) that loads the model, generates
-n tokens greedily through bankml.runtime.generate (as `bankml run` does) and times every
Session.decode call; it prints the median, the largest step (and where it fell) and their
ratio. The claim: after `bankml compile`, no step exceeds 2x the median, also the first past
256 cells (the split-KV variant takes over at 512 cells). Not a test: timings vary by machine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bankml.testing import models


def child(model: str, n: int, threads: int) -> dict:
    import numpy as np

    import bankml
    from bankml.runtime.generate import GREEDY, generate
    m = bankml.load(models.path(model) if "/" not in model else model, threads=threads)
    sess = m.session()
    steps: list[float] = []
    decode = sess.decode

    def timed(t: int):
        t0 = time.perf_counter()
        row = decode(t)
        steps.append(time.perf_counter() - t0)
        return row

    sess.decode = timed
    ids = m.tokenize("Once upon a time, in a land far away,", add_special=True, parse_special=True)
    n_out = sum(1 for _ in generate(m, ids, n, GREEDY, session=sess, ignore_eos=True))
    a = np.array(steps) * 1e3
    k = int(a.argmax())
    return {"tokens": n_out, "steps": len(a), "median_ms": float(np.median(a)), "max_ms": float(a[k]),
            "max_at_cells": len(ids) + k + 1, "ratio": float(a[k] / np.median(a)),
            "first_ms": [round(float(x), 1) for x in a[:4]],
            "largest": [(round(float(a[i]), 1), len(ids) + int(i) + 1) for i in np.argsort(a)[-5:][::-1]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-q4_1")
    ap.add_argument("-n", type=int, default=1100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.model, a.n, a.threads)))
        return
    for _ in range(a.reps):
        out = subprocess.run([sys.executable, __file__, "--child", "--model", a.model, "-n", str(a.n),
                              "--threads", str(a.threads)], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{a.model}: {r['steps']} decode steps in a fresh process, median {r['median_ms']:.2f} ms, "
              f"max {r['max_ms']:.2f} ms at {r['max_at_cells']} cells ({r['ratio']:.2f}x the median); "
              f"largest (ms, cells) {r['largest']}; the first four {r['first_ms']} ms")


if __name__ == "__main__":
    main()
