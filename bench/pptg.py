"""pp512 and tg128 of the bankml this script imports, best of 3, in one process: for comparing two
checkouts back to back on one machine (`PYTHONPATH=CHECKOUT python bench/pptg.py MODEL`).

    python bench/pptg.py smollm2-q8_0 [--threads 2]

Warm: the graphs are compiled (or loaded) by an 8-token prompt before the clock starts. The
ratio against llama-bench is bench/run.py's job; this is the same measurement without it.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import bankml
from bankml.testing import models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    m = bankml.load(models.path(a.model), threads=a.threads)
    ids = np.random.default_rng(0).integers(0, m.hparams.n_vocab, 512).tolist()
    m.session().prefill(ids[:8], outputs="last")
    pp = tg = 0.0
    for _ in range(3):
        s = m.session()
        t0 = time.perf_counter()
        s.prefill(ids, outputs="last")
        pp = max(pp, 512 / (time.perf_counter() - t0))
        s, tok = m.session(), ids[0]
        t0 = time.perf_counter()
        for _ in range(128):
            tok = int(np.argmax(s.decode(tok)))
        tg = max(tg, 128 / (time.perf_counter() - t0))
    print(f"{a.model}: pp512 {pp:.1f} tok/s, tg128 {tg:.1f} tok/s ({bankml.__file__})")


if __name__ == "__main__":
    main()
