"""bankml vs llama-bench, side by side in one run: throughput (pp512, tg128) and what a user
feels (the first logits of a prompt length never run before, the steadiness of a long decode).

    python bench/run.py [--backend llvm] [--threads 2] [--reps 2] [--models smollm2-q4_1,...]
                        [--rows pp,tg,fresh,long,gen,serve] [--fresh-lengths 5] [--long-tokens 1100]
                        [--gen-tokens 128,1024] [--serve-requests 6] [--serve-tokens 128] [--serve-clients 1,2,4,8]
                        [--seed S] [--write-docs] [-ctk q8_0 -ctv q8_0]

For each model, bankml and the oracle build's `llama-bench` run interleaved on the same
machine with the same thread count; every bankml measurement runs in its own child process.
For every ratio, >1 means bankml is faster.

pp, tg (warm): pp512 is one 512-token prompt (one llama_decode, last row's logits, as
llama-bench's), tg128 is 128 single-token decodes from an empty cache, both after a warm-up
in the same process (graphs compiled or loaded before the clock starts). Best of --reps;
ratio bankml/llama.cpp tokens/s. Peak memory is each process's max RSS.

fresh: for --fresh-lengths random prompt lengths in 20..400 (random ids), the seconds from the
call to prefill(ids, outputs="last") to its return, in one new process started as a server
starts (load(), compile(): the objects from the disk cache, and one warm-up decode as
llama-server's; start-up time reported apart),
none of the lengths run before. The row says "warm cache" when that process compiled nothing,
else how many objects it compiled. One more row: the first length as the first request of a
new process with an empty BANKML_CACHE (cold: the request compiles its graph). llama.cpp:
`llama-bench -p N -n 0 -r 1` (after its own warm-up run), prompt time N / avg_ts. Ratio
llama.cpp time / bankml time.

long: --long-tokens single-token decodes of fixed random ids after a 1-token prompt, in a new
process started as a server starts (load, compile); the prompt's prefill is not timed, every decode step is
(perf_counter), so a compile or a stall met mid-generation is the slowest step. Tokens/s over
all steps, the median and the slowest step and their ratio. llama.cpp: `llama-bench -p 0 -n N
-r 1` tokens/s (after its one-token warm-up). Ratio bankml/llama.cpp tokens/s.

depth: pp512 and tg128 with 2,048 cells already in the cache (`llama-bench -d 2048`), for the
--depth-models: llama-bench fills the cache untimed (a prompt of that many tokens) and
restores that state before every repetition; bankml fills it once, untimed, and truncates the
session back to those cells before every timed prompt or generation (the same cells again).
Both size the cache to the test (n_ctx = depth + 512). Best of --reps, ratio as pp/tg.

bandwidth: the machine's read bandwidth with --threads threads, measured in the same run
(bench/bandwidth.py, below "machine"); each decode row (tg128, tg128 @ d2048, long) is printed as a percentage of
its bound: bankml's tokens/s times the bytes a decode step reads (every matrix it multiplies,
one embedding row, the K/V cells its attention reads) over that bandwidth.

Peak memory: each process's max RSS, bankml's with the cache llama-bench gives the same test
(n_ctx = the test's tokens: 512 for pp512/tg128, depth + 512 for the depth rows).

portable: tg128 of the portable profile (issue #15) against the ggml profile's, both bankml on
--backend, each in its own child process, alternated --reps times (A then B, back to back: a
busy machine slows both alike); best of each, ratio portable/ggml tokens/s (the bar is 0.8, for
the default ActScaling Sub32), for --portable-models of --models (the portable profile builds
llama, qwen3 and qwen35 graphs); a second row with act_scaling PerBlock (test "tg128 PerBlock").

gen, serve: what a user runs, `bankml run` against `llama-completion` (greedy and the default
chain, each --gen-tokens, cold and warm JIT cache) with the sampler's share of a token, and
`bankml serve` against `llama-server` (one client and several at once, slots matched); how each
is measured is bench/generation.py's docstring.

machine: the FMA peak (bench/fma_peak.py) and the read bandwidth (bench/bandwidth.py), measured
in the same run before the rows, printed and written beside the tables.

-ctk/--cache-type-k, -ctv/--cache-type-v: the K/V cache types (f16, q8_0, q4_0) of every row, on both
sides (llama-bench -ctk/-ctv); rows of a quantized cache are labelled "model [K/V]".

--write-docs rewrites docs/PERFORMANCE.md above its KEEP line (the command, the date and one
table per kind of row); the hand-written notes below that line stay.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import bankml
from bankml.oracle.build import build
from bankml.oracle.paths import bin_dir
from bankml.backends.llvm import jit_cache
from bankml.testing import models

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generation  # noqa: E402
from bandwidth import read_bandwidth  # noqa: E402
from fma_peak import fma_peak  # noqa: E402

DEFAULT_MODELS = ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "bonsai-1.7b-q1_0",
                  "bonsai-1.7b-q2_0", "gemma3-270m-q4_k_m"]
ROWS = ("pp", "tg", "fresh", "long", "depth", "portable", "gen", "serve")
DEPTH_MODELS = ["smollm2-q4_1", "bonsai-1.7b-q1_0"]
PORTABLE_MODELS = ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "bonsai-1.7b-q1_0",
                   "bonsai-1.7b-q2_0", "qwen35-0.8b-q8_0"]   # the llama / qwen3 / qwen35 graphs it builds
DOC = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
KEEP = "<!-- bench/run.py --write-docs rewrites everything above this line and keeps what follows -->"
FRESH_MIN, FRESH_MAX = 20, 400


# ---- the llama.cpp side ----

def _child(cmd: list[str], env: dict | None = None) -> tuple[str, float]:
    """Run cmd; its stdout and its own peak RSS in MB (os.wait4: this child only)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed with exit code {p.returncode}")
    return out, usage.ru_maxrss / 1024


