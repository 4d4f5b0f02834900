"""Qwen3.5's recurrent ops in the reference backend (bankml/backends/reference/recurrent.py, issue
27) against ggml-cpu's own ggml_ssm_conv and ggml_gated_delta_net of the oracle build (computed
through libggml at 1 and 2 threads), bit for bit: conv kernels of 4 (Qwen3.5's) and of other
widths (GCC's blocks of 8 and 4 and its FMA tail), one and several tokens and sequences, a state
of 32 and of 128 (Qwen3.5's) with v-heads reading k-heads h % H_k."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.recurrent import gated_delta_net, ssm_conv
from bankml.oracle.ggml import TYPE_F32, Context

pytestmark = pytest.mark.oracle


def _t(ctx: Context, a: np.ndarray) -> int:
    return ctx.tensor(TYPE_F32, tuple(reversed(a.shape)), np.ascontiguousarray(a, np.float32))


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("n_s,ch,d_conv,n_t", [(1, 320, 4, 1), (1, 320, 4, 7), (2, 96, 4, 3), (1, 40, 7, 2),
                                               (1, 24, 13, 5), (2, 16, 22, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_ssm_conv_equals_ggml(n_s, ch, d_conv, n_t, threads):
    rng = np.random.default_rng(d_conv * 100 + n_t)
    x = rng.standard_normal((n_s, ch, d_conv - 1 + n_t)).astype(np.float32)
    w = (rng.standard_normal((ch, d_conv)) / 2).astype(np.float32)
    x.reshape(-1)[:3] = [-0.0, 0.0, 1e-40]
    ctx = Context(64 << 20)
    got = ctx.compute(ctx.op("ggml_ssm_conv", _t(ctx, x), _t(ctx, w)), threads=threads, shape=(n_s, n_t, ch))
    assert np.array_equal(_bits(ssm_conv(x, w)), _bits(got))


@pytest.mark.parametrize("n_s,n_t,h_k,h_v,S", [(1, 1, 4, 8, 32), (1, 5, 4, 8, 32), (2, 3, 2, 2, 32),
                                               (1, 2, 2, 4, 128), (2, 1, 16, 16, 128)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gated_delta_net_equals_ggml(n_s, n_t, h_k, h_v, S, threads):
    rng = np.random.default_rng(S + 10 * n_t + h_v)

    def unit(shape):                          # L2-normalised rows, as Qwen3.5 hands q and k over
        a = rng.standard_normal(shape).astype(np.float32)
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
    q, k = unit((n_s, n_t, h_k, S)), unit((n_s, n_t, h_k, S))
    v = rng.standard_normal((n_s, n_t, h_v, S)).astype(np.float32)
    g = -rng.uniform(0.01, 2.0, (n_s, n_t, h_v, 1)).astype(np.float32)
    beta = rng.uniform(0, 1, (n_s, n_t, h_v, 1)).astype(np.float32)
    state = (rng.standard_normal((n_s, h_v, S, S)) * 0.3).astype(np.float32)
    ctx = Context(256 << 20)
    t = ctx.op("ggml_gated_delta_net", _t(ctx, q), _t(ctx, k), _t(ctx, v), _t(ctx, g), _t(ctx, beta),
               _t(ctx, state), 1)
    flat = ctx.compute(t, threads=threads)
    n_out = n_s * n_t * h_v * S
    out, new = gated_delta_net(q, k, v, g[..., 0], beta[..., 0], state)
    assert np.array_equal(_bits(out).reshape(-1), _bits(flat[:n_out]))
    assert np.array_equal(_bits(new).reshape(-1), _bits(flat[n_out:n_out + new.size]))
