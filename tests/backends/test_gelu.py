"""ggml's GELU (the f16 table of GGML_GELU_FP16) and GEGLU, against ggml's own op, every f16 input."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from bankml.numerics.gelu import geglu

pytestmark = pytest.mark.oracle


def _ggml_geglu(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    from bankml.oracle import ggml as G
    fn = G.lib().ggml_geglu_split
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p] * 3
    ctx = G.Context()
    a, b = ctx.tensor(G.TYPE_F32, (x.size,), x), ctx.tensor(G.TYPE_F32, (g.size,), g)
    return ctx.compute(fn(ctx.ctx, a, b), threads=2)


def test_geglu_equals_ggml_for_every_f16_input():
    """Every f16 bit pattern as the gate (the whole table, the +-10 cut-offs, infinities); NaN
    gates are left out: only their payloads could differ, and a NaN activation is no model's."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = x[~np.isnan(x)]
    g = np.random.default_rng(0).standard_normal(x.size).astype(np.float32)
    ref = _ggml_geglu(x, g)
    assert np.array_equal(geglu(x, g).view(np.uint32), ref.view(np.uint32))


def test_geglu_equals_ggml_on_f32_gates_between_f16_values():
    """f32 gates round to the table's f16 index; values near +-10 take the cut-off branches."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(4096) * 4, rng.uniform(-10.01, -9.99, 512),
                        rng.uniform(9.99, 10.01, 512), [-10.0, 10.0, -0.0, 0.0]]).astype(np.float32)
    g = rng.standard_normal(x.size).astype(np.float32)
    assert np.array_equal(geglu(x, g).view(np.uint32), _ggml_geglu(x, g).view(np.uint32))
