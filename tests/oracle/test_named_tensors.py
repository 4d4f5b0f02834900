"""Every named tensor of layer 0, the last layer and result_norm identical to llama.cpp's."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.diff import diff
from bankml.testing import models

pytestmark = pytest.mark.oracle


def record_diff(record, r, **what) -> None:
    """One named-tensors comparison: tensors compared, identical, and llama.cpp names bankml lacks."""
    record(kind="named_tensors", compared=len(r.compared), identical=sum(c.identical for c in r.compared),
           missing=len(r.missing), **what)


@pytest.mark.parametrize("backend", ["llvm", "reference"])
@pytest.mark.parametrize("n", [1, 7, 64])
@pytest.mark.parametrize("name,last", [("smollm2-f16", 29), ("qwen3-small-q1_0", 3)])
def test_named_tensors_identical(record, name, last, n, backend):
    t = np.random.default_rng(n).integers(0, 49152, n).tolist()
    r = diff(models.path(name), t, backend=backend)
    record_diff(record, r, model=name, backend=backend, tokens=n, outputs="all")
    assert r.first_difference is None, r.summary()
    got = {c.name for c in r.compared}
    for want in ("embd", "attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0", "ffn_inp-0", "ffn_norm-0",
                 "ffn_up-0", "ffn_gate-0", "ffn_swiglu-0", "ffn_out-0", "l_out-0", f"l_out-{last}",
                 f"kqv_out-{last}", f"ffn_out-{last}", "result_norm", "result_output"):
        assert want in got, want
    assert not r.missing, r.missing


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_named_tensors_identical_when_only_the_last_row_is_wanted(record, backend):
    t = np.random.default_rng(5).integers(0, 49152, 9).tolist()
    r = diff(models.path("smollm2-f16"), t, outputs="last", backend=backend)
    record_diff(record, r, model="smollm2-f16", backend=backend, tokens=9, outputs="last")
    assert r.first_difference is None, r.summary()
    assert [c.shape for c in r.compared if c.name == "result_output"] == [(1, 49152)]


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_named_tensors_identical_through_decodes(record, backend):
    t = np.random.default_rng(6).integers(0, 49152, 12).tolist()
    r = diff(models.path("qwen3-small-q1_0"), t, decode_from=8, backend=backend)
    record_diff(record, r, model="qwen3-small-q1_0", backend=backend, tokens=8, cells=12, outputs="all")
    assert r.first_difference is None, r.summary()
    assert {c.ubatch for c in r.compared} == {0, 1, 2, 3, 4}
