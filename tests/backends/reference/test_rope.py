"""reference rope_cache + rope against ggml_rope_ext, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.rope import rope, rope_cache

MODES = {"norm": 0, "neox": 2}


def _ggml_rope(x, pos, n_dims, mode, n_ctx_orig, base, scale, ext, attn, beta_fast, beta_slow, ff=None):
    from bankml.oracle.ggml import TYPE_F32, TYPE_I32, Context

    m, n_head, head_dim = x.shape
    ctx = Context()
    t = ctx.tensor(TYPE_F32, (head_dim, n_head, m), x)
    p = ctx.tensor(TYPE_I32, (m,), pos.astype(np.int32))
    f = None if ff is None else ctx.tensor(TYPE_F32, (ff.size,), ff.astype(np.float32))
    y = ctx.op("ggml_rope_ext", t, p, f, n_dims, MODES[mode], n_ctx_orig, base, scale, ext, attn,
               beta_fast, beta_slow)
    return ctx.compute(y, 2, x.shape)


def _same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _positions(rng, m):
    return np.sort(np.concatenate([[0, 1, 2, 4095, 4096, 5000], rng.integers(0, 5001, m - 6)])).astype(np.int32)


@pytest.mark.oracle
@pytest.mark.parametrize("mode", ["norm", "neox"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("freq_scale,ext_factor,attn_factor", [
    (1.0, 0.0, 1.0),            # plain RoPE (SmolLM2, Qwen3)
    (0.25, 0.0, 1.0),           # linear scaling
    (0.25, 1.0, 1.0),           # YaRN: ramp mix and mscale
    (0.25, 1.0, 0.9),           # YaRN with llama's cancelling attn_factor
    (1.0, 0.5, 1.0),
], ids=["plain", "linear", "yarn", "yarn-attn", "ext-half"])
def test_rope_bits_equal_ggml(mode, head_dim, freq_scale, ext_factor, attn_factor):
    rng = np.random.default_rng(head_dim + int(ext_factor * 10))
    m, n_head = 40, 3
    pos = _positions(rng, m)
    x = (rng.standard_normal((m, n_head, head_dim)) * 4).astype(np.float32)
    args = (head_dim, 4096, 100000.0 if head_dim == 64 else 1000000.0, freq_scale, ext_factor, attn_factor, 32.0, 1.0)
    want = _ggml_rope(x, pos, head_dim, mode, args[1], *args[2:])
    cos, sin = rope_cache(pos, head_dim, args[2], freq_scale, ext_factor, attn_factor, 32.0, 1.0, 4096)
    assert _same_bits(rope(x, cos, sin, mode), want)


@pytest.mark.oracle
@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_rope_with_freq_factors_bits_equal_ggml(mode):
    """Llama 3 style rope_freqs.weight."""
    rng = np.random.default_rng(5)
    m, n_head, head_dim = 17, 2, 64
    pos = _positions(rng, m)
    ff = rng.uniform(1, 8, head_dim // 2).astype(np.float32)
    x = (rng.standard_normal((m, n_head, head_dim)) * 2).astype(np.float32)
    want = _ggml_rope(x, pos, head_dim, mode, 8192, 500000.0, 1.0, 0.0, 1.0, 32.0, 1.0, ff)
    cos, sin = rope_cache(pos, head_dim, 500000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 8192, ff)
    assert _same_bits(rope(x, cos, sin, mode), want)


@pytest.mark.oracle
@pytest.mark.parametrize("mode", ["norm", "neox"])
@pytest.mark.parametrize("n_dims", [2, 4, 6, 10, 12, 40])
def test_rope_partial_and_odd_pair_counts_bits_equal_ggml(mode, n_dims):
    """n_dims < head_dim passes the rest through; an odd pair count ends NORM without FMA."""
    rng = np.random.default_rng(n_dims)
    m, n_head, head_dim = 9, 2, 64
    pos = _positions(rng, m)
    x = (rng.standard_normal((m, n_head, head_dim)) * 3).astype(np.float32)
    want = _ggml_rope(x, pos, n_dims, mode, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    cos, sin = rope_cache(pos, n_dims, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 4096)
    assert _same_bits(rope(x, cos, sin, mode), want)
