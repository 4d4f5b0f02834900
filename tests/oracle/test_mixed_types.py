"""Matrix types mixed per tensor, one activation read by matrices of three activation types.

llama-kq-mixed (bankml/testing/models.py, llama-quantize --tensor-type overrides): attn_norm
feeds Q5_0 q (q8_0 activations), Q5_1 k (q8_1) and Q6_K v (q8_K); ffn_norm feeds Q5_1 up and
repacked Q4_K gate (q8_K); Q8_0 embeddings, Q5_0 output. Each mul_mat quantizes its input to
its own weight's vec_dot type, one conversion per type shared (passes/share_quantized_activations).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_logits import assert_rows_identical, prefill_case, tokens
from test_named_tensors import record_diff

import bankml
from bankml import oracle
from bankml.diff import diff
from bankml.ir.ops import Op
from bankml.testing import models

pytestmark = pytest.mark.oracle
NAME = "llama-kq-mixed"


def test_one_quantization_per_activation_type():
    with bankml.load(models.path(NAME), backend="reference") as m:
        g = m.graph(7, 256, 7)
    norm = next(n for n in g if n.name == "attn_norm-0")
    quants = sorted(g[u].params["type"] for u in g.users()[norm.id] if g[u].op is Op.QUANTIZE)
    assert quants == [8, 9, 15]                     # q8_0, q8_1, q8_K


@pytest.mark.parametrize("backend,n,outputs", [("llvm", 7, "all"), ("llvm", 65, "all"), ("reference", 65, "last")])
def test_mixed_types_rows_identical(record, backend, n, outputs):
    with bankml.load(models.path(NAME), backend=backend, threads=2, llama_threads=2) as m:
        ref = oracle.logits(m.path, tokens(n, n), threads=2, outputs=outputs)
        assert_rows_identical(record, m.session().prefill(tokens(n, n), outputs=outputs), ref,
                              **prefill_case(m, NAME, n, outputs))


def test_mixed_types_named_tensors_identical(record):
    t = np.random.default_rng(9).integers(0, 49152, 9).tolist()
    r = diff(models.path(NAME), t, backend="llvm")
    record_diff(record, r, model=NAME, backend="llvm", tokens=9, outputs="all")
    assert r.first_difference is None, r.summary()
    assert not r.missing, r.missing