CACHE = {"cache_type_k": "f16", "cache_type_v": "f16"}     # this run's K/V cache types (-ctk/-ctv)


def labelled(name: str) -> str:
    """A model's row label: "model [K/V]" with a quantized cache."""
    k, v = CACHE["cache_type_k"], CACHE["cache_type_v"]
    return name if (k, v) == ("f16", "f16") else f"{name} [{k}/{v}]"


def llama_bench(path: Path, threads: int, reps: int, prompt: int, gen: int) -> dict:
    """llama-bench's avg tokens/s per test, keyed as it names them ("pp512", "tg128"), and its peak RSS."""
    cmd = [str(bin_dir() / "llama-bench"), "-m", str(path), "-p", str(prompt), "-n", str(gen),
           "-t", str(threads), "-r", str(reps), "-o", "json", "-ctk", CACHE["cache_type_k"],
           "-ctv", CACHE["cache_type_v"]]
    stdout, rss = _child(cmd)
    out = {"rss_mb": rss}
    for row in json.loads(stdout):
        key = f"tg{row['n_gen']}" if row["n_gen"] else f"pp{row['n_prompt']}"
        out[key] = row["avg_ts"]
    return out


# ---- the bankml side, each run in a child process (--one) ----

def bankml_bench(path: Path, backend: str, threads: int, reps: int, pp: bool = True, tg: bool = True,
                 profile: str = "ggml", act_scaling: str = "Sub32") -> dict:
    """Warm throughput: pp512 and tg128 tokens/s, best of reps, after a warm-up that compiles."""
    m = bankml.load(path, backend=backend, threads=threads, n_ctx=512 if pp else 128, profile=profile,
                    act_scaling=act_scaling, **CACHE)   # as llama-bench's
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, m.hparams.n_vocab, 512).tolist()
    warm = m.session()                                          # warm-up (and compile, for llvm):
    warm.prefill(prompt[:8], outputs="last")                    # a prompt's graph and the decode's
    warm.decode(int(prompt[8]))
    out = {}
    for _ in range(reps):
        if pp:
            s = m.session()
            t0 = time.perf_counter()
            s.prefill(prompt, outputs="last")
            out["pp512"] = max(out.get("pp512", 0.0), 512 / (time.perf_counter() - t0))
        if tg:
            s = m.session()
            tok = int(prompt[0])
            t0 = time.perf_counter()
            for _ in range(128):
                tok = int(np.argmax(s.decode(tok)))
            out["tg128"] = max(out.get("tg128", 0.0), 128 / (time.perf_counter() - t0))
    return out


