"""The reference backend's portable lowerings of Qwen3.5's recurrent ops are the document's
functions (bankml/profiles/portable/gdn.py) applied token by token: SSM_CONV then SILU is conv
over a ring of the last d_conv - 1 tokens; GATED_DELTA_NET is gdn_row per token, v-head (its q/k
head h % Hk, as ggml reads them) and value row, the state carried."""
from __future__ import annotations

import numpy as np

from bankml.backends.reference import portable as lowering
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import arith, funcs, gdn, orders as po

F32 = np.float32


def _node(op, shape, **params):
    return Node(id=0, op=op, inputs=(), shape=shape, dtype="f32", order=None, params=params)


def test_ssm_conv_then_silu_is_conv_over_a_ring_of_the_last_tokens():
    rng = np.random.default_rng(1)
    T, ch, taps = 5, 12, 4
    x, w = rng.standard_normal((T, ch)).astype(F32), rng.standard_normal((ch, taps)).astype(F32)
    state0 = rng.standard_normal((ch, taps - 1)).astype(F32)
    state = state0.copy()
    y = funcs.silu(lowering._ssm_conv(None, None, _node(Op.SSM_CONV, (T, ch)), x, w, state))
    ring = state0.T.copy()
    for t in range(T):
        assert y[t].view(np.uint32).tolist() == gdn.conv(ring, x[t], w).view(np.uint32).tolist(), t
        ring = np.concatenate([ring[1:], x[t][None]])
    assert np.array_equal(state, ring.T)


def test_gated_delta_net_is_gdn_row_per_token_head_and_row():
    rng = np.random.default_rng(2)
    T, hk, hv, S = 3, 2, 4, 16
    q, k = (rng.standard_normal((T, hk, S)).astype(F32) * F32(0.3) for _ in range(2))
    v = rng.standard_normal((T, hv, S)).astype(F32)
    g, beta = (-np.abs(rng.standard_normal((T, hv)))).astype(F32), rng.uniform(0.1, 0.9, (T, hv)).astype(F32)
    state0 = rng.standard_normal((hv, S, S)).astype(F32) * F32(0.1)
    scale = F32(1) / np.sqrt(F32(S))
    state = state0.copy()
    n = _node(Op.GATED_DELTA_NET, (T, hv, S), scale=float(scale))
    out = lowering._gated_delta_net(None, None, n, q, k, v, g, beta, state)
    want, mem = np.empty_like(out), state0.copy()
    for t in range(T):
        for h in range(hv):
            kq = arith.fdot(k[t, h % hk], q[t, h % hk])
            for r in range(S):
                want[t, h, r] = gdn.gdn_row(mem[h, r], k[t, h % hk], q[t, h % hk], v[t, h, r],
                                            F32(funcs.exp(g[t, h])), beta[t, h], kq, scale)
    assert out.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert state.view(np.uint32).tolist() == mem.view(np.uint32).tolist()
    assert po.GATED_DELTA_NET.kernel == "portable.gdn_row"
