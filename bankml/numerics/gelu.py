"""ggml's GELU on the CPU: the f16 lookup table `ggml_table_gelu_f16` (GGML_GELU_FP16 is
defined in ggml-cpu/vec.h, so ggml_vec_gelu_f32 and ggml_vec_geglu_f32 read it).

ggml_cpu_init fills it once: table[i] = fp32_to_fp16(ggml_gelu_f32(fp16_to_fp32(i))) with
    ggml_gelu_f32(x) = 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)))
compiled by GCC with -mfma, which contracts 1.0f + (GELU_COEF_A*x)*x into one fma:
    inner = fma(r(A*x), x, 1);  t = tanhf(r(r(C*x) * inner));  gelu = r(r(0.5*x) * r(1 + t))
(glibc tanhf; tests/backends/test_gelu.py checks all 65,536 entries against ggml's geglu).
"""
from __future__ import annotations

import functools

import numpy as np

from bankml.numerics.floats import fma
from bankml.numerics.libm import tanhf

f32 = np.float32
GELU_COEF_A = f32(0.044715)
SQRT_2_OVER_PI = f32(0.79788456080286535587989211986876)


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32 as GCC compiled it in ggml-cpu (one contracted fma)."""
    x = np.asarray(x, f32)
    inner = fma((GELU_COEF_A * x).astype(f32), x, f32(1))
    t = tanhf(((SQRT_2_OVER_PI * x).astype(f32) * inner).astype(f32))
    return ((f32(0.5) * x).astype(f32) * (f32(1) + t).astype(f32)).astype(f32)


@functools.cache
def gelu_table_f16() -> np.ndarray:
    """ggml_table_gelu_f16: 65,536 f16 values indexed by the f16 bits of x (a constant)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(f32)
    with np.errstate(all="ignore"):
        t = gelu_f32(x).astype(np.float16)
    t.setflags(write=False)
    return t


def geglu(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """ggml_vec_geglu_f32 (GGML_GELU_FP16): gelu(x) * g elementwise, in f32."""
    x, g = np.asarray(x, f32), np.asarray(g, f32)
    table = gelu_table_f16().astype(f32)
    with np.errstate(all="ignore"):
        looked = table[x.astype(np.float16).view(np.uint16)]
        y = (np.where(x >= f32(10), x, looked) * g).astype(f32)
    return np.where(x <= f32(-10), f32(0), y).astype(f32)
