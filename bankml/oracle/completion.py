"""llama-completion (b11434) as a user runs it: a raw completion in a fresh process, the text it
prints and its own timing report (common_perf_print, on stderr).

    r = completion("m.gguf", "Once upon a time", 128, temp=0.0, seed=1, threads=2, ignore_eos=True)
    r["text"], r["perf"]["eval_per_second"], r["wall_s"]

The flags: `-no-cnv` (no chat template, no interactive turn: the prompt text is completed as
given, tokenized with the vocabulary's special tokens), `--no-display-prompt` (stdout is the
generated text, then the blank line it prints before its report), `--simple-io`, stdin closed.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from bankml.errors import OracleError
from bankml.oracle.paths import bin_dir

TIMEOUT_S = 1800.0

# common_perf_print (common/sampling.cpp), e.g.
#   common_perf_print:        eval time =    2159.87 ms /    15 runs   (  143.99 ms per token, ...)
_PERF = re.compile(r"common_perf_print:\s+(?P<what>[a-z ]+?) time =\s+(?P<ms>[\d.]+) ms"
                   r"(?: /\s+(?P<n>\d+) (?:tokens|runs))?")
_END = " [end of text]\n"                  # printed after an end-of-generation token (completion.cpp)


def perf_report(stderr: str) -> dict:
    """common_perf_print's lines as numbers: `<what>_ms` for sampling, samplers, load, prompt_eval,
    eval, total (and `<what>_n` where the line counts tokens or runs), with prompt_per_second and
    eval_per_second: the generation phase, one decode a token after the first, as the line's own."""
    out: dict = {}
    for m in _PERF.finditer(stderr):
        what = m["what"].replace(" ", "_")
        out[f"{what}_ms"] = float(m["ms"])
        if m["n"] is not None:
            out[f"{what}_n"] = int(m["n"])
    if "eval_ms" not in out or "prompt_eval_ms" not in out:
        raise OracleError(f"llama-completion printed no timing report: {stderr[-2000:]}")
    for what, key in (("prompt_eval", "prompt_per_second"), ("eval", "eval_per_second")):
        ms, n = out[f"{what}_ms"], out.get(f"{what}_n", 0)
        out[key] = 1e3 * n / ms if ms > 0 else 0.0
    return out


def generated_text(stdout: str) -> str:
    """The generated text of --no-display-prompt's stdout: the " [end of text]" line (after an
    end-of-generation token) and the blank line before the report taken off."""
    return stdout.removesuffix("\n\n").removesuffix(_END)


def completion(model, prompt: str, n_predict: int, temp: float | None = None, seed: int = 0, threads: int = 2,
               n_ctx: int = 4096, ignore_eos: bool = False, extra: tuple[str, ...] = (),
               env: dict | None = None) -> dict:
    """One llama-completion process: {"text", "perf" (perf_report), "wall_s" (the whole process)}.
    temp None leaves llama.cpp's default (0.8, the default chain)."""
    cmd = [str(bin_dir() / "llama-completion"), "-m", str(Path(model)), "-p", prompt, "-n", str(n_predict),
           "-no-cnv", "--no-display-prompt", "--simple-io", "-t", str(threads), "-c", str(n_ctx),
           "--seed", str(seed), *(["--temp", str(temp)] if temp is not None else []),
           *(["--ignore-eos"] if ignore_eos else []), *extra]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise OracleError(f"llama-completion did not finish in {TIMEOUT_S:.0f} s") from e
    wall = time.perf_counter() - t0
    stderr = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise OracleError(f"llama-completion exited with {p.returncode}: {stderr[-2000:]}")
    return {"text": generated_text(p.stdout.decode("utf-8", "replace")), "perf": perf_report(stderr),
            "wall_s": wall}