def fresh_prompt(path: Path, backend: str, threads: int, lengths: list[int], seed: int, warm: bool) -> dict:
    """Seconds from the call to prefill(ids, outputs="last") to its return for each of `lengths`
    (random ids), in this process, none of them run before. warm: the model was started as
    `bankml serve` starts it, load(), compile() (the object files from the disk cache, or
    compiled) and warm_up() (start-up, timed apart); else the first prefill meets whatever
    compile or load its graph needs. `compiled`: how many objects this process compiled."""
    t0 = time.perf_counter()
    m = bankml.load(path, backend=backend, threads=threads, **CACHE)
    if warm:
        m.compile()
        m.warm_up()
    startup = time.perf_counter() - t0
    seconds = {}
    for n in lengths:
        ids = np.random.default_rng([seed, n]).integers(0, m.hparams.n_vocab, n).tolist()
        s = m.session()
        t0 = time.perf_counter()
        s.prefill(ids, outputs="last")
        seconds[n] = time.perf_counter() - t0
    return {"seconds": seconds, "startup_s": startup, "compiled": jit_cache.counts["miss"],
            "cache_on": jit_cache.enabled()}


def long_decode(path: Path, backend: str, threads: int, n: int, seed: int) -> dict:
    """n decode steps of fixed random ids after an untimed 1-token prompt, in a process started
    as a server starts (load, compile() from the disk cache), no other warm-up: tokens/s
    over all steps, the median and the slowest step (seconds) and where the slowest was."""
    m = bankml.load(path, backend=backend, threads=threads, n_ctx=max(4096, n + 1), **CACHE)
    m.compile()                             # started as a server starts: every graph ready (disk cache),
    m.warm_up()                             # one warm-up decode
    ids = np.random.default_rng(seed).integers(0, m.hparams.n_vocab, n + 1).tolist()
    s = m.session()
    s.prefill(ids[:1], outputs="last")
    steps = []
    for tok in ids[1:]:
        t0 = time.perf_counter()
        s.decode(tok)
        steps.append(time.perf_counter() - t0)
    slowest = int(np.argmax(steps))
    return {"tok_s": n / sum(steps), "median_s": float(np.median(steps)), "slowest_s": steps[slowest],
            "slowest_step": slowest + 1, "compiled": jit_cache.counts["miss"],
            "cache_on": jit_cache.enabled()}


def bankml_child(path: Path, a: argparse.Namespace, test: str, n: int | str = 0, env: dict | None = None) -> dict:
    """One bankml measurement in its own process, so its memory and peak RSS are its own."""
    cmd = [sys.executable, __file__, "--one", str(path), "--one-test", test, "--n", str(n),
           "--backend", a.backend, "--threads", str(a.threads), "--reps", str(a.reps), "--seed", str(a.seed),
           "--rows", a.rows, "-ctk", a.cache_type_k, "-ctv", a.cache_type_v]
    stdout, rss = _child(cmd, env)
    return {**json.loads(stdout), "rss_mb": rss}


def run_one(a: argparse.Namespace) -> dict:
    path, rows = Path(a.one), a.rows.split(",")
    if a.one_test in ("fresh", "cold"):
        lengths = [int(x) for x in str(a.n).split(",")]
        return fresh_prompt(path, a.backend, a.threads, lengths, a.seed, warm=a.one_test == "fresh")
    if a.one_test == "long":
        return long_decode(path, a.backend, a.threads, int(a.n), a.seed)
    if a.one_test == "depth":
        return depth_bench(path, a.backend, a.threads, a.reps, int(a.n), a.seed)
    if a.one_test == "bandwidth":
        return {"gb_s": read_bandwidth(a.threads)}
    if a.one_test == "fma":
        return {"gflops": fma_peak(a.threads)}
    if a.one_test == "sampler":
        return generation.sampler_share(path, a.backend, a.threads, int(a.n), a.seed, CACHE)
    if a.one_test == "portable":               # --n: ggml, portable or portable-PerBlock
        profile, _, scaling = str(a.n).partition("-")
        return bankml_bench(path, a.backend, a.threads, 1, pp=False, tg=True, profile=profile,
                            act_scaling=scaling or "Sub32")
    return bankml_bench(path, a.backend, a.threads, a.reps, pp="pp" in rows, tg="tg" in rows)


# ---- rows: one dict per table line ----

def throughput_rows(name: str, path: Path, a: argparse.Namespace, rows: list[str]) -> list[dict]:
    ours = bankml_child(path, a, "pptg")
    theirs = llama_bench(path, a.threads, a.reps, 512 if "pp" in rows else 0, 128 if "tg" in rows else 0)
    out = []
    for test in [t for t in ("pp512", "tg128") if t[:2] in rows]:
        out.append({"model": name, "kind": "pptg", "test": test, "unit": "tok/s", "bankml": ours[test],
                    "llama": theirs[test], "ratio": ours[test] / theirs[test], "note": "warm",
                    "rss": (ours["rss_mb"], theirs["rss_mb"])})
    return out


