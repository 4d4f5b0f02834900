"""RoPE in ggml's float order (GGML_MAP §4): the cos/sin cache, then the rotation.

Cache: ggml-cpu/ops.cpp:ggml_rope_cache_init + rope_yarn + rope_yarn_ramp, with the corr dims
of ggml/src/ggml.c:ggml_rope_yarn_corr_dims (ggml-base: no FMA). GCC contracts two expressions
in rope_yarn (checked in libggml-cpu.so):
    theta  = fma(theta_interp, r(1 - ramp_mix), r(theta_extrap * ramp_mix))
    mscale = r(attn_factor * fma(0.1f, logf(r(1/freq_scale)), 1))
and merges cosf+sinf into one glibc sincosf call. theta is an iterated f32 product
(theta *= theta_scale per pair), never powf per pair.

Rotation: ggml_compute_forward_rope_flt -> rotate_pairs. Both the scalar NEOX loop
(vfmsub/vfmadd) and GCC's vectorised NORM loop (vfmaddsub) compute
    y0 = fma(x0, cos, -r(x1*sin)),  y1 = fma(x0, sin, r(x1*cos))
except that a last odd pair in NORM mode takes a vmulps+vaddsubps path with no FMA: y0 = r(r(x0*cos) - r(x1*sin)), y1 = r(r(x0*sin) + r(x1*cos)).
"""
from __future__ import annotations

import math

import numpy as np

from bankml.backends.reference.lowerings import check_order
from bankml.errors import LoweringError
from bankml.numerics.floats import fma
from bankml.ir.order import ROPE, FloatOrder
from bankml.numerics.libm import logf, powf, sincosf

f32 = np.float32


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[np.float32, np.float32]:
    """ggml_rope_yarn_corr_dims: (max(0, floor(cd(beta_fast))), min(n_dims-1, ceil(cd(beta_slow)))), in f32."""
    log_base2 = (logf(np.array([freq_base], f32)) * f32(2))[0]

    def corr_dim(n_rot: float) -> np.float32:
        denom = f32(f32(n_rot) + f32(n_rot)) * f32(math.pi)             # n_rot * 2 * (float)M_PI
        lg = logf(np.array([f32(n_ctx_orig) / denom], f32))[0]
        return f32(f32(n_dims) * lg) / log_base2

    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    return f32(max(f32(0), start)), f32(min(f32(n_dims - 1), end))


def rope_cache(pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float, ext_factor: float,
               attn_factor: float, beta_fast: float, beta_slow: float, n_ctx_orig: int,
               freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each f32 [len(pos), n_dims/2]: ggml_rope_cache_init for every position."""
    pos = np.asarray(pos, np.int32)
    freq_scale, ext_factor, attn_factor = f32(freq_scale), f32(ext_factor), f32(attn_factor)
    theta_scale = powf(f32(freq_base), f32(f32(-2.0) / f32(n_dims)))
    lo, hi = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    mscale = attn_factor
    if ext_factor != 0:
        log_scale = logf(np.array([f32(1) / freq_scale], f32))
        mscale = f32(attn_factor * fma(f32(0.1), log_scale, f32(1))[0])

    half = n_dims // 2
    thetas = np.empty((pos.size, half), f32)
    theta = pos.astype(f32)                                          # (float)p
    for k in range(half):
        te = theta if freq_factors is None else (theta / f32(freq_factors[k])).astype(f32)
        ti = (freq_scale * te).astype(f32)
        if ext_factor != 0:
            y = f32(f32(f32(k) - lo) / max(f32(0.001), f32(hi - lo)))
            ramp = f32(f32(1) - min(f32(1), max(f32(0), y)))
            mix = f32(ramp * ext_factor)
            ti = fma(ti, f32(f32(1) - mix), (te * mix).astype(f32))
        thetas[:, k] = ti
        theta = (theta * theta_scale).astype(f32)                    # iterated, rounded each pair
    sin, cos = sincosf(thetas)
    return (cos * mscale).astype(f32), (sin * mscale).astype(f32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str, order: FloatOrder = ROPE) -> np.ndarray:
    """Rotate x [M, n_head, head_dim] with the cache of rope_cache; mode "norm" (Llama) or "neox" (Qwen3).

    Dims past n_dims = 2*cos.shape[1] pass through unchanged.
    """
    check_order(order, ROPE, "rope")
    x = np.asarray(x, f32)
    half = cos.shape[-1]
    n_dims = 2 * half
    c, s = cos[:, None, :], sin[:, None, :]
    if mode == "neox":
        x0, x1 = x[..., :half], x[..., half:n_dims]
    elif mode == "norm":
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
    else:
        raise LoweringError(f"reference backend: rope mode {mode!r} is not norm or neox")
    y0 = fma(x0, c, -(x1 * s).astype(f32))
    y1 = fma(x0, s, (x1 * c).astype(f32))
    if mode == "norm" and half % 2 == 1:                         # the last pair: vmulps+vaddsubps, no FMA
        plain = slice(half - 1, half)
        a0, a1, ca, sa = x0[..., plain], x1[..., plain], c[..., plain], s[..., plain]
        y0[..., plain] = ((a0 * ca).astype(f32) - (a1 * sa).astype(f32)).astype(f32)
        y1[..., plain] = ((a0 * sa).astype(f32) + (a1 * ca).astype(f32)).astype(f32)
    out = x.copy()
    if mode == "neox":
        out[..., :half], out[..., half:n_dims] = y0, y1
    else:
        out[..., 0:n_dims:2], out[..., 1:n_dims:2] = y0, y1
    return out
