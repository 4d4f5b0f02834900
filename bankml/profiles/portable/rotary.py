"""RoPE of the portable profile: a table of cos/sin per (position, pair), then the rotation.

The angle of pair i at position p is p * t_i turns, t_i = freq_scale * base^(-2i/n) / (2 pi)
rounded once to f32 (tables.rope_turns). Its fraction of a turn f is exact (p * t_i is an
integer times a power of two); f = j/256 + d with j = floor(256 f), and with rho = r(d) * 2pi
(two roundings: d to f32, the product):
    sin rho = rho - (rho^2 / 6) * rho,   cos rho = 1 - rho^2 * (1/2 - rho^2 / 24)
    cos = C[j] * cos rho - S[j] * sin rho,   sin = S[j] * cos rho + C[j] * sin rho
(each step one f32 rounding; C, S from tables.sincos_table). The table is data: backends read
it, so a device never evaluates a sine. The rotation of a pair (x0, x1):
    y0 = x0 * cos - x1 * sin,   y1 = x0 * sin + x1 * cos
pairs (2i, 2i+1) in mode "norm" (llama), (i, i + n/2) in mode "neox" (qwen3).
"""
from __future__ import annotations

import numpy as np

from bankml.profiles.portable.arith import F32, add, canon, fields, mul, sub
from bankml.profiles.portable.tables import SINCOS_N, constants, rope_turns, sincos_table


def rope_table(pos, n_dims: int, freq_base: float, freq_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), f32 [len(pos), n_dims/2], at positions pos (0 <= pos < 2^17)."""
    t = rope_turns(n_dims, float(freq_base), float(freq_scale))
    _, e, frac = fields(t)
    sig = np.where(e == 0, 0, frac | 0x800000)             # t = sig * 2^-s
    s = 150 - e                                            # 127 + 23 - e
    p = np.asarray(pos, np.int64).reshape(-1, 1)
    if p.size and (p.min() < 0 or p.max() >= 1 << 17):
        raise ValueError("rope_table: positions must be in 0 .. 2^17 - 1")
    prod = p * sig[None, :]                                # < 2^41
    frac_turn = np.where(s >= 62, prod, prod & ((np.int64(1) << np.minimum(s, 62)) - 1))
    shift = s - 8                                          # t < 1/(2 pi): s >= 26
    j = frac_turn >> shift
    rest = frac_turn - (j << shift)                        # d = rest * 2^-s
    d = np.ldexp(rest.astype(F32), (-s).astype(np.int32) * np.ones_like(rest, np.int32)).astype(F32)
    c = constants()
    rho = mul(canon(d), c["TWO_PI"])
    r2 = mul(rho, rho)
    sin_r = sub(rho, mul(mul(r2, c["SIXTH"]), rho))
    cos_r = sub(F32(1), mul(r2, sub(F32(0.5), mul(r2, c["TWENTYFOURTH"]))))
    C, S = sincos_table()
    cj, sj = C[j % SINCOS_N], S[j % SINCOS_N]
    cos = sub(mul(cj, cos_r), mul(sj, sin_r))
    sin = add(mul(sj, cos_r), mul(cj, sin_r))
    return cos, sin


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, mode: str) -> np.ndarray:
    """x f32 [T, heads, n_dims]; cos, sin [T, n_dims/2] (the table's rows at the positions)."""
    x = canon(x)
    half = x.shape[-1] // 2
    if mode == "norm":
        x0, x1 = x[..., 0::2], x[..., 1::2]
    elif mode == "neox":
        x0, x1 = x[..., :half], x[..., half:]
    else:
        raise ValueError(f"rope mode {mode!r}")
    c, s = cos[:, None, :], sin[:, None, :]
    y0 = sub(mul(x0, c), mul(x1, s))
    y1 = add(mul(x0, s), mul(x1, c))
    out = np.empty_like(x)
    if mode == "norm":
        out[..., 0::2], out[..., 1::2] = y0, y1
    else:
        out[..., :half], out[..., half:] = y0, y1
    return out
