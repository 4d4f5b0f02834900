"""A request fuzzer for `bankml serve`: hostile bodies over every route and field, several clients
at once, each answer checked for its shape.

    python -m bankml.testing.fuzz [--cases 10000] [--clients 8] [--seed 1]

starts a server on a small test model and prints the figures docs/SERVER.md quotes; the test
suite runs a shorter pass (tests/server/test_fuzz.py). A case is a valid request of one route
with one to three fields replaced by hostile values (wrong types, huge and non-finite numbers,
deep nesting, huge strings), or a broken body (cut JSON, invalid UTF-8, not an object), or a
broken connection (cut mid-body, gone mid-answer, a slow client). An answer is right when it is
a 2xx of the route's shape, or a 4xx/503 JSON error of the documented shape; a 500, a body that
does not parse, a traceback in the log, a dead server or memory that does not come back fail.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

OPENAI = ("/v1/chat/completions", "/v1/completions", "/completion")
OLLAMA = ("/api/chat", "/api/generate")
GETS = ("/", "/health", "/v1/models", "/slots", "/api/tags", "/api/version", "/nope")

# the fields the routes read (server/fields.py SAMPLING and the rest), and Ollama's options
FIELDS = ("top_k", "top_p", "min_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "temperature",
          "dynatemp_range", "dynatemp_exponent", "repeat_last_n", "repeat_penalty", "frequency_penalty",
          "presence_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
          "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "min_keep", "seed", "stop", "stream",
          "stream_options", "n_predict", "max_tokens", "max_completion_tokens", "logit_bias", "ignore_eos", "samplers",
          "n_probs", "post_sampling_probs", "logprobs", "top_logprobs", "cache_prompt", "prompt", "messages", "model",
          "return_tokens", "verbose", "system", "raw", "options", "keep_alive", "format", "images")
OPTIONS = ("num_predict", "seed", "temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_last_n",
           "repeat_penalty", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau", "mirostat_eta",
           "stop", "num_keep", "penalize_newline", "num_ctx")


# the server the fuzzer runs: two slots, a queue, and a prompt cache small enough that memory
# growth beyond it means a leak
CACHE_MIB = 16
SERVER_ARGS = ("--parallel", "2", "--queue", "64", "--ctx", "512", "--cache-ram", str(CACHE_MIB))


def hostile(rng: random.Random):
    """One value of a kind a client should not send."""
    k = rng.randrange(16)
    if k == 0:
        return None
    if k == 1:
        return rng.choice([True, False])
    if k == 2:
        return rng.choice([0, -1, 1, 2**31, -2**31 - 1, 2**63, 10**30, -10**30])
    if k == 3:
        return rng.choice([0.5, -0.0, 1e-45, 3.5e38, 1e308, -1e308, 2.5])
    if k == 4:
        return rng.choice([float("nan"), float("inf"), float("-inf")])
    if k == 5:
        return "x" * rng.choice([0, 1, 1000, 200_000])
    if k == 6:
        return rng.choice(["\ud800", "\x00", "é" * 50, "<|im_start|>", "{{ 7*7 }}", "%s%n", "../../etc/passwd"])
    if k == 7:
        return []
    if k == 8:
        return [hostile(rng) for _ in range(rng.randrange(1, 5))]
    if k == 9:
        return {}
    if k == 10:
        return {str(hostile(rng))[:20]: hostile(rng) for _ in range(rng.randrange(1, 4))}
    if k == 11:
        v: object = 1
        for _ in range(rng.choice([50, 900])):         # deeper: the raw bodies below
            v = [v]
        return v
    if k == 12:
        return [{"role": rng.choice(["user", "system", "assistant", "tool", "bad", 5]), "content": hostile(rng)}]
    if k == 13:
        return {str(rng.randrange(-5, 70000)): hostile(rng) for _ in range(3)}
    if k == 14:
        return list(range(rng.choice([1, 100, 5000])))
    return rng.choice(["1", "true", "null", "NaN"])


def valid(path: str, rng: random.Random) -> dict:
    """A small request that works (a few tokens, a fresh prompt)."""
    n = rng.choice([1, 2, 3])
    text = rng.choice(["Hi", "Once upon", "1, 2, 3,", "def f():"])
    if path == "/v1/chat/completions":
        return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": n}
    if path in ("/v1/completions", "/completion"):
        return {"prompt": text, "max_tokens": n, "n_predict": n}
    if path == "/api/chat":
        return {"model": "m", "messages": [{"role": "user", "content": text}], "stream": False,
                "options": {"num_predict": n}}
    return {"model": "m", "prompt": text, "stream": False, "options": {"num_predict": n}}


def _cap(path: str, body: dict) -> dict:
    """Keep generations short whatever a case set (the answer's shape is the point, not its length)."""
    if isinstance(body, dict):
        for k in ("max_tokens", "n_predict", "max_completion_tokens"):
            if isinstance(body.get(k), (int, float)) and not isinstance(body.get(k), bool) and not body[k] < 0:
                body[k] = min(body[k], 8)
        if path in OPENAI and body.get("n_predict") is None and body.get("max_tokens") is None:
            body["max_tokens"] = 8
        o = body.get("options")
        if isinstance(o, dict) and isinstance(o.get("num_predict"), (int, float)) and not isinstance(o["num_predict"], bool):
            o["num_predict"] = min(o["num_predict"], 8) if o["num_predict"] >= 0 else 8
    return body


@dataclass
class Case:
    method: str
    path: str
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    conn: str = "plain"             # "plain" | "cut_body" | "leave_answer" | "slow"
    stream: bool = False


def cases(seed: int, n: int, key: str | None = None):
    rng = random.Random(seed)
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    for i in range(n):
        r = rng.random()
        if r < 0.05:
            yield Case("GET", rng.choice(GETS), headers=dict(auth))
            continue
        path = rng.choice(OPENAI + OLLAMA + ("/api/show",))
        body = valid(path, rng) if path != "/api/show" else {"model": "m"}
        raw = None
        if r < 0.12:                                # a broken body
            raw = rng.choice([b"", b"{", b'{"prompt": "a"', b"[1, 2]", b'"text"', b"\xff\xfe{}", b"null",
                              b'{"prompt": "\xc3\x28"}', b"{}" * 1000, b'{"a":' * 5000, b"NaN",
                              b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                              b'{"messages": [' + b'{"content": ' * 20_000 + b"1" + b"}" * 20_000 + b"]}"])
        else:
            for _ in range(rng.randrange(1, 4)):
                name = rng.choice(FIELDS)
                if path in OLLAMA and rng.random() < 0.4:
                    opts = body.setdefault("options", {})
                    if isinstance(opts, dict):
                        opts[rng.choice(OPTIONS)] = hostile(rng)
                    continue
                body[name] = hostile(rng)
        if raw is None:
            body = _cap(path, body)
            raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
        stream = isinstance(body, dict) and body.get("stream") is True
        conn = "plain"
        c = rng.random()
        if c < 0.02:
            conn = "cut_body"
        elif c < 0.04:
            conn = "leave_answer"
        elif c < 0.05:
            conn = "slow"
        headers = {**auth}
        if rng.random() < 0.8:
            headers["Content-Type"] = "application/json"
        yield Case("POST", path, raw, headers, conn, stream)


# ---------------------------------------------------------------- checking

def problem(case: Case, status: int, ctype: str, text: str) -> str | None:
    """Why an answer is wrong, or None."""
    if status == 500 or status >= 502 and status != 503:
        return f"status {status}"
    if "Traceback" in text or 'File "/' in text:
        return "a traceback in the answer"
    if status >= 400:
        try:
            err = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return f"status {status} without a JSON error: {text[:120]!r}"
        if case.path.startswith("/api/"):
            return None if isinstance(err, str) and err else f"not Ollama's error shape: {text[:120]!r}"
        ok = isinstance(err, dict) and isinstance(err.get("message"), str) and err.get("code") == status
        return None if ok else f"not llama-server's error shape: {text[:120]!r}"
    if status != 200:
        return f"status {status}"
    if ctype.startswith(("text/plain", "text/html")):      # GET /: the probe text or the page
        return None
    try:
        if "text/event-stream" in ctype:
            for line in text.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        return f"an error in a stream: {line[:120]}"
        elif "ndjson" in ctype:
            for line in text.splitlines():
                if line.strip() and "error" in json.loads(line):
                    return f"an error in a stream: {line[:120]}"
        else:
            json.loads(text)
    except ValueError:
        return f"a 200 that does not parse: {text[:120]!r}"
    return None


@dataclass
class Report:
    statuses: Counter = field(default_factory=Counter)
    conns: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        s = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))
        return (f"{sum(self.statuses.values()) + sum(self.conns.values())} cases in {self.seconds:.0f} s; "
                f"answers {s}; broken connections {dict(self.conns)}; problems {len(self.problems)}")


