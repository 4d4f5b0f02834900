"""The weight types bankml runs, one module each, and the one table of their facts.

Every part of bankml that asks about a ggml type reads it here: the GGUF reader (sizes),
the plan (which matrices bankml takes, their blocks), the passes (the activation type and
float order of each mul_mat), the backends (row and activation bytes, the reference chain).

A WeightType says how ggml stores it (block size and bytes, ggml.c type_traits), which
activation type ggml-cpu pairs it with (type_traits_cpu[type].vec_dot_type), how to read
it (`dequantize` equals ggml-base's to_float, what get_rows gives; `unpack` gives the integer
weights and scales the matmul's integer block sums are made of, None for F16) and its dot
chain: `vec_dot`, the FloatOrder of its ggml_vec_dot_*, `by_shape`, where ggml takes another
path for some shapes, the rule (n_rows, n_cols) -> FloatOrder (passes/choose_matmul_kernel.py),
and `chain`, the reference backend's spelling of its integer sums and float steps
(backends/reference/matmul.py). Adding a type: docs/ARCHITECTURES.md, "Adding a weight type".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bankml.ir import order as fo
from bankml.ir.order import FloatOrder
from bankml.quants import activation, f16, q1_0, q2_0, q4_0, q4_1, q4_k, q5_0, q5_1, q6_k, q8_0, q8_k
from bankml.quants.blocks import Unpacked

# ggml_type ids (ggml/include/ggml.h enum ggml_type)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q4_K, Q6_K, Q8_K, Q1_0, Q2_0 = 12, 14, 15, 41, 42


@dataclass(frozen=True)
class GgmlType:
    """A ggml type as ggml.c's type_traits sizes it: block values in block_bytes bytes."""
    name: str
    ggml_id: int
    block: int                       # elements per block (blck_size)
    block_bytes: int                 # bytes per block (type_size)

    def row_bytes(self, n: int) -> int:
        return n // self.block * self.block_bytes


@dataclass(frozen=True)
class WeightType(GgmlType):
    act_type: int                    # ggml id of the activation type (vec_dot_type), in ACT_TYPES
    vec_dot: FloatOrder              # ggml_vec_dot_<type>_<act type>'s chain (ir/order.py)
    chain: str                       # backends/reference/matmul.py's spelling: a key of its CHAINS
    dequantize: Callable[[np.ndarray, int], np.ndarray]
    unpack: Callable[[np.ndarray, int], Unpacked] | None = None
    by_shape: Callable[[int, int], FloatOrder] | None = None   # (n_rows, n_cols) -> order; None: vec_dot

    def matmul_order(self, n_rows: int, n_cols: int) -> FloatOrder:
        """The FloatOrder of ggml's mul_mat of n_rows weight rows (ne01) by n_cols columns (ne11)."""
        return self.by_shape(n_rows, n_cols) if self.by_shape else self.vec_dot


# ---- where ggml-cpu leaves vec_dot by shape (passes/choose_matmul_kernel.py has the whole rule) ----

def _f16_order(n_rows: int, n_cols: int) -> FloatOrder:
    """llamafile/sgemm.cpp:llamafile_sgemm: tinyBLAS<8,__m256> for >= 2 columns and rows % 4 == 0."""
    return fo.F16_TINYBLAS if n_cols >= 2 and n_rows % 4 == 0 else fo.F16_VEC_DOT


def _q4_0_order(n_rows: int, n_cols: int) -> FloatOrder:
    """repack.cpp:ggml_repack_get_optimal_repack_type (AVX2): q4_0_8x8_q8_0 when rows % 8 == 0,
    whatever the column count (its gemm and gemv give the same bits)."""
    return fo.Q4_0_REPACK if n_rows % 8 == 0 else fo.Q4_0_DOT


def _q4_k_order(n_rows: int, n_cols: int) -> FloatOrder:
    """repack.cpp (AVX2): q4_K_8x8_q8_K when rows % 8 == 0; else vec_dot below 8 columns and
    tiled from 8, both in Q4_K_MUL_MAT (the backends pick by the column count, as ggml does)."""
    return fo.Q4_K_REPACK if n_rows % 8 == 0 else fo.Q4_K_MUL_MAT


