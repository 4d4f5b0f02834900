"""The path a user runs, in the same run as bench/run.py's bare decode rows: `bankml run` against
`llama-completion`, `bankml serve` against `llama-server`, and the sampler's share of a token.

gen (run.py --rows gen): one raw prompt (PROMPT) completed by `bankml run --raw --ignore-eos
--json` and by `llama-completion -no-cnv --ignore-eos`, with the same -t, -c, -n, seed and K/V
cache types, for each -n of --gen-tokens and three samplers: greedy (`--temp 0`), llama.cpp's
default chain (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, both sides' defaults) with
`--seed`, and that chain under `--grammar GRAMMAR` (a list of short strings that never has to end:
each token checked, a rejected one drawn again from the masked row). Every run is a new process. The figure is the generation phase's tokens/s from each
tool's own report (bankml's timings.predicted_per_second, llama-completion's `eval time` line:
both count the decodes after the first token); the whole process's wall time stands beside it.
Cold: the model's first bankml run, on an empty BANKML_CACHE (its graphs compiled inside the
run), against llama-completion's first run of the same setting (llama.cpp has no compiled-code
cache; the model file is in the page cache for both). Warm: best of --reps afterwards on that
cache (the run of the higher tok/s, its wall time beside), each bankml run followed by the
llama.cpp run of the same setting. "same text": both printed the same text.

sampler: in one bankml process (load, graphs compiled, a warm-up generation), --gen-tokens[0]
tokens of each sampler after PROMPT with Sampler.sample and Session.decode timed apart (the
grammar made anew for the timed run, as each `bankml run` makes it); the
share is sample / (sample + decode) per token. llama.cpp's, from its warm run of the same
setting: `sampling time` per sampled token against `eval time` per run.

serve (run.py --rows serve): for each C of --serve-clients, `bankml serve --parallel C` and
`llama-server -np C --jinja` (same model, -t and per-slot context: llama-server's -c is the
total, so ctx x C), alternated over --reps rounds, each round a new process of each: started,
sent max(--serve-requests, 2C) chat requests (user messages not sent before in this run, max_tokens
--serve-tokens, llama.cpp's default sampling with a seed each, streamed with usage) from C client
threads over urllib, stopped. The figures: completion tokens over the requests' wall time
(start-up apart), best round and first round; and each request's time to its first token (from
sending it to the first content chunk), median and slowest of the best round. bankml's first
start has an empty BANKML_CACHE (cold: it compiles every graph before /health answers); later
starts reuse it (warm).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

import bankml
from bankml.oracle.completion import completion
from bankml.oracle.server import LlamaServer
from bankml.testing.serve import BankmlServer

PROMPT = "The history of the printing press begins"
SAMPLERS = ("greedy", "default", "grammar")
# "grammar": the default chain under a GBNF grammar that never has to end (so --ignore-eos never
# leaves it nothing to pick): a JSON-like list of short strings
GRAMMAR = 'root ::= "[" item ("," " "? item)*\nitem ::= "\\"" [a-zA-Z .,]{1,40} "\\""'


def _flags(sampler: str) -> list[str]:
    """The sampler's flags, the same for `bankml run` and llama-completion."""
    return {"greedy": ["--temp", "0"], "default": [], "grammar": ["--grammar", GRAMMAR]}[sampler]
GEN_CTX = 4096                  # -c of every run, and of each server slot
CHATS = [
    "Write a short story about a lighthouse keeper.", "Explain how a bicycle stays upright.",
    "Describe a walk through a rainy city.", "What makes bread rise? Explain in detail.",
    "Tell me about the planets of the solar system.", "Write a letter to a friend about a summer trip.",
    "How do bees make honey?", "Describe the life of a tree over a hundred years.",
    "Explain how a steam engine works.", "Write a poem about the sea and the wind.",
    "What happens inside a volcano?", "Tell a story about a lost dog finding its way home.",
    "Explain why the sky is blue.", "Describe a busy market in the morning.",
    "How does a library organise its books?", "Write a fable about a fox and a crow.",
]


# ---- gen: bankml run vs llama-completion ----