def portable_rows(name: str, path: Path, a: argparse.Namespace) -> list[dict]:
    """tg128 of the portable profile (Sub32 and PerBlock) and of the ggml profile, alternated, best
    of --reps each."""
    best = {"portable": 0.0, "portable-PerBlock": 0.0, "ggml": 0.0}
    for _ in range(a.reps):
        for profile in best:
            best[profile] = max(best[profile], bankml_child(path, a, "portable", profile)["tg128"])
    return [{"model": name, "kind": "portable", "test": test, "unit": "tok/s", "bankml": best[key],
             "llama": best["ggml"], "ratio": best[key] / best["ggml"],
             "note": "portable vs ggml profile (bankml both; the llama.cpp column is the ggml profile)"}
            for key, test in (("portable", "tg128"), ("portable-PerBlock", "tg128 PerBlock"))]


def fresh_rows(name: str, path: Path, a: argparse.Namespace, lengths: list[int]) -> list[dict]:
    """Every length in one process started as a server starts (load, compile from the disk cache),
    none run before; then the first length as the first request of a process whose JIT cache is
    empty (cold: its graph compiles inside the request)."""
    llama_s = {n: n / llama_bench(path, a.threads, 1, n, 0)[f"pp{n}"] for n in lengths}
    ours = bankml_child(path, a, "fresh", ",".join(map(str, lengths)))
    label = f"started in {ours['startup_s']:.2f} s, {cache_label(ours, a.backend)}"
    out = [_fresh_row(name, n, ours["seconds"][str(n)], llama_s[n], label) for n in lengths]
    with tempfile.TemporaryDirectory(prefix="bankml-bench-cold-") as d:
        cold = bankml_child(path, a, "cold", lengths[0], env={**os.environ, "BANKML_CACHE": d})
    out.append(_fresh_row(name, lengths[0], cold["seconds"][str(lengths[0])], llama_s[lengths[0]],
                          "first request, " + cache_label(cold, a.backend, cold=True)))
    return out


def _fresh_row(name: str, n: int, seconds: float, llama_s: float, label: str) -> dict:
    return {"model": name, "kind": "fresh", "test": f"fresh {n}", "n": n, "unit": "s", "bankml": seconds,
            "llama": llama_s, "ratio": llama_s / seconds, "note": label}


def long_rows(name: str, path: Path, a: argparse.Namespace) -> list[dict]:
    n = a.long_tokens
    ours = bankml_child(path, a, "long", n)
    theirs = llama_bench(path, a.threads, 1, 0, n)[f"tg{n}"]
    cache = cache_label(ours, a.backend)
    note = (f"{cache}; median {ours['median_s'] * 1e3:.2f} ms, slowest "
            f"{ours['slowest_s'] * 1e3:.2f} ms (step {ours['slowest_step']}), "
            f"{ours['slowest_s'] / ours['median_s']:.1f}x median")
    return [{"model": name, "kind": "long", "test": f"long {n}", "n": n, "unit": "tok/s", "bankml": ours["tok_s"],
             "llama": theirs, "ratio": ours["tok_s"] / theirs, "note": note, "cache": cache, **ours}]


def cache_label(r: dict, backend: str, cold: bool = False) -> str:
    """What the disk JIT cache did for a run: "warm cache" when the run compiled nothing."""
    if backend != "llvm":
        return "no JIT"
    if not r["cache_on"]:
        return "JIT cache off"
    if cold:
        return f"cold cache: {r['compiled']} compiled"
    return "warm cache" if r["compiled"] == 0 else f"cache missed: {r['compiled']} compiled"


def fresh_lengths(seed: int, k: int) -> list[int]:
    """k distinct prompt lengths in FRESH_MIN..FRESH_MAX, drawn from seed."""
    rng = np.random.default_rng(seed)
    return sorted(int(n) for n in rng.choice(np.arange(FRESH_MIN, FRESH_MAX + 1), size=k, replace=False))


# ---- depth rows (llama-bench -d) and the bandwidth bound of decode rows ----

