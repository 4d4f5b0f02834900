"""`bankml compile`: plan and IR written, the JIT cache filled, and a run afterwards compiles nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bankml.testing import models

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    return str(models.path("smollm2-q4_1"))


def bankml(cache, *args: str, jit_cache: str = "1") -> subprocess.CompletedProcess:
    env = {**os.environ, "BANKML_CACHE": str(cache), "BANKML_JIT_CACHE": jit_cache}
    return subprocess.run([sys.executable, "-m", "bankml.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env)


def test_compile_writes_plan_and_ir_and_the_next_run_compiles_nothing(tmp_path, smollm2):
    cache, out = tmp_path / "cache", tmp_path / "out"
    run_args = ("run", smollm2, "--raw", "-p", PROMPT, "-n", "4", "--temp", "0", "--json")   # compile -p is raw text
    uncached = bankml(cache, *run_args, jit_cache="0")
    assert uncached.returncode == 0, uncached.stderr
    assert not (cache / "jit").exists()

    r = bankml(cache, "compile", smollm2, "-o", str(out), "--max-ctx", "512", "-p", PROMPT)
    assert r.returncode == 0, r.stderr
    assert "compiled 3 graphs in" in r.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["arch"] == "llama" and plan["hparams"]["n_layer"] == 30
    assert plan["logits_matrix"] == "token_embd.weight" and plan["matrix_type"] == "Q4_1"
    shapes = {(s["n_tokens"], s["n_kv"], s["n_outputs"]) for s in plan["compiled"]["graphs"]}
    assert shapes == {(5, 256, 1), (1, 256, 1), (1, 512, 1)}
    assert (out / "decode-1x256.ir").read_text().startswith("# graph ")
    assert "result_output" in (out / "prefill-5x256.ir").read_text()
    entries = sorted(p.name for p in (cache / "jit").glob("*.o"))
    assert len(entries) == 3

    cached = bankml(cache, *run_args)
    assert cached.returncode == 0, cached.stderr
    assert json.loads(cached.stdout)["tokens"] == json.loads(uncached.stdout)["tokens"]
    assert sorted(p.name for p in (cache / "jit").glob("*.o")) == entries      # every graph came from the cache

    again = bankml(cache, "compile", smollm2, "-o", str(out), "--max-ctx", "512", "-p", PROMPT)
    assert again.returncode == 0 and "(3 already in the cache)" in again.stdout, again.stderr


def test_compile_default_folder_is_keyed_by_model_and_version(tmp_path, smollm2, monkeypatch):
    import bankml as bk
    from bankml.runtime import compile_cache
    r = bankml(tmp_path, "compile", smollm2, "--max-ctx", "256", "-p", "Hi")
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("BANKML_CACHE", str(tmp_path))
    want = compile_cache.compiled_dir(smollm2, bk.__version__)
    assert want.parent == tmp_path / "compiled" and want.name.endswith("-" + bk.__version__)
    assert (want / "plan.json").exists() and str(want) in r.stdout


def test_compile_bad_file_is_one_line(tmp_path):
    f = tmp_path / "bad.gguf"
    f.write_bytes(b"GGUF")
    r = bankml(tmp_path, "compile", str(f))
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
