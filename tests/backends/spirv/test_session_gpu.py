"""Sessions run decode's Q1_0 matvecs on a Vulkan device (lavapipe here) with llama.cpp's logits bits."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

import bankml
import bankml.oracle
from bankml.backends.spirv.q1 import device_check
from bankml.backends.spirv import runtime
from bankml.ir.ops import Op
from bankml.quants import Q1_0
from bankml.quants.activation import quantize_q8_0
from bankml.backends.spirv import device as gpu
from bankml.testing import models

N_PROMPT, N_DECODE = 8, 64


@pytest.fixture(scope="module")
def lavapipe() -> int:
    return next(d.index for d in runtime.devices() if "llvmpipe" in d.name)


@pytest.fixture(scope="module")
def q1_model():
    return models.path("qwen3-small-q1_0")


def _q1_matvecs(g) -> int:
    """MUL_MAT nodes of g whose weight is Q1_0 and whose activation is one row."""
    return sum(1 for n in g if n.op is Op.MUL_MAT and g[n.inputs[0]].op is Op.WEIGHT
               and g[n.inputs[0]].params["ggml_type"] == Q1_0 and int(np.prod(n.shape[:-1])) == 1)


def _rows_sha(rows: np.ndarray) -> list[str]:
    return [hashlib.sha256(r.view(np.uint32).tobytes()).hexdigest()[:16] for r in rows]


@pytest.mark.oracle
def test_greedy_decode_with_q1_0_matvecs_on_gpu_gives_llama_cpp_tokens_and_logits(q1_model, lavapipe):
    m = bankml.load(q1_model, threads=2, gpu=lavapipe)
    s = m.session()
    prompt = [int(t) for t in np.random.default_rng(6).integers(0, m.hparams.n_vocab, N_PROMPT)]
    rows = [s.prefill(prompt, outputs="last")[-1]]
    mg = m.device
    assert mg is not None and mg.device.info.index == lavapipe
    per_decode = _q1_matvecs(m.graph(1, 256, 1))
    assert per_decode == 4 * 7 + 1                 # q k v o gate up down per layer, and the lm_head
    tokens = []
    for _ in range(N_DECODE):
        tokens.append(int(np.argmax(rows[-1])))
        before = mg.calls
        rows.append(s.decode(tokens[-1]))
        assert mg.calls - before == per_decode     # every Q1_0 matvec of this decode ran on the device
    assert set(mg.mats) == {n for n, t in m.gguf.tensors.items() if t.ggml_type == Q1_0}
    want = bankml.oracle.logits(q1_model, prompt + tokens, threads=2, outputs="last", decode_from=N_PROMPT)
    got = np.stack(rows)
    assert got.shape == want.shape == (N_DECODE + 1, m.hparams.n_vocab)
    assert [int(np.argmax(r)) for r in want[:-1]] == tokens
    assert _rows_sha(got) == _rows_sha(want)
    assert len(set(_rows_sha(got))) == len(got)    # random weights: greedy repeats a token, the rows differ
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_gpu_matvec_declines_what_is_not_one_q8_0_row(q1_model, lavapipe):
    m = bankml.load(q1_model, gpu=lavapipe)
    mg = m.device
    w = m.weight("blk.0.attn_q.weight")
    x = np.random.default_rng(1).normal(0, 1, (2, 512)).astype(np.float32)
    assert mg.gpu_matvec("blk.0.attn_q.weight", w, quantize_q8_0(x)) is None        # two rows
    assert mg.gpu_matvec("blk.0.attn_q.weight", w, x[:1]) is None                   # not quantized
    assert mg.gpu_matvec("blk.0.attn_k.weight", m.weight("blk.0.attn_k.weight"), quantize_q8_0(x[:1, :256])) is None
    y = mg.gpu_matvec("blk.0.attn_q.weight", w, quantize_q8_0(x[:1]))
    assert y.shape == (1, 512) and y.dtype == np.float32


def test_bankml_gpu_off_keeps_the_session_on_the_cpu(q1_model, monkeypatch):
    monkeypatch.setenv("BANKML_GPU", "off")
    m = bankml.load(q1_model)
    assert m.gpu is None and m.device is None


def test_a_device_refused_by_the_oracle_leaves_the_session_on_the_cpu_saying_why(q1_model, lavapipe,
                                                                                monkeypatch, capsys):
    real = device_check.check_device
    monkeypatch.setattr(device_check, "check_device", lambda dev: real(dev, variant="fma_mul_add"))
    monkeypatch.setattr(gpu, "_CHOICES", {})
    m = bankml.load(q1_model, threads=2, gpu=str(lavapipe))
    s = m.session()
    prompt = [5, 17, 99, 1000]
    row = s.prefill(prompt, outputs="last")
    row = np.concatenate([row, s.decode(int(np.argmax(row[-1])))[None]])
    err = capsys.readouterr().err
    assert m.device is None
    assert err.count("failed the on-device oracle") == 1 and "staying on the CPU" in err
    assert len([line for line in err.splitlines() if "compiled the" not in line]) == 1
    cpu = bankml.load(q1_model, threads=2, gpu="off").session()
    want = cpu.prefill(prompt, outputs="last")
    want = np.concatenate([want, cpu.decode(int(np.argmax(want[-1])))[None]])
    assert np.array_equal(row.view(np.uint32), want.view(np.uint32))


def _bankml(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bankml.cli", *args], capture_output=True, text=True, timeout=300)


def test_ir_spirv_prints_the_q1_0_matvec_module(q1_model):
    r = _bankml("ir", str(q1_model), "--spirv")
    assert r.returncode == 0, r.stderr
    assert "OpEntryPoint GLCompute %main" in r.stdout and "49152x512 (1)" in r.stdout


def test_ir_spirv_refuses_a_model_without_q1_0_in_one_line():
    r = _bankml("ir", str(models.path("smollm2-q4_1")), "--spirv")
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and "no Q1_0 matrices" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_run_gpu_flag_gives_the_cpu_tokens(q1_model, lavapipe):
    args = ("run", str(q1_model), "-p", "Hello", "-n", "6", "--temp", "0", "--json")
    on, off = _bankml(*args, "--gpu", str(lavapipe)), _bankml(*args, "--gpu", "off")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert json.loads(on.stdout)["tokens"] == json.loads(off.stdout)["tokens"]


def test_run_gpu_flag_refuses_garbage():
    r = _bankml("run", "x.gguf", "-p", "hi", "--gpu", "fast")
    assert r.returncode == 2 and "want auto, off or a Vulkan device index" in r.stderr
