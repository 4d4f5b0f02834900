"""The mul_mat problems the reference tests share: a case's id, its weight bytes and activations,
and ggml_mul_mat of the oracle build on them (a plain ggml context, or the repack buffer)."""
from __future__ import annotations

import functools

import numpy as np

from bankml.oracle import ggml as G
from bankml.quants import WEIGHT_TYPES


def case_id(case) -> str:
    t, k, m, n = case
    return f"{WEIGHT_TYPES[t].name}-K{k}-M{m}-N{n}"


@functools.cache
def problem(ggml_type: int, k: int, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight bytes [n, row bytes], activations f32 [m, k]) of one case, always the same."""
    rng = np.random.default_rng(1000 * k + 10 * m + n + ggml_type)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2, (n, 1))).astype(np.float32)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 20, (m, 1))).astype(np.float32)
    x[0, 32:64] = 0                                          # a zero activation block
    raw = w.astype(np.float16).view(np.uint8) if ggml_type == G.TYPE_F16 else G.quantize_chunk(ggml_type, w)
    return raw, x


def ggml_mul_mat(ggml_type: int, raw: np.ndarray, x: np.ndarray, threads: int, repacked: bool = False) -> np.ndarray:
    """ggml_mul_mat(w, x) of the oracle build: f32 [m, n]; `repacked` puts w in the CPU_REPACK buffer."""
    (n, _), (m, k) = raw.shape, x.shape
    ctx = G.Context()
    w = ctx.repacked(ggml_type, (k, n), raw) if repacked else ctx.tensor(ggml_type, (k, n), raw)
    xt = ctx.tensor(G.TYPE_F32, (k, m), x)
    return ctx.compute(ctx.op("ggml_mul_mat", w, xt), threads, (m, n))
