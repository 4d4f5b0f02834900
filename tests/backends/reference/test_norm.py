"""reference rms_norm / mul against ggml_rms_norm / ggml_mul, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.norm import mul, rms_norm
from bankml.errors import LoweringError
from bankml.ir.order import ROPE


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_sum_is_sequential_not_pairwise():
    # one huge square then many small ones: a sequential f64 sum drops every small term,
    # numpy's pairwise np.sum adds them up first and keeps them
    x = np.array([[1e8] + [0.7] * 4095], np.float32)
    seq = 0.0
    for v in x[0]:
        seq += float(np.float32(v * v))
    assert seq != float(np.sum((x * x).astype(np.float64)))
    mean = np.float32(seq / x.shape[1])
    scale = np.float32(np.float32(1) / np.sqrt(np.float32(mean + np.float32(1e-6))))
    assert _same_bits(rms_norm(x, 1e-6), (x * scale).astype(np.float32))


def test_refuses_other_float_order():
    with pytest.raises(LoweringError):
        rms_norm(np.ones((1, 8), np.float32), 1e-5, ROPE)


@pytest.mark.oracle
@pytest.mark.parametrize("rows,k", [(1, 576), (7, 576), (33, 2048), (5, 960), (128, 128), (64, 64), (3, 4095)],
                         ids=lambda v: str(v))
def test_rms_norm_bits_equal_ggml(rows, k):
    from bankml.oracle.ggml import TYPE_F32, Context

    rng = np.random.default_rng(rows * 1000 + k)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 30, (rows, 1))).astype(np.float32)
    for eps in (1e-5, 1e-6):
        ctx = Context()
        t = ctx.tensor(TYPE_F32, (k, rows), x)
        want = ctx.compute(ctx.op("ggml_rms_norm", t, eps), 2, (rows, k))
        assert _same_bits(rms_norm(x, eps), want)


@pytest.mark.oracle
@pytest.mark.parametrize("rows,k", [(7, 576), (64, 128)])
def test_rms_norm_times_weight_bits_equal_ggml_fused(rows, k):
    from bankml.oracle.ggml import TYPE_F32, Context

    rng = np.random.default_rng(k)
    x = (rng.standard_normal((rows, k)) * 3).astype(np.float32)
    w = rng.uniform(-2, 2, k).astype(np.float32)
    ctx = Context()
    t, tw = ctx.tensor(TYPE_F32, (k, rows), x), ctx.tensor(TYPE_F32, (k,), w)
    want = ctx.compute(ctx.op("ggml_mul", ctx.op("ggml_rms_norm", t, 1e-5), tw), 2, (rows, k))
    assert _same_bits(mul(rms_norm(x, 1e-5), w), want)


@pytest.mark.oracle
def test_head_norm_rows_of_128_bits_equal_ggml():
    """Qwen3's Q/K norms: rows of head_dim over [n_tokens, n_head, head_dim]."""
    from bankml.oracle.ggml import TYPE_F32, Context

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((9, 16, 128)) * 5).astype(np.float32)
    ctx = Context()
    t = ctx.tensor(TYPE_F32, (128, 16, 9), x)
    want = ctx.compute(ctx.op("ggml_rms_norm", t, 1e-6), 3, (9, 16, 128))
    assert _same_bits(rms_norm(x, 1e-6), want)
