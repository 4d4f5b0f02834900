"""What a decode step costs outside its kernels: the Python of Session.decode (inputs, the
variant, binding the buffers, the logits copied out) and the hand-off to the thread pool.

    python bench/overhead.py smollm2-q4_1 [--threads 2] [--steps 300]

Warm (the decode graph compiled and run before the clock starts). Per step, medians over
--steps rounds of the three calls in turn: `decode` is Session.decode; `graph` the same compiled decode graph called alone on the
buffers the last decode bound (its kernels and the pool); `dispatch` a call that runs no
kernel (the pool's hand-off alone). decode - graph is the runtime's own cost per token.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import bankml
from bankml.testing import models


def medians_us(fns, n: int) -> list[float]:
    """The median microseconds of each of fns, called in turn n times (interleaved: a machine
    whose speed drifts moves every figure alike)."""
    ts = [[] for _ in fns]
    for _ in range(n):
        for f, t in zip(fns, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [float(np.median(t)) * 1e6 for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    m = bankml.load(models.path(a.model), threads=a.threads)
    s = m.session()
    s.prefill([1, 2, 3], outputs="last")
    for _ in range(10):
        s.decode(5)
    be = m.runner
    g, cg, bufs = next(c for c in be.compiled.values() if c[2].values.get("T") == 1)
    n = a.steps
    at = s.n_past

    def step():
        s.decode(5)
        s.truncate(at)              # the same n_kv every step

    decode, graph, dispatch = medians_us([step, lambda: be.call(cg, bufs, 0, len(cg.kernels)),
                                          lambda: be.call(cg, bufs, 0, 0)], n)
    print(f"{a.model}, {a.threads} threads: decode {decode:.0f} us a step, its graph alone {graph:.0f} us, "
          f"runtime {decode - graph:.0f} us ({100 * (decode - graph) / decode:.1f}%), "
          f"a dispatch that runs no kernel {dispatch:.1f} us ({bankml.__file__})")


if __name__ == "__main__":
    main()
