"""llama-server (b11434) on loopback as an oracle for generation, sampling and chat templates.

    with LlamaServer("m.gguf", threads=2) as srv:
        ids = srv.completion([1, 2, 3], n_predict=16, temperature=0.8, seed=42)
        prompt = srv.apply_template([{"role": "user", "content": "hi"}])
    ids = server.generate("m.gguf", "Once upon a time", 16, temp=0.0, seed=0)

The server listens on 127.0.0.1 only, every wait is bounded, and the process is always ended
(close(), the context manager, or interpreter exit).
"""
from __future__ import annotations

import atexit
import json
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from bankml.errors import OracleError
from bankml.oracle.loopback import free_port, stop, wait_for_health
from bankml.oracle.paths import bin_dir

START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0


class LlamaServer:
    """One llama-server process: `-m MODEL --host 127.0.0.1 --port P -t T --jinja -np 1 -c n_ctx`."""

    def __init__(self, model, threads: int = 2, n_ctx: int = 4096, extra: tuple[str, ...] = ()):
        self.model = str(model)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()
        cmd = [str(bin_dir() / "llama-server"), "-m", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx),
               "-np", "1", "--jinja", "--no-webui", *extra]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        atexit.register(self.close)
        try:
            wait_for_health(self.proc, self.url, START_TIMEOUT_S, "llama-server", self._read_log)
        except BaseException:
            self.close()
            raise

    def _read_log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise OracleError(f"llama-server {path}: HTTP {e.code} {e.read()[:500]!r}") from e

    def completion(self, prompt, n_predict: int, temperature: float = 0.0, seed: int = 0, **sampling) -> list[int]:
        """llama.cpp's generated token ids for `prompt` (text or token ids), default sampler chain."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature, "seed": seed,
                "return_tokens": True, "cache_prompt": False, "stream": False, **sampling}
        return list(self.post("/completion", body)["tokens"])

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """/tokenize: common_tokenize, i.e. llama_tokenize, of the server's vocabulary."""
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        return list(self.post("/tokenize", body)["tokens"])

    def apply_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt llama-server renders from `messages` with the model's template (--jinja)."""
        body = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        return self.post("/apply-template", body)["prompt"]

    def apply_template_body(self, body: dict) -> str:
        """/apply-template of a whole request body (chat_template_kwargs, reasoning_effort, ...)."""
        return self.post("/apply-template", body)["prompt"]

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None:
            stop(proc, 10)
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chat_reply(body: dict) -> dict:
    """A /v1/chat/completions answer (llama-server's, and `bankml serve`'s, of the same shape) as the
    figures a benchmark reads: the text, usage's token counts and the server's own `timings`
    (predicted_per_second: its generation phase; prompt_ms: the prompt's processing)."""
    try:
        choice, usage, t = body["choices"][0], body["usage"], body["timings"]
        return {"text": choice["message"]["content"], "finish_reason": choice["finish_reason"],
                "prompt_tokens": int(usage["prompt_tokens"]), "completion_tokens": int(usage["completion_tokens"]),
                "prompt_ms": float(t["prompt_ms"]), "predicted_n": int(t["predicted_n"]),
                "predicted_ms": float(t["predicted_ms"]), "predicted_per_second": float(t["predicted_per_second"])}
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise OracleError(f"not a chat completion with usage and timings ({e!r}): {str(body)[:500]}") from None


def generate(model, prompt, n: int, temp: float = 0.0, seed: int = 0, threads: int = 2) -> list[int]:
    """llama-server's generated token ids (prompt as text or ids), one server for this call."""
    with LlamaServer(Path(model), threads=threads) as srv:
        return srv.completion(prompt, n, temperature=temp, seed=seed)


def apply_template(model, messages: list[dict], add_generation_prompt: bool = True) -> str:
    with LlamaServer(Path(model), threads=2) as srv:
        return srv.apply_template(messages, add_generation_prompt)
