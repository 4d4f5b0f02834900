"""docs/ORACLE.md comes from a measured run: the recorder's file, rendered by scripts/oracle_doc.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bankml.testing.oracle_results import Recorder, read

ROOT = Path(__file__).resolve().parent.parent


def test_recorder_starts_the_file_with_its_run_and_replaces_an_old_one(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("stale\n")
    rec = Recorder(path, command="python -m pytest tests/oracle")
    rec.record(kind="prefill", compared=7, identical=7)
    rec.record(kind="prefill", compared=1, identical=0)
    run, rows = read(path)
    assert run["command"] == "python -m pytest tests/oracle" and run["date"] and "b11434" in run["oracle"]
    assert rows == [{"kind": "prefill", "compared": 7, "identical": 7},
                    {"kind": "prefill", "compared": 1, "identical": 0}]


def test_oracle_doc_renders_what_a_run_recorded(tmp_path):
    run = {"command": "python -m pytest -m oracle", "date": "2026-01-02T03:04:05", "commit": "abc1234",
           "oracle": "llama.cpp b11434 (haswell build)", "cpu": "Some CPU"}
    common = dict(threads=2, llama_threads=2)
    rows = [dict(kind="prefill", model="smollm2-q4_1", backend="llvm", tokens=7, outputs="all", compared=7,
                 identical=7, **common),
            dict(kind="prefill", model="qwen3-small-q1_0", backend="reference", tokens=600, outputs="all",
                 compared=600, identical=598, **common),
            dict(kind="decode", model="llama-gqa-f16", backend="llvm", tokens=600, cells=1100, compared=500,
                 identical=500, **common),
            dict(kind="named_tensors", model="smollm2-f16", backend="llvm", tokens=64, outputs="all", compared=543,
                 identical=543, missing=0),
            dict(kind="generate", model="smollm2-q4_1", backend="llvm", prompt=0, tokens=5, temp=0.0, seed=0,
                 compared=64, identical=64),
            dict(kind="generate", model="smollm2-q4_1", backend="llvm", prompt=1, tokens=6, temp=0.0, seed=0,
                 compared=64, identical=10)]
    results = tmp_path / "run.jsonl"
    results.write_text("\n".join(json.dumps(x) for x in [{"run": run}, *rows]) + "\n")
    out = tmp_path / "ORACLE.md"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "oracle_doc.py"), str(results), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = out.read_text()
    assert "Measured by `python -m pytest -m oracle` on 2026-01-02T03:04:05 (bankml abc1234, Some CPU)" in doc
    assert "6 comparisons: 4 identical, 2 not" in doc
    assert "| smollm2 | Q4_1 | 7 | all | 2 (2) | f16_one_chunk | 7 / 7 |" in doc
    assert "| qwen3-small | Q1_0 | 600 | all | 2 (2) | tiled | **598 / 600 (differs)** |" in doc
    assert "| llama-gqa | F16 | llvm | 601–1100 | 2 (2) | 500 / 500 |" in doc
    assert "| smollm2 | F16 | llvm | 64 | all | – | 543 / 543 |" in doc
    assert "| smollm2 | Q4_1 | llvm | 0.0 | 2 | 1 / 2 | **74 / 128 (differs)** |" in doc


def test_oracle_doc_refuses_a_file_that_is_not_results(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"kind": "prefill"}\n')
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "oracle_doc.py"), str(bad), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and "not an oracle results file" in r.stderr
