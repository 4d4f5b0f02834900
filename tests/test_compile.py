"""`bankml compile`: plan and IR written, the JIT cache filled, and a run afterwards compiles nothing."""
from __future__ import annotations

import json
import os
import re
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
    run_args = ("run", smollm2, "-p", PROMPT, "-n", "4", "--temp", "0", "--json", "--raw")
    uncached = bankml(cache, *run_args, jit_cache="0")
    assert uncached.returncode == 0, uncached.stderr
    assert not (cache / "jit").exists()

    r = bankml(cache, "compile", smollm2, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "compiled 7 graphs in" in r.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["arch"] == "llama" and plan["hparams"]["n_layer"] == 30
    assert plan["logits_matrix"] == "token_embd.weight" and plan["matrix_type"] == "Q4_1"
    names = [v["name"] for v in plan["compiled"]["variants"]]
    assert names == ["decode", "decode-split", "small-all", "small-last", "large-all", "large-last", "decode-seqs"]
    assert (out / "decode.ir").read_text().startswith("# graph ")
    assert "[T,576]" in (out / "large-all.ir").read_text()
    entries = sorted(p.name for p in (cache / "jit").glob("*.o"))
    n = len(entries)        # each graph's glue, the distinct kernels of all seven graphs (graphs that
    compiled = int(re.search(r"\((\d+) objects compiled, ", r.stdout)[1])    # share a kernel load it)
    distinct = len({(cache / "jit" / e).read_bytes() for e in entries})     # and each kernel's spec
    assert n > compiled >= distinct > 6                                      # entry (the same object)

    cached = bankml(cache, *run_args)
    assert cached.returncode == 0, cached.stderr
    assert json.loads(cached.stdout)["tokens"] == json.loads(uncached.stdout)["tokens"]
    assert sorted(p.name for p in (cache / "jit").glob("*.o")) == entries      # every graph came from the cache

    again = bankml(cache, "compile", smollm2, "-o", str(out), "--ctx", "8192")   # n_ctx needs no other code
    assert again.returncode == 0 and "(0 objects compiled, " in again.stdout, again.stderr
    n = len(list((cache / "jit").glob("*.o")))      # (new spec entries where a Dim's range moved)

    listed = bankml(cache, "compile", "--list")
    assert listed.returncode == 0 and f"{n} objects" in listed.stdout, listed.stderr
    cleared = bankml(cache, "compile", "--clear")
    assert cleared.returncode == 0 and f"removed {n} objects" in cleared.stdout
    assert not list((cache / "jit").glob("*.o"))


def test_compile_default_folder_is_keyed_by_model_and_version(tmp_path, smollm2, monkeypatch):
    import bankml as bk
    from bankml.backends.llvm import jit_cache
    r = bankml(tmp_path, "compile", smollm2, "--ctx", "256")
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("BANKML_CACHE", str(tmp_path))
    want = jit_cache.compiled_dir(smollm2, bk.__version__)
    assert want.parent == tmp_path / "compiled" and want.name.endswith("-" + bk.__version__)
    assert (want / "plan.json").exists() and str(want) in r.stdout


def test_compile_bad_file_is_one_line(tmp_path):
    f = tmp_path / "bad.gguf"
    f.write_bytes(b"GGUF")
    r = bankml(tmp_path, "compile", str(f))
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
