"""Weight types bankml runs, one module each, and the registry the backends look them up in.

Each WeightType says how ggml stores it (block size and bytes), which activation type
ggml-cpu pairs it with (type_traits_cpu[type].vec_dot_type) and how to read it:
`dequantize` equals ggml-base's to_float (what get_rows gives); `unpack` gives the
integer weights and scales the matmul's integer block sums are made of (None for F16).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bankml.quants import f16, q1_0, q2_0, q4_0, q4_1, q4_k, q5_0, q5_1, q6_k, q8_0
from bankml.quants.blocks import Unpacked

F16, Q4_1, Q8_0, Q8_1, Q1_0, Q2_0 = 1, 3, 8, 9, 41, 42
Q4_0, Q5_0, Q5_1 = 2, 6, 7
Q4_K, Q6_K, Q8_K = 12, 14, 15


@dataclass(frozen=True)
class WeightType:
    name: str
    ggml_id: int
    block: int                       # elements per block
    block_bytes: int
    act_type: int                    # ggml id of the activation type (vec_dot_type)
    dequantize: Callable[[np.ndarray, int], np.ndarray]
    unpack: Callable[[np.ndarray, int], Unpacked] | None = None

    def row_bytes(self, n: int) -> int:
        return n // self.block * self.block_bytes


WEIGHT_TYPES: dict[int, WeightType] = {
    F16: WeightType("F16", F16, f16.BLOCK, f16.BLOCK_BYTES, F16, f16.dequantize),
    Q8_0: WeightType("Q8_0", Q8_0, q8_0.BLOCK, q8_0.BLOCK_BYTES, Q8_0, q8_0.dequantize, q8_0.unpack),
    Q4_1: WeightType("Q4_1", Q4_1, q4_1.BLOCK, q4_1.BLOCK_BYTES, Q8_1, q4_1.dequantize, q4_1.unpack),
    Q1_0: WeightType("Q1_0", Q1_0, q1_0.BLOCK, q1_0.BLOCK_BYTES, Q8_0, q1_0.dequantize, q1_0.unpack),
    Q2_0: WeightType("Q2_0", Q2_0, q2_0.BLOCK, q2_0.BLOCK_BYTES, Q8_0, q2_0.dequantize, q2_0.unpack),
    Q4_0: WeightType("Q4_0", Q4_0, q4_0.BLOCK, q4_0.BLOCK_BYTES, Q8_0, q4_0.dequantize, q4_0.unpack),
    Q5_0: WeightType("Q5_0", Q5_0, q5_0.BLOCK, q5_0.BLOCK_BYTES, Q8_0, q5_0.dequantize, q5_0.unpack),
    Q5_1: WeightType("Q5_1", Q5_1, q5_1.BLOCK, q5_1.BLOCK_BYTES, Q8_1, q5_1.dequantize, q5_1.unpack),
    Q4_K: WeightType("Q4_K", Q4_K, q4_k.BLOCK, q4_k.BLOCK_BYTES, Q8_K, q4_k.dequantize, q4_k.unpack),
    Q6_K: WeightType("Q6_K", Q6_K, q6_k.BLOCK, q6_k.BLOCK_BYTES, Q8_K, q6_k.dequantize, q6_k.unpack),
}