def depth_bench(path: Path, backend: str, threads: int, reps: int, depth: int, seed: int) -> dict:
    """pp512 and tg128 after `depth` cells, as llama-bench -d: the cache filled once, untimed,
    and the session truncated back to those cells before every timed run; best of reps."""
    m = bankml.load(path, backend=backend, threads=threads, n_ctx=depth + 512, **CACHE)   # llama-bench's n_ctx
    ids = np.random.default_rng(seed).integers(0, m.hparams.n_vocab, depth + 512).tolist()
    s = m.session()
    s.prefill(ids[:depth], outputs="last")      # untimed; compiles (or loads) the prefill graph
    s.decode(ids[depth])                        # warm-up: the decode graph of this depth
    out = {"pp512": 0.0, "tg128": 0.0}
    for _ in range(reps):
        s.truncate(depth)
        t0 = time.perf_counter()
        s.prefill(ids[depth:], outputs="last")
        out["pp512"] = max(out["pp512"], 512 / (time.perf_counter() - t0))
        s.truncate(depth)
        tok = int(ids[depth])
        t0 = time.perf_counter()
        for _ in range(128):
            tok = int(np.argmax(s.decode(tok)))
        out["tg128"] = max(out["tg128"], 128 / (time.perf_counter() - t0))
    return out


def depth_rows(name: str, path: Path, a: argparse.Namespace) -> list[dict]:
    ours = bankml_child(path, a, "depth", a.depth)
    cmd = [str(bin_dir() / "llama-bench"), "-m", str(path), "-p", "512", "-n", "128", "-d", str(a.depth),
           "-t", str(a.threads), "-r", str(a.reps), "-o", "json"]
    stdout, rss = _child(cmd)
    theirs = {(f"tg{r['n_gen']}" if r["n_gen"] else f"pp{r['n_prompt']}"): r["avg_ts"] for r in json.loads(stdout)}
    return [{"model": name, "kind": "depth", "test": f"{t} @ d{a.depth}", "unit": "tok/s", "bankml": ours[t],
             "llama": theirs[t], "ratio": ours[t] / theirs[t], "note": f"n_ctx {a.depth + 512}",
             "rss": (ours["rss_mb"], rss), "n_kv_from": a.depth} for t in ("pp512", "tg128")]


def machine_rows(a: argparse.Namespace) -> dict:
    """This machine now, each in its own child: the FMA peak on 1 and --threads threads
    (bench/fma_peak.py) and the read bandwidth with --threads (bench/bandwidth.py)."""
    gflops = {int(k): v for k, v in bankml_child(Path("-"), a, "fma")["gflops"].items()}
    gb_s = bankml_child(Path("-"), a, "bandwidth")["gb_s"]
    print("FMA peak (bench/fma_peak.py): " + ", ".join(f"{v:.1f} GFLOP/s on {k}" for k, v in gflops.items())
          + f"; read bandwidth, {a.threads} threads (bench/bandwidth.py): {gb_s:.1f} GB/s", flush=True)
    return {"gflops": gflops, "gb_s": gb_s}


def decode_bytes(path: Path) -> tuple[int, int]:
    """Bytes one decode step reads: (fixed, per K/V cell): every matrix it multiplies, one row of
    each matrix it only gathers from (the embedding), the norms; the K and V cells its attention
    reads, per cell."""
    from bankml.ir.ops import Op
    from bankml.quants import WEIGHT_TYPES
    with bankml.load(path, backend="reference") as m:
        g = m.graph(1, 256, 1)
    users = g.users()
    fixed = per_cell = 0
    for n in g:
        if n.op is Op.WEIGHT:
            t = int(n.params["ggml_type"])
            size = 4 * int(np.prod(n.shape)) if t == 0 else WEIGHT_TYPES[t].row_bytes(n.shape[-1]) * n.shape[0]
            gathered = all(g[u].op is Op.GET_ROWS for u in users.get(n.id, []))
            fixed += size // n.shape[0] if gathered else size
        elif n.op is Op.CACHE:
            per_cell += 2 * int(np.prod(n.shape)) // 256
    return fixed, per_cell


