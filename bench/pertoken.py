"""What a generated token costs on top of its decode step: `bankml run` and `bankml serve`
against a bare Session.decode loop.

    python bench/pertoken.py [--model smollm2-q4_1 | PATH] [-n 128] [--reps 3] [--threads 2] [--no-server]
                             [--sampler argmax|greedy|default]

With --sampler argmax (the default) Sampler.sample is replaced everywhere by an np.argmax stand-in,
so a token costs decode + argmax + the host path between two steps (generate's checks, the stream
decoder and the writes; the server's stop checks, the hand-off to the event loop, the chunks it
writes). With greedy (llama.cpp's chain at temperature 0) or default (its default chain, seed 42)
the CLI and the server sample with the real chain: what a sampled token costs over a bare decode
step. Per rep, in turn:

- bare: Session.decode(argmax(row)) n-1 times after the prompt, in this process: the median
  time from one decode's start to the next's (always argmax: the bare step);
- cli: bankml.cli_chat's generation loop (stream_reply, streaming to /dev/null), in this process: the
  same median;
- server: `bankml serve` (the stand-in installed, in its own process) streaming n tokens of
  /v1/completions to a client in this process: the median time between two token chunks.

Each run starts after a pause (the last one's pool workers asleep again). Medians of steps, so that a step another process delayed moves none of them. Printed: each
one's ms per token per rep, their medians over the reps, and cli/bare, server/bare.
Not a test: timings vary by machine; compare ratios of one run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPT = "The history of the city of Rome begins"
PAUSE_S = 0.3       # between runs: the other process's pool workers stop spinning and sleep


def argmax_stand_in() -> None:
    """Sampler.sample -> the first largest logit (what temp 0 picks, but for ties), everywhere."""
    from bankml.runtime.sampler import Sampler
    Sampler.sample = lambda self, row: int(np.argmax(row))


def model_path(name: str) -> str:
    from bankml.testing import models
    return name if os.sep in name or name.endswith(".gguf") else str(models.path(name))


STARTS: list[float] = []         # when each Session.decode of this process began


def time_decodes() -> None:
    from bankml.runtime.session import Session
    decode = Session.decode

    def timed(self, token):
        STARTS.append(time.perf_counter())
        return decode(self, token)
    Session.decode = timed


def median_interval_ms(times: list[float]) -> float:
    """The median time from one token to the next: robust to a step another process delayed."""
    return float(np.median(np.diff(times))) * 1e3


def bare_ms(m, ids: list[int], n: int) -> float:
    s = m.session()
    row = s.prefill(ids, outputs="last")[-1]
    STARTS.clear()
    for _ in range(n - 1):
        row = s.decode(int(np.argmax(row)))
    return median_interval_ms(STARTS)


def cli_ms(m, ids: list[int], n: int, sampler: str) -> float:
    from bankml.cli_chat import stream_reply
    from bankml.runtime.sampler import SamplerParams
    STARTS.clear()
    params = SamplerParams() if sampler == "default" else SamplerParams(temp=0)
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        r = stream_reply(m, m.session(), ids, n, params, 42, echo=True, ignore_eos=True)
    if r["timings"]["predicted_n"] != n:
        raise RuntimeError(f"the CLI stopped after {r['timings']['predicted_n']} tokens")
    return median_interval_ms(STARTS)


def server_ms(url: str, n: int, sampler: str) -> float:
    import httpx
    body = {"prompt": PROMPT, "max_tokens": n, "stream": True, "ignore_eos": True, "seed": 42,
            **({} if sampler == "default" else {"temperature": 0})}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"finish_reason":null' in line.replace(" ", ""):
                times.append(time.perf_counter())
    if len(times) != n:
        raise RuntimeError(f"the server streamed {len(times)} token chunks, not {n}")
    return median_interval_ms(times)


def serve_child(args: list[str], stand_in: bool) -> None:
    if stand_in:
        argmax_stand_in()
    from bankml.cli import main
    main(["serve", *args])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-q4_1")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--sampler", choices=("argmax", "greedy", "default"), default="argmax")
    if sys.argv[1] in ("--serve-child", "--serve-child-argmax"):
        return serve_child(sys.argv[2:], sys.argv[1] == "--serve-child-argmax")
    a = ap.parse_args()
    import bankml
    if a.sampler == "argmax":
        argmax_stand_in()
    time_decodes()
    path = model_path(a.model)
    m = bankml.load(path, threads=a.threads)
    m.compile()
    ids = m.tokenize(PROMPT, add_special=True, parse_special=True)
    bare_ms(m, ids, 8)                                  # warm
    srv = None
    if not a.no_server:
        from bankml.oracle.loopback import free_port, stop, wait_for_health
        port = free_port()
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"pertoken-{port}.log"
        f = open(log, "wb")
        child = "--serve-child-argmax" if a.sampler == "argmax" else "--serve-child"
        srv = subprocess.Popen([sys.executable, __file__, child, path, "--port", str(port),
                                "--threads", str(a.threads)], stdout=f, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_for_health(srv, url, 300, "bankml serve", log.read_text, error=RuntimeError)
        server_ms(url, 8, a.sampler)                    # warm
    rows: dict[str, list[float]] = {"bare": [], "cli": [], "server": []}
    try:
        for _ in range(a.reps):
            for name, run in (("bare", lambda: bare_ms(m, ids, a.n)), ("cli", lambda: cli_ms(m, ids, a.n, a.sampler)),
                              ("server", lambda: server_ms(url, a.n, a.sampler))):
                if name == "server" and srv is None:
                    continue
                time.sleep(PAUSE_S)
                rows[name].append(run())
    finally:
        if srv is not None:
            stop(srv, 15)
            f.close()
    med = {k: float(np.median(v)) for k, v in rows.items() if v}
    for k, v in rows.items():
        if v:
            print(f"{k:7s} ms/token {' '.join(f'{x:.2f}' for x in v)}  median {med[k]:.2f}")
    out = {"cli/bare": med["cli"] / med["bare"]}
    if "server" in med:
        out["server/bare"] = med["server"] / med["bare"]
    print(json.dumps({k: round(v, 4) for k, v in out.items()}), f"({bankml.__file__}, n={a.n}, sampler: {a.sampler}; bare: np.argmax)")


if __name__ == "__main__":
    main()
