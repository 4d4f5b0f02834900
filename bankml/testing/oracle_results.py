"""What the oracle tests compared, one JSON line each: docs/ORACLE.md is rendered from such a file.

    rec = Recorder(results_path(), command="python -m pytest tests/oracle")
    rec.record(kind="prefill", test=..., model="smollm2-q4_1", backend="llvm", tokens=7, outputs="all",
               threads=2, llama_threads=2, compared=7, identical=7)
    run, rows = read(path)

The first line describes the run (command, date, bankml commit); each later line is one
comparison, written before the test asserts, so a failing comparison is recorded too.
$BANKML_ORACLE_RESULTS names the file; otherwise <cache>/oracle-results/<date>-<pid>.jsonl.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path

from bankml.oracle.paths import VARIANT, VERSION, cache_root


def results_path() -> Path:
    env = os.environ.get("BANKML_ORACLE_RESULTS")
    if env:
        return Path(env)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return cache_root() / "oracle-results" / f"{stamp}-{os.getpid()}.jsonl"


def _commit() -> str | None:
    """The checkout's git commit (with "+changes" when it has uncommitted ones), if it is a checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _cpu() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)


class Recorder:
    """Appends comparisons to one results file, starting it with the run's line on first use."""

    def __init__(self, path: Path, command: str):
        self.path, self.command, self.started = Path(path), command, False

    def record(self, **comparison) -> None:
        if not self.started:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            run = {"command": self.command, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                   "commit": _commit(), "oracle": f"llama.cpp b{VERSION} ({VARIANT} build)", "cpu": _cpu()}
            self.path.write_text(json.dumps({"run": run}) + "\n")      # a new run replaces an old file
            self.started = True
        with open(self.path, "a") as f:
            f.write(json.dumps(comparison) + "\n")


def read(path: Path) -> tuple[dict, list[dict]]:
    """(the run's line, the comparisons) of a results file."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines or "run" not in lines[0]:
        raise ValueError(f"{path}: does not start with a run line; not an oracle results file")
    return lines[0]["run"], lines[1:]