def report_bounds(results: list[dict], gb_s: float, a: argparse.Namespace) -> list[dict]:
    """Each decode row against its bound: bytes a step reads at the cells it reads / bandwidth."""
    out = []
    per_model = {}
    for r in [r for r in results if r["test"].startswith(("tg", "long")) and r["kind"] != "portable"]:
        path = models.path(r["model"])
        if r["model"] not in per_model:
            per_model[r["model"]] = decode_bytes(path)
        fixed, per_cell = per_model[r["model"]]
        first = r.get("n_kv_from", 1 if r["kind"] == "long" else 0) + 1
        steps = r["n"] if r["kind"] == "long" else 128
        kv_size = -(-(first + steps) // 256) * 256
        cells = [min(kv_size, max(256, -(-used // 256) * 256)) for used in range(first, first + steps)]
        nbytes = fixed + per_cell * float(np.mean(cells))
        bound = gb_s * 1e9 / nbytes
        b = {"model": r["model"], "kind": "bound", "test": r["test"], "mb": nbytes / 1e6, "bound": bound,
             "bankml_pct": 100 * r["bankml"] / bound, "llama_pct": 100 * r["llama"] / bound, "gb_s": gb_s}
        print(f"{b['model']:20} {b['test']:14} {b['mb']:8.1f} MB/token, bound {bound:8.2f} tok/s: "
              f"bankml {b['bankml_pct']:5.1f}%, llama.cpp {b['llama_pct']:5.1f}%", flush=True)
        out.append(b)
    return out


def depth_and_bound_md(rows: list[dict], a: argparse.Namespace) -> str:
    lines = []
    if mine := [r for r in rows if r["kind"] == "depth"]:
        lines += [f"## Depth {a.depth}", "",
                  f"pp512 and tg128 with {a.depth} cells already in the cache (`llama-bench -d {a.depth}`; the "
                  "cache is filled untimed and restored before every repetition). Best of "
                  f"{a.reps}; both sized to the test (n_ctx {a.depth + 512}).", "",
                  "| model | test | bankml tok/s | llama.cpp tok/s | ratio | bankml max RSS (MB) | "
                  "llama-bench max RSS (MB) |", "|---|---|---|---|---|---|---|"] + [
                  f"| {r['model']} | {r['test']} | {r['bankml']:.2f} | {r['llama']:.2f} | {r['ratio']:.3f} | "
                  f"{r['rss'][0]:.0f} | {r['rss'][1]:.0f} |" for r in mine] + [""]
    if mine := [r for r in rows if r["kind"] == "bound"]:
        lines += ["## Decode against the bandwidth bound", "",
                  f"Read bandwidth of this machine with {a.threads} threads, measured in the same run "
                  f"(bench/bandwidth.py): {mine[0]['gb_s']:.1f} GB/s. Bound: that bandwidth over the bytes "
                  "one decode step reads (matrices, one embedding row, norms, the K/V cells read, averaged "
                  "over the steps).", "",
                  "| model | test | MB per token | bound tok/s | bankml % of bound | llama.cpp % of bound |",
                  "|---|---|---|---|---|---|"] + [
                  f"| {r['model']} | {r['test']} | {r['mb']:.1f} | {r['bound']:.2f} | {r['bankml_pct']:.1f} | "
                  f"{r['llama_pct']:.1f} |" for r in mine] + [""]
    return "\n".join(lines)


# ---- output ----

def report(rows: list[dict]) -> list[dict]:
    for r in rows:
        print_row(r)
    return rows


def print_row(r: dict) -> None:
    fmt = "{:10.2f} {:5}" if r["unit"] == "tok/s" else "{:10.3f} {:5}"
    print(f"{r['model']:20} {r['test']:10} {fmt.format(r['bankml'], r['unit'])} {fmt.format(r['llama'], r['unit'])} "
          f"{r['ratio']:7.3f}  {r['note']}", flush=True)


def print_header() -> None:
    print(f"{'model':20} {'test':10} {'bankml':>16} {'llama.cpp':>16} {'ratio':>7}  note")


def markdown(rows: list[dict], a: argparse.Namespace, command: str, machine: dict | None) -> str:
    """docs/PERFORMANCE.md: the command and date, the machine, then one table per kind of row run."""
    cpu = platform.processor() or platform.machine()
    lines = ["# Performance", "",
             f"`{command}` on {cpu}, {time.strftime('%Y-%m-%d')}: bankml and llama.cpp (b11434, AVX2 build) "
             f"interleaved in one run, {a.threads} threads; every ratio >1 means bankml is faster.", ""]
    if machine:
        lines += ["This machine in the same run: FMA peak " + " and ".join(
                  f"{v:.1f} GFLOP/s on {k} thread{'s' if k > 1 else ''}" for k, v in machine["gflops"].items())
                  + f" (bench/fma_peak.py), read bandwidth {machine['gb_s']:.1f} GB/s with {a.threads} threads "
                  "(bench/bandwidth.py).", ""]
    for kind, table in (("pptg", throughput_md), ("fresh", fresh_md), ("long", long_md), ("portable", portable_md)):
        if mine := [r for r in rows if r["kind"] == kind]:
            lines += table(mine, a) + [""]
    lines += generation.markdown(rows, a)
    return "\n".join(lines)


def throughput_md(rows: list[dict], a: argparse.Namespace) -> list[str]:
    return [f"Throughput, warm (compiled before the clock starts), best of {a.reps}.", "",
            "| model | test | bankml tok/s | llama.cpp tok/s | ratio | bankml max RSS (MB) | llama-bench max RSS (MB) |",
            "|---|---|---|---|---|---|---|"] + [
            f"| {r['model']} | {r['test']} | {r['bankml']:.2f} | {r['llama']:.2f} | {r['ratio']:.3f} | "
            f"{r['rss'][0]:.0f} | {r['rss'][1]:.0f} |" for r in rows]


def portable_md(rows: list[dict], a: argparse.Namespace) -> list[str]:
    return ["## Portable profile", "",
            f"tg128 of the portable profile (docs/PORTABLE.md) against the ggml profile's, both bankml on "
            f"{a.backend}, each in its own process, alternated, best of {a.reps}. The bar (issue 15): 0.8 on "
            "SmolLM2 Q4_1 and the Bonsai-shaped Q1_0, for the default ActScaling Sub32 (tg128); "
            "\"tg128 PerBlock\" is load(act_scaling=\"PerBlock\").", "",
            "| model | test | portable tok/s | ggml profile tok/s | ratio |", "|---|---|---|---|---|"] + [
            f"| {r['model']} | {r['test']} | {r['bankml']:.2f} | {r['llama']:.2f} | {r['ratio']:.3f} |" for r in rows]


def fresh_md(rows: list[dict], a: argparse.Namespace) -> list[str]:
    return ["## Fresh prompt", "",
            "Time to the first logits row of a prompt length never run before: `prefill(ids, outputs=\"last\")` in "
            "a process started as a server starts (load and compile, from the disk JIT cache when it holds the "
            "model's code: \"warm cache\"; start-up time in the note, not in the figure). The last row of each "
            "model is a cold start: the first request of a new process with an empty BANKML_CACHE, its graph "
            "compiled inside it. llama.cpp: `llama-bench -p N -n 0 -r 1`, N / avg_ts. "
            "Ratio llama.cpp s / bankml s.", "",
            "| model | prompt tokens | process | bankml s | llama.cpp s | ratio |", "|---|---|---|---|---|---|"] + [
            f"| {r['model']} | {r['n']} | {r['note']} | {r['bankml']:.3f} | {r['llama']:.3f} | {r['ratio']:.3f} |"
            for r in rows]


def long_md(rows: list[dict], a: argparse.Namespace) -> list[str]:
    return ["## Long decode", "",
            "Single-token decodes after a 1-token prompt in a new process started as a server starts "
            "(load and compile, from the disk cache), no other warm-up, each step timed. "
            "llama.cpp: `llama-bench -p 0 -n N -r 1`. Ratio bankml tok/s / llama.cpp tok/s.", "",
            "| model | tokens | JIT cache | bankml tok/s | llama.cpp tok/s | ratio | median step ms | "
            "slowest step ms (step) | slowest / median |", "|---|---|---|---|---|---|---|---|---|"] + [
            f"| {r['model']} | {r['n']} | {r['cache']} | {r['bankml']:.2f} | {r['llama']:.2f} | {r['ratio']:.3f} | "
            f"{r['median_s'] * 1e3:.2f} | {r['slowest_s'] * 1e3:.2f} ({r['slowest_step']}) | "
            f"{r['slowest_s'] / r['median_s']:.1f} |" for r in rows]


def write_docs(doc: Path, generated: str) -> None:
    """Replace the generated part of the doc (above KEEP); the hand-written part below stays."""
    old = doc.read_text() if doc.exists() else ""
    kept = old.split(KEEP, 1)[1] if KEEP in old else "\n"
    doc.write_text(generated + "\n" + KEEP + kept)


def command_line(seed: int) -> str:
    """This run's command as it could be typed again: --write-docs dropped, the seed pinned."""
    args = [x for x in sys.argv[1:] if x != "--write-docs"]
    if "--seed" not in args:
        args += ["--seed", str(seed)]
    return shlex.join(["python", "bench/run.py", *args])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llvm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="pp/tg: best of this many")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--rows", default=",".join(ROWS), help="which rows to run, of " + ",".join(ROWS))
    ap.add_argument("--fresh-lengths", type=int, default=5, help="fresh: how many prompt lengths")
    ap.add_argument("--long-tokens", type=int, default=1100, help="long: how many decode steps")
    ap.add_argument("--depth", type=int, default=2048, help="depth: cells in the cache before pp512/tg128")
    ap.add_argument("--depth-models", default=",".join(DEPTH_MODELS), help="depth: for these of --models")
    ap.add_argument("--portable-models", default=",".join(PORTABLE_MODELS), help="portable: for these of --models")
    ap.add_argument("--gen-tokens", default="128,1024", help="gen: the -n of each bankml run / llama-completion pair")
    ap.add_argument("--serve-requests", type=int, default=6, help="serve: chat requests a round")
    ap.add_argument("--serve-tokens", type=int, default=128, help="serve: max_tokens of each request")
    ap.add_argument("--serve-clients", default="1,2,4,8", help="serve: clients at once (and slots, -np) of each row")
    ap.add_argument("--seed", type=int, help="draws the fresh lengths and all token ids (default: a new one)")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help="K cache type (llama-bench's -ctk)")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache type (llama-bench's -ctv)")
    ap.add_argument("--one", help=argparse.SUPPRESS)         # internal: one bankml measurement, print JSON
    ap.add_argument("--one-test", default="pptg", help=argparse.SUPPRESS,
                    choices=["pptg", "fresh", "cold", "long", "depth", "bandwidth", "portable", "fma", "sampler"])
    ap.add_argument("--n", default="0", help=argparse.SUPPRESS)
    a = ap.parse_args()
    rows = a.rows.split(",")
    if bad := [r for r in rows if r not in ROWS]:
        ap.error(f"--rows: unknown {','.join(bad)}; choose from {','.join(ROWS)}")
    if a.fresh_lengths < 1 or a.fresh_lengths > FRESH_MAX - FRESH_MIN + 1 or a.long_tokens < 1:
        ap.error(f"--fresh-lengths must be 1..{FRESH_MAX - FRESH_MIN + 1} and --long-tokens at least 1")
    try:
        a.gen_tokens = [int(x) for x in a.gen_tokens.split(",")]
        a.serve_clients = [int(x) for x in a.serve_clients.split(",")]
    except ValueError:
        ap.error("--gen-tokens and --serve-clients are comma-separated integers")
    if min(a.gen_tokens) < 2 or min(a.serve_clients) < 1 or a.serve_requests < 1 or a.serve_tokens < 1:
        ap.error("--gen-tokens must be at least 2, --serve-clients, --serve-requests and --serve-tokens at least 1")
    if a.seed is None:
        a.seed = int(np.random.default_rng().integers(2**31))
    CACHE.update(cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v)
    if a.one:
        print(json.dumps(run_one(a)))
        return
    build()
    lengths = fresh_lengths(a.seed, a.fresh_lengths)
    print(f"seed {a.seed}, threads {a.threads}, backend {a.backend}" +
          (f", fresh prompt lengths {lengths}" if "fresh" in rows else ""))
    print_header()
    results = []
    machine = machine_rows(a) if {"tg", "long", "depth", "gen", "serve"} & set(rows) else None
    for model in a.models.split(","):
        path = models.path(model)
        name = labelled(model)
        if "pp" in rows or "tg" in rows:
            results += report(throughput_rows(name, path, a, rows))
        if "fresh" in rows:
            results += report(fresh_rows(name, path, a, lengths))
        if "long" in rows:
            results += report(long_rows(name, path, a))
        if "depth" in rows and name in a.depth_models.split(","):
            results += report(depth_rows(name, path, a))
        if "portable" in rows and name in a.portable_models.split(","):
            results += report(portable_rows(name, path, a))
        if "gen" in rows:
            results += generation.gen_rows(name, path, a, bankml_child)
        if "serve" in rows:
            results += generation.serve_rows(name, model, path, a)
    if machine is not None and {"tg", "long", "depth"} & set(rows):
        results += report_bounds(results, machine["gb_s"], a)
    if a.write_docs:
        write_docs(DOC, markdown(results, a, command_line(a.seed), machine) + "\n" + depth_and_bound_md(results, a))


if __name__ == "__main__":
    sys.exit(main())
