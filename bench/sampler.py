"""What sampling a token costs next to a decode step: Sampler.sample on the model's own logits.

    python bench/sampler.py smollm2-q4_1 [--threads 2] [--steps 64] [--old path/to/sampler.py]

Per step, in turn: one Session.decode (greedy, so every run decodes the same tokens), then
Sampler.sample of that row for each chain (the default one, and --temp 0: llama.cpp still runs
top_k 40 first), and the same with the sampler module at --old when given (A/B in one run: a
machine whose speed drifts moves every figure alike; each sampler goes first after the decode in
turn, as the first pays for the caches the decode left). Prints medians in microseconds and each
as a share of the decode step. Not a timed test: a report.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np

import bankml
from bankml.runtime.sampler import GREEDY, SamplerParams
from bankml.testing import models

CHAINS = {"default": SamplerParams(), "temp0": GREEDY}


def _module(path: str):
    spec = importlib.util.spec_from_file_location("old_sampler", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                    # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--old", help="another sampler.py to time against")
    a = ap.parse_args()
    from bankml.runtime import sampler as new
    mods = {"new": new, **({"old": _module(a.old)} if a.old else {})}
    m = bankml.load(models.path(a.model), threads=a.threads)
    sess = m.session()
    row = sess.prefill(m.tokenize("The history of the printing press", add_special=True), outputs="last")[-1]
    samplers = {(v, c): mod.Sampler(mod.SamplerParams(**vars(p)), seed=7)
                for v, mod in mods.items() for c, p in CHAINS.items()}
    for s in samplers.values():                     # compiled / warmed before the clock starts
        s.sample(row)
    t = {"decode": [], **{k: [] for k in samplers}}
    tokens = {k: [] for k in samplers}
    for step in range(a.steps):
        tok = int(np.argmax(row))
        t0 = time.perf_counter()
        row = sess.decode(tok)
        t["decode"].append(time.perf_counter() - t0)
        keys = list(samplers)
        for k in keys[step % len(keys):] + keys[:step % len(keys)]:     # each goes first in turn
            s = samplers[k]
            t0 = time.perf_counter()
            tokens[k].append(s.sample(row))
            t[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e6 for k, v in t.items()}
    print(f"{a.model}: vocab {len(row)}, {a.steps} steps, {a.threads} threads; medians in us")
    print(f"  decode step {med['decode']:.0f}")
    for (v, c) in samplers:
        print(f"  {v:3} {c:7} sample {med[(v, c)]:8.1f}  {100 * med[(v, c)] / med['decode']:6.2f} % of a step")
    for c in CHAINS:
        if ("old", c) in samplers:
            same = tokens[("old", c)] == tokens[("new", c)]
            print(f"  {c}: old / new {med[('old', c)] / med[('new', c)]:.1f}x, same tokens: {same}")


if __name__ == "__main__":
    main()
