"""F16 weights: one half per element (ggml-base ggml_fp16_to_fp32_row, exact)."""
from __future__ import annotations

import numpy as np

BLOCK, BLOCK_BYTES = 1, 2


def dequantize(raw: np.ndarray, n: int) -> np.ndarray:
    """[rows, 2n] uint8 -> f32 [rows, n]; f16 to f32 is exact."""
    return np.ascontiguousarray(raw).view(np.float16)[:, :n].astype(np.float32)
