"""reference swiglu / add against ggml_swiglu_split / ggml_add, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.glu import add, swiglu


def _same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("rows,n", [(1, 1536), (7, 1536), (3, 6144), (5, 2816), (4, 1539), (2, 13), (3, 5)],
                         ids=lambda v: str(v))
def test_swiglu_bits_equal_ggml(rows, n):
    from bankml.oracle.ggml import TYPE_F32, Context

    rng = np.random.default_rng(n)
    gate = (rng.standard_normal((rows, n)) * 6).astype(np.float32)
    up = (rng.standard_normal((rows, n)) * 2).astype(np.float32)
    gate[0, : min(n, 8)] = [-120, -90, 0, -0.0, 95, 30, -30, 1e-20][: min(n, 8)]   # exp over/underflow lanes
    ctx = Context()
    tg, tu = ctx.tensor(TYPE_F32, (n, rows), gate), ctx.tensor(TYPE_F32, (n, rows), up)
    want = ctx.compute(ctx.op("ggml_swiglu_split", tg, tu), 2, (rows, n))
    assert _same_bits(swiglu(gate, up), want)


@pytest.mark.oracle
def test_add_bits_equal_ggml():
    from bankml.oracle.ggml import TYPE_F32, Context

    rng = np.random.default_rng(1)
    a = (rng.standard_normal((9, 576)) * 10).astype(np.float32)
    b = (rng.standard_normal((9, 576)) * 1e-3).astype(np.float32)
    ctx = Context()
    ta, tb = ctx.tensor(TYPE_F32, (576, 9), a), ctx.tensor(TYPE_F32, (576, 9), b)
    want = ctx.compute(ctx.op("ggml_add", ta, tb), 2, (9, 576))
    assert _same_bits(add(a, b), want)