async def _raw(url: str, case: Case) -> None:
    """The connection-level cases, on a bare socket."""
    host, port = url.split("//")[1].split(":")
    loop = asyncio.get_running_loop()

    def go():
        with socket.create_connection((host, int(port)), timeout=10) as s:
            head = (f"POST {case.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(case.body)}\r\n"
                    + "".join(f"{k}: {v}\r\n" for k, v in case.headers.items()) + "\r\n").encode()
            if case.conn == "cut_body":
                s.sendall(head + case.body[:len(case.body) // 2])
                return
            if case.conn == "slow":
                s.sendall(head)
                for i in range(0, len(case.body), max(1, len(case.body) // 4)):
                    time.sleep(0.05)
                    s.sendall(case.body[i:i + max(1, len(case.body) // 4)])
                s.recv(65536)
                return
            s.sendall(head + case.body)           # leave_answer: gone once the answer starts
            s.recv(64)
    await loop.run_in_executor(None, go)


async def run(url: str, all_cases, clients: int) -> Report:
    rep = Report()
    q: asyncio.Queue = asyncio.Queue()
    for c in all_cases:
        q.put_nowait(c)
    t0 = time.perf_counter()

    async def worker():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            while not q.empty():
                case = q.get_nowait()
                if case.conn != "plain":
                    try:
                        await _raw(url, case)
                    except OSError:
                        pass
                    rep.conns[case.conn] += 1
                    continue
                try:
                    r = await client.request(case.method, case.path, content=case.body or None, headers=case.headers)
                except httpx.HTTPError as e:
                    rep.problems.append((case.path, case.body[:300], f"no answer: {type(e).__name__} {e}"))
                    continue
                rep.statuses[r.status_code] += 1
                why = problem(case, r.status_code, r.headers.get("content-type", ""), r.text)
                if why:
                    rep.problems.append((case.path, case.body[:300], why))
    await asyncio.gather(*(worker() for _ in range(clients)))
    rep.seconds = time.perf_counter() - t0
    return rep


@dataclass
class Outcome:
    report: Report
    healthy: bool
    rss0_mib: float
    rss1_mib: float
    log: str

    def lines(self) -> list[str]:
        return [self.report.line(),
                f"healthy after: {self.healthy}; RSS {self.rss0_mib:.0f} -> {self.rss1_mib:.0f} MiB "
                f"(prompt cache {CACHE_MIB} MiB); tracebacks in the log: {self.log.count('Traceback')}"]


def fuzz_server(n: int, clients: int, seed: int, model: str = "qwen3-small-q1_0") -> Outcome:
    """A fresh server (SERVER_ARGS), warmed up, then n cases from `clients` clients at once."""
    from bankml.testing.serve import BankmlServer
    with BankmlServer(model, *SERVER_ARGS, threads=2) as srv:
        for _ in range(20):
            httpx.post(srv.url + "/v1/completions", json={"prompt": "warm", "max_tokens": 4})
        rss0 = srv.rss_kib() / 1024
        rep = asyncio.run(run(srv.url, cases(seed, n), clients))
        time.sleep(1)
        healthy = httpx.get(srv.url + "/health").status_code == 200 and \
            httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
        return Outcome(rep, healthy, rss0, srv.rss_kib() / 1024, srv.log())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default="qwen3-small-q1_0")
    ap.add_argument("--log", help="write the server's log here")
    a = ap.parse_args()
    out = fuzz_server(a.cases, a.clients, a.seed, a.model)
    if a.log:
        with open(a.log, "w") as f:
            f.write(out.log)
    print("\n".join(out.lines()))
    for p in out.report.problems[:20]:
        print("PROBLEM", p)


if __name__ == "__main__":
    main()