# ---- the table -------------------------------------------------------------------------------
# Q8_0: tinyBLAS_Q0_AVX for >= 2 columns gives vec_dot's bits (so do Q4_0's and Q5_0's);
# Q6_K is not repacked on AVX2: Q6_K_MUL_MAT holds its vec_dot and its tiled path.
WEIGHT_TYPES: dict[int, WeightType] = {t.ggml_id: t for t in (
    WeightType("F16", F16, f16.BLOCK, f16.BLOCK_BYTES, F16, fo.F16_VEC_DOT, "f16", f16.dequantize,
               by_shape=_f16_order),
    WeightType("Q8_0", Q8_0, q8_0.BLOCK, q8_0.BLOCK_BYTES, Q8_0, fo.Q8_0_DOT, "q8_0", q8_0.dequantize, q8_0.unpack),
    WeightType("Q4_1", Q4_1, q4_1.BLOCK, q4_1.BLOCK_BYTES, Q8_1, fo.Q4_1_DOT, "q4_1", q4_1.dequantize, q4_1.unpack),
    WeightType("Q1_0", Q1_0, q1_0.BLOCK, q1_0.BLOCK_BYTES, Q8_0, fo.Q1_0_DOT, "q1_0", q1_0.dequantize, q1_0.unpack),
    WeightType("Q2_0", Q2_0, q2_0.BLOCK, q2_0.BLOCK_BYTES, Q8_0, fo.Q2_0_DOT, "q2_0", q2_0.dequantize, q2_0.unpack),
    WeightType("Q4_0", Q4_0, q4_0.BLOCK, q4_0.BLOCK_BYTES, Q8_0, fo.Q4_0_DOT, "q8_0", q4_0.dequantize, q4_0.unpack,
               by_shape=_q4_0_order),
    WeightType("Q5_0", Q5_0, q5_0.BLOCK, q5_0.BLOCK_BYTES, Q8_0, fo.Q5_0_DOT, "q8_0", q5_0.dequantize, q5_0.unpack),
    WeightType("Q5_1", Q5_1, q5_1.BLOCK, q5_1.BLOCK_BYTES, Q8_1, fo.Q5_1_DOT, "q4_1", q5_1.dequantize, q5_1.unpack),
    WeightType("Q4_K", Q4_K, q4_k.BLOCK, q4_k.BLOCK_BYTES, Q8_K, fo.Q4_K_MUL_MAT, "k_quant", q4_k.dequantize,
               q4_k.unpack, by_shape=_q4_k_order),
    WeightType("Q6_K", Q6_K, q6_k.BLOCK, q6_k.BLOCK_BYTES, Q8_K, fo.Q6_K_MUL_MAT, "k_quant", q6_k.dequantize,
               q6_k.unpack),
)}

# the activation (vec_dot) types: what a QUANTIZE node makes for each mul_mat
ACT_TYPES: dict[int, GgmlType] = {
    F16: WEIGHT_TYPES[F16],
    Q8_0: WEIGHT_TYPES[Q8_0],
    Q8_1: GgmlType("Q8_1", Q8_1, activation.QK, activation.Q8_1_DTYPE.itemsize),
    Q8_K: GgmlType("Q8_K", Q8_K, q8_k.QK, q8_k.DTYPE.itemsize),
}

# every other ggml type, sized only so that a file holding one reads (and plan refuses it by name):
# ggml/src/ggml.c type_traits, sizes checked against ggml-common.h. Removed ids (4, 5, 31-33, 36-38)
# have block size 0 there: unknown here.
_SIZED_ONLY = (
    ("F32", F32, 1, 4), ("Q2_K", 10, 256, 84), ("Q3_K", 11, 256, 110), ("Q5_K", 13, 256, 176),
    ("IQ2_XXS", 16, 256, 66), ("IQ2_XS", 17, 256, 74), ("IQ3_XXS", 18, 256, 98), ("IQ1_S", 19, 256, 50),
    ("IQ4_NL", 20, 32, 18), ("IQ3_S", 21, 256, 110), ("IQ2_S", 22, 256, 82), ("IQ4_XS", 23, 256, 136),
    ("I8", 24, 1, 1), ("I16", 25, 1, 2), ("I32", 26, 1, 4), ("I64", 27, 1, 8), ("F64", 28, 1, 8),
    ("IQ1_M", 29, 256, 56), ("BF16", 30, 1, 2), ("TQ1_0", 34, 256, 54), ("TQ2_0", 35, 256, 66),
    ("MXFP4", 39, 32, 17), ("NVFP4", 40, 64, 36),
)
GGML_TYPES: dict[int, GgmlType] = dict(sorted(
    {**{i: GgmlType(name, i, blck, size) for name, i, blck, size in _SIZED_ONLY}, **ACT_TYPES, **WEIGHT_TYPES}.items()))
