"""The portable profile on the llvm backend gives the numpy spec's bits (the reference backend)
for every logits row, with 1, 2 and 3 threads, on SmolLM2 in four weight types, the Qwen3
test models and the Qwen3.5 ones (Gated-DeltaNet layers, partial rope), for prompts across the
micro-batch variants' edges (1 token: decode; 2..63: small; 64..512: large; "all" and "last"
outputs) and a decode to 1,100 cells.

The reference backend is numpy and slow, so it runs one prefill per model; its rows stand for
every cut of the same tokens (a portable row does not depend on the cut: tests/runtime/
test_portable_model.py holds that on the reference backend).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

import bankml
from bankml.cli import main
from bankml.testing import models

# model -> tokens of the reference prefill (the llvm prompts are its prefixes)
MODELS = {"smollm2-q4_1": 65, "smollm2-f16": 9, "smollm2-q8_0": 9, "smollm2-q2_0": 9,
          "qwen3-small-q1_0": 65, "qwen3-small-f16": 9, "qwen3-small-q2_0": 9,
          "qwen3-small-untied-q1_0": 9, "qwen3-small-untied-f16": 9, "qwen35-small-q1_0": 65, "qwen35-small-f16": 9,
          "qwen35-small-q4_k_m": 9, "llama-kq-q4_k_m": 65, "llama-kq-q6_k": 9, "smollm2-q4_0": 9, "smollm2-q5_0": 9,
          "smollm2-q5_1": 9}
CUTS = (1, 7, 64, 65)


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def _sha(rows: np.ndarray) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(r, np.float32).tobytes()).hexdigest() for r in rows]


@pytest.mark.parametrize("name", list(MODELS))
def test_llvm_rows_equal_reference_rows_for_threads_1_2_3(name):
    n = MODELS[name]
    toks = _tokens(n, 3)
    with bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=256) as m:
        want = _sha(m.session().prefill(toks, outputs="all"))
    for threads in (1, 2, 3):
        with bankml.load(models.path(name), backend="llvm", threads=threads, profile="portable", n_ctx=256) as m:
            got = _sha(m.session().prefill(toks, outputs="all"))
            assert got == want, f"threads={threads}: prefill of {n}"
            for cut in (c for c in CUTS if c < n):
                s = m.session()
                rows = s.prefill(toks[:cut], outputs="all" if cut % 2 else "last")
                rows = rows.reshape(-1, rows.shape[-1])
                last = s.decode(toks[cut])
                first = 0 if cut % 2 else cut - 1
                assert _sha(rows) == want[first:cut], f"threads={threads}: prefill of {cut}"
                assert _sha(last[None]) == want[cut:cut + 1], f"threads={threads}: decode after {cut}"


def test_llvm_refuses_a_gpu_with_the_portable_profile():
    with pytest.raises(bankml.BankmlError, match="GPU"):
        bankml.load(models.path("qwen3-small-q1_0"), backend="llvm", profile="portable", gpu=0)


def _long_decode(name: str, threads: int, toks: list[int]) -> list[str]:
    with bankml.load(models.path(name), backend="llvm", threads=threads, profile="portable", n_ctx=2048) as m:
        s = m.session()
        rows = [s.prefill(toks[:20], outputs="all")]
        rows += [s.decode(t)[None] for t in toks[20:]]
        return _sha(np.concatenate(rows))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-small-q1_0", "smollm2-q4_1"])
def test_decode_to_1100_cells_equal_for_threads_1_2_3_and_one_prefill(name):
    """Decodes across the 256-cell padding steps to 1,100 cells (the split-KV variants): every
    row the same for 1, 2 and 3 threads, and the rows of one llvm prefill of the same tokens
    (micro-batches of 512, 512, 76); on Qwen3 also the reference backend's prefill."""
    toks = _tokens(1100, 4)
    rows = _long_decode(name, 1, toks)
    for threads in (2, 3):
        assert _long_decode(name, threads, toks) == rows, f"threads={threads}"
    with bankml.load(models.path(name), backend="llvm", threads=2, profile="portable", n_ctx=2048) as m:
        assert _sha(m.session().prefill(toks, outputs="all")) == rows
    if name.startswith("qwen3"):
        with bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=2048) as m:
            assert _sha(m.session().prefill(toks, outputs="all")) == rows


def test_cli_run_portable_on_llvm_generates_the_reference_backends_tokens():
    args = ["run", str(models.path("qwen3-small-q1_0")), "--profile", "portable", "-p", "The capital of",
            "--raw", "-n", "6", "--temp", "0", "--json"]
    out = {be: CliRunner().invoke(main, [*args, "--backend", be]) for be in ("llvm", "reference")}
    for be, r in out.items():
        assert r.exit_code == 0, (be, r.output)
    tokens = {be: json.loads(r.output.strip().splitlines()[-1])["tokens"] for be, r in out.items()}
    assert len(tokens["llvm"]) == 6 and tokens["llvm"] == tokens["reference"]