def _bankml_run(path: Path, a, n: int, sampler: str, env: dict) -> dict:
    cmd = [sys.executable, "-m", "bankml.cli", "run", str(path), "--raw", "-p", PROMPT, "-n", str(n),
           "--seed", str(a.seed), "--threads", str(a.threads), "--ctx", str(GEN_CTX), "--backend", a.backend,
           "--ignore-eos", "--json", "-ctk", a.cache_type_k, "-ctv", a.cache_type_v, *_flags(sampler)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=3600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bankml run failed ({p.returncode}): {p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    t = out["timings"]
    return {"tok_s": t["predicted_per_second"], "n": t["predicted_n"], "wall_s": wall, "text": out["text"],
            "compile_s": t["compile_ms"] / 1e3}


def _llama_run(path: Path, a, n: int, sampler: str) -> dict:
    r = completion(path, PROMPT, n, temp=None, seed=a.seed, threads=a.threads, n_ctx=GEN_CTX, ignore_eos=True,
                   extra=("-ctk", a.cache_type_k, "-ctv", a.cache_type_v, *_flags(sampler)))
    p = r["perf"]
    return {"tok_s": p["eval_per_second"], "n": p["eval_n"] + 1, "wall_s": r["wall_s"], "text": r["text"],
            "sample_ms": p["sampling_ms"] / n, "eval_ms": p["eval_ms"] / max(1, p["eval_n"])}


def gen_rows(name: str, path: Path, a, bankml_child) -> list[dict]:
    """Cold (the first bankml run, empty cache) then warm rows, best of --reps, bankml and llama.cpp
    alternated; then the sampler's share (a bankml child) beside llama.cpp's from its warm runs."""
    settings = [(n, s) for n in a.gen_tokens for s in SAMPLERS]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bankml-bench-gen-") as cache:
        env = {**os.environ, "BANKML_CACHE": cache}
        n0, s0 = settings[0]
        cold = _bankml_run(path, a, n0, s0, env)
        rows.append(_gen_row(name, n0, s0, f"cold (empty cache: {cold['compile_s']:.1f} s compiling)", cold,
                             _llama_run(path, a, n0, s0)))
        best: dict = {}
        for _ in range(a.reps):
            for n, s in settings:
                pair = (_bankml_run(path, a, n, s, env), _llama_run(path, a, n, s))
                old = best.get((n, s))
                best[(n, s)] = tuple(max(o, x, key=lambda r: r["tok_s"]) for o, x in zip(old or pair, pair))
        rows += [_gen_row(name, n, s, "warm", *best[(n, s)]) for n, s in settings]
    for r in rows:
        print_gen(r)
    share = bankml_child(path, a, "sampler", a.gen_tokens[0])
    for s in SAMPLERS:
        llama = best[(a.gen_tokens[0], s)][1]
        mine = share[s]
        r = {"model": name, "kind": "sampler", "test": f"sampler {s}", "sampler": s, "n": a.gen_tokens[0], **mine,
             "llama_sample_ms": llama["sample_ms"], "llama_eval_ms": llama["eval_ms"],
             "llama_share": llama["sample_ms"] / (llama["sample_ms"] + llama["eval_ms"])}
        print_sampler(r)
        rows.append(r)
    return rows


def _gen_row(name: str, n: int, sampler: str, cache: str, ours: dict, theirs: dict) -> dict:
    counts = "" if ours["n"] == theirs["n"] == n else f"; generated {ours['n']} vs {theirs['n']} tokens"
    return {"model": name, "kind": "gen", "test": f"run -n {n} {sampler}", "n": n, "sampler": sampler,
            "cache": cache, "bankml": ours["tok_s"], "llama": theirs["tok_s"], "ratio": ours["tok_s"] / theirs["tok_s"],
            "wall": (ours["wall_s"], theirs["wall_s"]), "same_text": ours["text"] == theirs["text"],
            "note": counts}


def sampler_share(path: Path, backend: str, threads: int, n: int, seed: int, cache: dict) -> dict:
    """In this process: n tokens of each sampler after PROMPT, Sampler.sample and Session.decode
    timed apart (ms per token), after one untimed generation of the same (compiles, warms)."""
    from bankml.runtime.grammar.matcher import for_vocab
    from bankml.runtime.sampler import GREEDY, Sampler, SamplerParams
    from bankml.tokenizer import tokenizer_for
    m = bankml.load(path, backend=backend, threads=threads, n_ctx=GEN_CTX, **cache)
    ids = m.tokenize(PROMPT, add_special=True, parse_special=True)
    m.prepare_for(0, len(ids), n)
    out = {}
    for name, params in (("greedy", GREEDY), ("default", SamplerParams()), ("grammar", SamplerParams())):
        for _ in range(2):                              # the first is the warm-up (and decodes the vocabulary)
            grammar = for_vocab(GRAMMAR, tokenizer_for(m)) if name == "grammar" else None
            sess, sampler = m.session(), Sampler(params, seed, grammar=grammar)
            row = sess.prefill(ids, outputs="last")[-1]
            t_sample, t_decode = [], []
            for i in range(n):
                t0 = time.perf_counter()
                tok = sampler.sample(row)
                t1 = time.perf_counter()
                t_sample.append(t1 - t0)
                if i + 1 < n:
                    row = sess.decode(tok)
                    t_decode.append(time.perf_counter() - t1)
        s, d = 1e3 * float(np.mean(t_sample)), 1e3 * float(np.mean(t_decode))
        out[name] = {"sample_ms": s, "decode_ms": d, "share": s / (s + d)}
    m.close()
    return out


# ---- serve: bankml serve vs llama-server ----

def _chat(url: str, content: str, seed: int, max_tokens: int) -> dict:
    """One streamed chat request: its text, completion tokens (the usage chunk) and time to first token."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0, ttft, text, usage = time.perf_counter(), None, "", None
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = time.perf_counter() - t0 if ttft is None else ttft
                    text += piece
            usage = chunk.get("usage") or usage
    if usage is None:
        raise RuntimeError(f"{url}: a streamed chat answer without usage")
    return {"text": text, "completion_tokens": int(usage["completion_tokens"]), "ttft_s": ttft or 0.0}


def _requests_round(url: str, requests: list[tuple[str, int]], clients: int) -> dict:
    """requests from `clients` threads at once, each sending its share one after another."""
    replies: list = [None] * len(requests)
    errors: list = []

    def client(k: int) -> None:
        try:
            for i in range(k, len(requests), clients):
                replies[i] = _chat(url, *requests[i])
        except Exception as e:          # re-raised in the caller's thread
            errors.append(e)
    ts = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    tokens = sum(r["completion_tokens"] for r in replies)
    ttft = [r["ttft_s"] for r in replies]
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "texts": [r["text"] for r in replies],
            "ttft_s": (float(np.median(ttft)), max(ttft))}


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _serve_round(side: str, model: str, path: Path, a, clients: int, requests, env: dict) -> dict:
    """One new server process of `side`: start-up (to /health), one round of requests, peak RSS."""
    kv = ("-ctk", a.cache_type_k, "-ctv", a.cache_type_v)
    t0 = time.perf_counter()
    if side == "bankml":
        srv = BankmlServer(model, "--parallel", str(clients), "--ctx", str(GEN_CTX), *kv, threads=a.threads,
                           env=env, start_timeout_s=1800)
    else:
        srv = LlamaServer(path, threads=a.threads, n_ctx=GEN_CTX * clients, extra=("-np", str(clients), *kv))
    try:
        start = time.perf_counter() - t0
        r = _requests_round(srv.url, requests, clients)
        return {**r, "start_s": start, "rss_mb": _peak_rss_mb(srv.proc.pid)}
    finally:
        srv.close()


def serve_rows(name: str, model: str, path: Path, a) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bankml-bench-serve-") as cache:
        env = {**os.environ, "BANKML_CACHE": cache}
        used = 0                            # chat messages sent so far: every round's are new
        for clients in a.serve_clients:
            k = max(a.serve_requests, 2 * clients)
            rounds = {"bankml": [], "llama": []}
            for _ in range(a.reps):
                requests = [(CHATS[(used + i) % len(CHATS)], a.seed + used + i, a.serve_tokens) for i in range(k)]
                used += k
                for side in rounds:
                    rounds[side].append(_serve_round(side, model, path, a, clients, requests, env))
            rows.append(_serve_row(name, clients, k, rounds))
            print_serve(rows[-1])
    return rows


def _serve_row(name: str, clients: int, k: int, rounds: dict) -> dict:
    best = {side: max(rs, key=lambda r: r["tok_s"]) for side, rs in rounds.items()}
    same = sum(x == y for b, ll in zip(rounds["bankml"], rounds["llama"]) for x, y in zip(b["texts"], ll["texts"]))
    total = sum(len(b["texts"]) for b in rounds["bankml"])
    return {"model": name, "kind": "serve", "test": f"serve x{clients}", "clients": clients, "requests": k,
            "bankml": best["bankml"]["tok_s"], "llama": best["llama"]["tok_s"],
            "ratio": best["bankml"]["tok_s"] / best["llama"]["tok_s"],
            "first": (rounds["bankml"][0]["tok_s"], rounds["llama"][0]["tok_s"]),
            "tokens": (best["bankml"]["tokens"], best["llama"]["tokens"]),
            "ttft_s": (best["bankml"]["ttft_s"], best["llama"]["ttft_s"]),
            "start_s": ([r["start_s"] for r in rounds["bankml"]], [r["start_s"] for r in rounds["llama"]]),
            "rss": (max(r["rss_mb"] for r in rounds["bankml"]), max(r["rss_mb"] for r in rounds["llama"])),
            "same": (same, total)}


# ---- output ----

def print_gen(r: dict) -> None:
    print(f"{r['model']:20} {r['test']:22} {r['bankml']:8.2f} tok/s {r['llama']:8.2f} tok/s {r['ratio']:7.3f}  "
          f"{r['cache']}; wall {r['wall'][0]:.2f} s vs {r['wall'][1]:.2f} s; "
          f"{'same text' if r['same_text'] else 'TEXT DIFFERS'}{r['note']}", flush=True)


def print_sampler(r: dict) -> None:
    print(f"{r['model']:20} sampler {r['sampler']:8} -n {r['n']}: bankml sample {r['sample_ms']:.3f} ms + "
          f"decode {r['decode_ms']:.3f} ms a token ({100 * r['share']:.1f}% sampling); llama.cpp sampling "
          f"{r['llama_sample_ms']:.3f} ms + eval {r['llama_eval_ms']:.3f} ms ({100 * r['llama_share']:.1f}%)",
          flush=True)


def print_serve(r: dict) -> None:
    b, ll = r["start_s"]
    print(f"{r['model']:20} {r['test']:22} {r['bankml']:8.2f} tok/s {r['llama']:8.2f} tok/s {r['ratio']:7.3f}  "
          f"{r['requests']} requests, {r['tokens'][0]} vs {r['tokens'][1]} tokens; first token median "
          f"{r['ttft_s'][0][0]:.2f} vs {r['ttft_s'][1][0]:.2f} s (slowest {r['ttft_s'][0][1]:.2f} vs "
          f"{r['ttft_s'][1][1]:.2f} s); first round "
          f"{r['first'][0]:.2f} vs {r['first'][1]:.2f} tok/s; start {', '.join(f'{s:.1f}' for s in b)} s vs "
          f"{', '.join(f'{s:.1f}' for s in ll)} s; same text {r['same'][0]}/{r['same'][1]}", flush=True)


def markdown(rows: list[dict], a) -> list[str]:
    """docs/PERFORMANCE.md's generation, serving and sampler tables (each when its rows ran)."""
    lines = []
    if mine := [r for r in rows if r["kind"] == "gen"]:
        lines += ["## What a user runs: `bankml run` and `llama-completion`", "",
                  f"`bankml run --raw --ignore-eos --json` and `llama-completion -no-cnv --ignore-eos` on the "
                  f"prompt \"{PROMPT}\", -t {a.threads}, -c {GEN_CTX}, seed {a.seed}; greedy is `--temp 0`, "
                  "default is llama.cpp's default chain (both sides' defaults), grammar that chain under `--grammar` "
                  "(bench/generation.py's GRAMMAR). Each run is a new process. "
                  "tok/s: the generation phase from each tool's own report (bankml's timings, "
                  "llama-completion's `eval time`); wall: the whole process. Cold: the model's first bankml "
                  "run, on an empty BANKML_CACHE (compile time inside its wall, not its tok/s), against "
                  "llama-completion's first run (no compiled-code cache; the model file in the page cache for "
                  f"both). Warm: best of {a.reps}, bankml and llama.cpp alternated.", "",
                  "| model | -n | sampler | run | bankml tok/s | llama.cpp tok/s | ratio | bankml wall s | "
                  "llama.cpp wall s | same text |", "|---|---|---|---|---|---|---|---|---|---|"] + [
                  f"| {r['model']} | {r['n']} | {r['sampler']} | {r['cache']} | {r['bankml']:.2f} | "
                  f"{r['llama']:.2f} | {r['ratio']:.3f} | {r['wall'][0]:.2f} | {r['wall'][1]:.2f} | "
                  f"{'yes' if r['same_text'] else 'no'}{r['note']} |" for r in mine] + [""]
    if mine := [r for r in rows if r["kind"] == "sampler"]:
        bare = {r["model"]: r for r in rows if r["kind"] == "pptg" and r["test"] == "tg128"}
        lines += ["## The sampler's share of a token", "",
                  "bankml: one process, a warm-up generation, then -n tokens after the same prompt with "
                  "Sampler.sample and Session.decode timed apart (ms a token). llama.cpp: its warm "
                  "llama-completion run above, `sampling time` per sampled token and `eval time` per run. "
                  "Beside them, this run's bare tg128 (decode and argmax, no sampler; llama-bench).", "",
                  "| model | sampler | bankml sample ms | bankml decode ms | bankml sampling % | llama.cpp "
                  "sampling ms | llama.cpp eval ms | llama.cpp sampling % | bare tg128 bankml / llama-bench tok/s |",
                  "|---|---|---|---|---|---|---|---|---|"] + [
                  f"| {r['model']} | {r['sampler']} | {r['sample_ms']:.3f} | {r['decode_ms']:.3f} | "
                  f"{100 * r['share']:.1f} | {r['llama_sample_ms']:.3f} | {r['llama_eval_ms']:.3f} | "
                  f"{100 * r['llama_share']:.1f} | " + (f"{bare[r['model']]['bankml']:.2f} / {bare[r['model']]['llama']:.2f}"
                                                        if r["model"] in bare else "not run") + " |"
                  for r in mine] + [""]
    if mine := [r for r in rows if r["kind"] == "serve"]:
        lines += ["## What a user runs: `bankml serve` and `llama-server`", "",
                  f"`bankml serve --parallel C` and `llama-server -np C --jinja`, -t {a.threads}, {GEN_CTX} "
                  f"tokens a slot; max({a.serve_requests}, 2C) chat requests a round (new user messages, "
                  f"max_tokens {a.serve_tokens}, llama.cpp's default sampling with a seed each) from C "
                  f"client threads; {a.reps} round{'s' if a.reps > 1 else ''}, each a new process of each side, "
                  "alternated. tok/s: "
                  "completion tokens over the round's wall time, start-up apart (bankml's slots share each decode "
                  "step: continuous batching, docs/SERVER.md). First token: each streamed request's time from "
                  "sending to its first content chunk, median and slowest, best round. Start-up: to /health; "
                  "bankml's first start has an empty BANKML_CACHE (cold: every graph compiled before it "
                  "answers), later ones reuse it.", "",
                  "| model | clients | bankml tok/s | llama-server tok/s | ratio | first round bankml / llama | "
                  "first token s, median (slowest) bankml / llama | "
                  "completion tokens | bankml start s | llama-server start s | max RSS MB bankml / llama | "
                  "same text |", "|---|---|---|---|---|---|---|---|---|---|---|---|"] + [
                  f"| {r['model']} | {r['clients']} | {r['bankml']:.2f} | {r['llama']:.2f} | {r['ratio']:.3f} | "
                  f"{r['first'][0]:.2f} / {r['first'][1]:.2f} | {r['ttft_s'][0][0]:.2f} ({r['ttft_s'][0][1]:.2f}) / "
                  f"{r['ttft_s'][1][0]:.2f} ({r['ttft_s'][1][1]:.2f}) | {r['tokens'][0]} / {r['tokens'][1]} | "
                  f"{', '.join(f'{s:.1f}' for s in r['start_s'][0])} | "
                  f"{', '.join(f'{s:.1f}' for s in r['start_s'][1])} | {r['rss'][0]:.0f} / {r['rss'][1]:.0f} | "
                  f"{r['same'][0]}/{r['same'][1]} |" for r in mine] + [""]
    return lines
