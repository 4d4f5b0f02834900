"""Qwen3.5's recurrent ops (issue 27) in ggml-cpu's float order, as the haswell build runs them.

ssm_conv (ops.cpp:ggml_compute_forward_ssm_conv_f32): for each sequence, token t and channel c,
    y[t, c] = 0 + x[c, t]*w[c, 0] + ... + x[c, t+d_conv-1]*w[c, d_conv-1]
in GCC's vectorized loop order (numerics/vec.py gcc_sum: for d_conv = 4, four rounded products
added one by one from 0; no FMA), x the conv state and the new columns, time fastest.

gated_delta_net (ops.cpp:ggml_compute_forward_gated_delta_net_one_chunk, K = 1, a scalar gate per
head): per sequence and v-head h (reading q/k head h % H_k), the state M stored transposed
(M[j][i] = S[i][j]), for each token:
    M = r(M * expf(g))                                  ggml_vec_scale_f32
    d[j] = r(r(v[j] - vec_dot_f32(M[j], k)) * beta)
    M[j] = fma(k, d[j], M[j])                           ggml_vec_mad_f32
    o[j] = r(vec_dot_f32(M[j], q) * r(1 / sqrtf(S_v)))
"""
from __future__ import annotations

import numpy as np

from bankml.numerics.floats import fma
from bankml.numerics.libm import expf
from bankml.numerics.vec import gcc_sum, vec_dot_f32

F32 = np.float32


def ssm_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [n_seqs, channels, d_conv - 1 + n_t] (time fastest), w [channels, d_conv] ->
    [n_seqs, n_t, channels]."""
    n_s, ch, ncs = x.shape
    nc = w.shape[1]
    n_t = ncs - nc + 1
    out = np.empty((n_s, n_t, ch), F32)
    for s in range(n_s):
        for t in range(n_t):
            out[s, t] = gcc_sum(x[s, :, t:t + nc], w, np.zeros(ch, F32))
    return out


def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                    state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q, k [n_seqs, n_tokens, H_k, S]; v [n_seqs, n_tokens, H_v, S]; g, beta [n_seqs, n_tokens,
    H_v]; state [n_seqs, H_v, S, S] (M, transposed) -> (out [n_seqs, n_tokens, H_v, S], the new
    state [n_seqs, H_v, S, S])."""
    n_s, n_t, h_v, S = v.shape
    h_k = q.shape[2]
    scale = F32(1) / np.sqrt(F32(S))
    out = np.empty(v.shape, F32)
    new = np.array(state, F32, copy=True)
    decay = expf(np.ascontiguousarray(g, F32))
    for s in range(n_s):
        for h in range(h_v):
            M = new[s, h]
            for t in range(n_t):
                qd, kd, vd = q[s, t, h % h_k], k[s, t, h % h_k], v[s, t, h]
                M[:] = M * decay[s, t, h]
                d = ((vd - vec_dot_f32(M, kd)).astype(F32) * F32(beta[s, t, h])).astype(F32)
                M[:] = fma(kd[None, :], d[:, None], M)
                out[s, t, h] = (vec_dot_f32(M, qd) * scale).astype(F32)
    return out, new


def ssm_conv_step(x: np.ndarray, w: np.ndarray, state: np.ndarray) -> np.ndarray:
    """One sequence's SSM_CONV node: x [T, ch] after the conv state [ch, d_conv-1] (updated in
    place to the last d_conv-1 columns of [state | x^T], what llama.cpp copies back) -> [T, ch]."""
    cat = np.concatenate([state, np.asarray(x, F32).T], axis=1)
    y = ssm_conv(cat[None], np.asarray(w, F32))[0]
    state[...] = cat[:, cat.shape[1] - state.shape[1]:]
    return y


def gated_delta_net_step(q, k, v, g, beta, state: np.ndarray) -> np.ndarray:
    """One sequence's GATED_DELTA_NET node: q, k [T, Hk, S], v [T, Hv, S], g, beta [T, Hv], the
    state [Hv, S, S] (updated in place) -> [T, Hv, S]."""
    out, new = gated_delta_net(q[None], k[None], v[None], g[None], beta[None], state[None])
    state[...] = new[0]
    return out[0]
