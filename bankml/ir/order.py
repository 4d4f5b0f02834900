"""Float order as data: how an op's floats are combined, written once per ggml kernel.

A FloatOrder names the ggml function it mirrors and spells out the choices that decide
its bits: SIMD lanes and independent accumulators, how they fold, f32 or f64 sums,
fused multiply-adds, where values are rounded to f16, and which expf is called.
Backends lower this data; they never pick an order of their own.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FloatOrder:
    kernel: str                     # the ggml function mirrored (file:function in the constant's comment)
    lanes: int = 1                  # SIMD width of one accumulator
    accs: int = 1                   # independent accumulators
    fold: str = "seq"               # how accs and lanes combine: "seq" | "hsum8" | "f32x8_reduce"
    acc: str = "f32"                # "f32" | "f64"
    fma: bool = False               # a*b+c rounded once
    f16_at: tuple[str, ...] = ()    # values rounded to f16, e.g. ("src1",), ("q", "v_acc")
    expf: str = ""                  # "glibc" | "ggml_v_expf" | "ggml_v_expf+glibc_tail"

    def describe(self) -> str:
        """Short annotation for IR dumps: only what differs from the defaults."""
        parts = [self.kernel]
        if self.lanes > 1 or self.accs > 1:
            parts.append(f"lanes={self.lanes}x{self.accs}")
        if self.fold != "seq":
            parts.append(f"fold={self.fold}")
        if self.acc != "f32":
            parts.append(f"acc={self.acc}")
        if self.fma:
            parts.append("fma")
        if self.f16_at:
            parts.append("f16@" + ",".join(self.f16_at))
        if self.expf:
            parts.append(f"expf={self.expf}")
        return " ".join(parts)


# ---- mul_mat (GGML_MAP §3) -------------------------------------------------------------
# ggml-cpu/vec.cpp:ggml_vec_dot_f16, AVX2: 4 accumulators of 8 lanes, GGML_F32x8_REDUCE, f64 tail
F16_VEC_DOT = FloatOrder("ggml_vec_dot_f16", lanes=8, accs=4, fold="f32x8_reduce", fma=True, f16_at=("src1",))
# ggml-cpu/llamafile/sgemm.cpp:tinyBLAS<8,__m256>::gemm_bloc: one 8-lane accumulator per output, hsum
F16_TINYBLAS = FloatOrder("tinyBLAS_f16", lanes=8, fold="hsum8", fma=True, f16_at=("src1",))
# ggml-cpu/arch/x86/quants.c:ggml_vec_dot_q8_0_q8_0 (tinyBLAS_Q0_AVX gives the same bits)
Q8_0_DOT = FloatOrder("ggml_vec_dot_q8_0_q8_0", lanes=8, fold="hsum8", fma=True, f16_at=("act_d",))
# ggml-cpu/arch/x86/quants.c:ggml_vec_dot_q4_1_q8_1: summs scalar fma chain, acc 8 lanes
Q4_1_DOT = FloatOrder("ggml_vec_dot_q4_1_q8_1", lanes=8, fold="hsum8", fma=True, f16_at=("act_d", "act_s"))
# ggml-cpu/arch/x86/quants.c:ggml_vec_dot_q1_0_q8_0 (AVX2)
Q1_0_DOT = FloatOrder("ggml_vec_dot_q1_0_q8_0", lanes=8, fold="hsum8", fma=True, f16_at=("act_d",))
# ggml-cpu/quants.c:ggml_vec_dot_q2_0_q8_0_generic (scalar, GCC-contracted fma)
Q2_0_DOT = FloatOrder("ggml_vec_dot_q2_0_q8_0", fma=True, f16_at=("act_d",))
# ggml-cpu/arch/x86/quants.c:ggml_vec_dot_q4_0_q8_0 / _q5_0_q8_0 (tinyBLAS_Q0_AVX gives the same bits):
# the Q8_0 chain, per block acc = fma(r(wd*ad), float(lane sums), acc), hsum8
Q4_0_DOT = FloatOrder("ggml_vec_dot_q4_0_q8_0", lanes=8, fold="hsum8", fma=True, f16_at=("act_d",))
Q5_0_DOT = FloatOrder("ggml_vec_dot_q5_0_q8_0", lanes=8, fold="hsum8", fma=True, f16_at=("act_d",))
# ggml-cpu/arch/x86/quants.c:ggml_vec_dot_q5_1_q8_1: the Q4_1 chain (summs contracted, checked)
Q5_1_DOT = FloatOrder("ggml_vec_dot_q5_1_q8_1", lanes=8, fold="hsum8", fma=True, f16_at=("act_d", "act_s"))
# ggml-cpu/arch/x86/repack.cpp:ggml_gemv_q4_0_8x8_q8_0 = ggml_gemm_q4_0_8x8_q8_0 (Q4_0, rows % 8 == 0):
# one lane per output holds the exact int32 sum of a whole block; acc = fma(float(sum), r(wd*ad), acc)
Q4_0_REPACK = FloatOrder("ggml_gemv_q4_0_8x8_q8_0", fma=True, f16_at=("act_d",))

# every order a mul_mat of a weight can carry (passes/choose_matmul_kernel.py picks one)
MUL_MAT_ORDERS = (F16_VEC_DOT, F16_TINYBLAS, Q8_0_DOT, Q4_1_DOT, Q1_0_DOT, Q2_0_DOT, Q4_0_DOT, Q5_0_DOT, Q5_1_DOT,
                  Q4_0_REPACK)

# ---- elementwise and row ops -------------------------------------------------------------
# ggml-cpu/ops.cpp:ggml_compute_forward_rms_norm_f32: sequential f64 sum of f32 squares
RMS_NORM = FloatOrder("ggml_compute_forward_rms_norm_f32", acc="f64")
# ggml-cpu/binary-ops.cpp:apply_binary_op
ELEMENTWISE = FloatOrder("apply_binary_op")
# ggml-cpu/ops.cpp:ggml_compute_forward_rope_flt + ggml_rope_cache_init (GCC-contracted fma)
ROPE = FloatOrder("ggml_compute_forward_rope_flt", fma=True)
# ggml-cpu/vec.cpp:ggml_vec_swiglu_f32: ggml_v_expf on 8-lane chunks, glibc expf tail
SWIGLU = FloatOrder("ggml_vec_swiglu_f32", lanes=8, expf="ggml_v_expf+glibc_tail")
# ggml-cpu/vec.h:ggml_vec_geglu_f32 with GGML_GELU_FP16 (defined in vec.h): per element
#   x <= -10: 0;  x >= 10: r(x*g);  else r(f32(ggml_table_gelu_f16[f16(x)]) * g)   (bankml/numerics/gelu.py)
GEGLU = FloatOrder("ggml_vec_geglu_f32", f16_at=("src0",))
# ggml-cpu/ops.cpp:ggml_compute_forward_scale_f32 (bias 0) -> ggml_vec_scale_f32: r(x*s)
SCALE = FloatOrder("ggml_vec_scale_f32")
# ggml-cpu/vec.cpp:ggml_vec_silu_f32 per row: ggml_v_silu on 8-lane chunks, ggml_silu_f32 (glibc expf) tail:
# swiglu's gate without the product
SILU = FloatOrder("ggml_vec_silu_f32", lanes=8, expf="ggml_v_expf+glibc_tail")
# ggml-cpu/unary-ops.cpp:op_sigmoid, one element at a time: r(1 / r(1 + expf(-x))), glibc expf
# (objdump of the haswell build: vxorps, call expf, vaddss, vdivss)
SIGMOID = FloatOrder("op_sigmoid", expf="glibc")
# ggml-cpu/unary-ops.cpp:op_softplus: x > 20 ? x : logf(r(1 + expf(x))), glibc expf and logf
# (objdump: vcomiss against 20, call expf, vaddss, call logf); NaN is not > 20: logf's NaN
SOFTPLUS = FloatOrder("op_softplus", expf="glibc")
# ggml-cpu/ops.cpp:ggml_compute_forward_ssm_conv_f32: per output, `sumf += s*c` over d_conv from 0 as
# GCC vectorized it (objdump): blocks of 8, then one of 4, of rounded products added in order, the
# last (at most 3) as FMAs (bankml/numerics/vec.py gcc_sum)
SSM_CONV = FloatOrder("ggml_compute_forward_ssm_conv_f32", fma=True)
# ggml-cpu/ops.cpp:ggml_compute_forward_gated_delta_net_one_chunk (K = 1, scalar gate): per head and
# token M = r(M*expf(g)); d = r(r(v - dot(M_j, k))*beta); M_j = fma(k, d_j, M_j); o = r(dot(M_j, q)*r(1/sqrtf(S)));
# dot = ggml_vec_dot_f32: four 8-lane FMA accumulators over steps of 32, GGML_F32x8_REDUCE
GATED_DELTA_NET = FloatOrder("ggml_compute_forward_gated_delta_net_one_chunk", lanes=8, accs=4,
                             fold="f32x8_reduce", fma=True, expf="glibc")
# ggml-cpu/ops.cpp:ggml_compute_forward_set_rows -> ggml_cpu_fp32_to_fp16
SET_ROWS_F16 = FloatOrder("ggml_compute_forward_set_rows", f16_at=("dst",))

# ggml_compute_forward_set_rows -> quantize_row_q8_0 (AVX2, as the q8_0 activations) / quantize_row_q4_0_ref
SET_ROWS_Q8_0 = FloatOrder("set_rows_quantize_row_q8_0", f16_at=("d",))
SET_ROWS_Q4_0 = FloatOrder("set_rows_quantize_row_q4_0_ref", f16_at=("d",))
# ggml-cpu/ops.cpp:ggml_compute_forward_fwht (mul_mat with GGML_HINT_SRC0_IS_HADAMARD): y = r(x * r(1/sqrtf(n))),
# then butterflies of len 1, 2, 4, ...: (u, v) -> (r(u+v), r(u-v)) (the SIMD fma(v, -1, u) is r(u-v))
FWHT = FloatOrder("ggml_compute_forward_fwht")

# ---- flash_attn_ext (GGML_MAP §5) -------------------------------------------------------------
# ggml_compute_forward_flash_attn_ext_f16_one_chunk: Q to f16, f16 V accumulator, glibc expf
FA_REFERENCE = FloatOrder("flash_attn_ext_f16_one_chunk", lanes=8, accs=4, fold="f32x8_reduce", fma=True,
                          f16_at=("q", "v_acc"), expf="glibc")
# ggml_compute_forward_flash_attn_ext_tiled: f32 Q, serial fma dots, f64 softmax sum, ggml_v_expf
FA_TILED = FloatOrder("flash_attn_ext_tiled", fma=True, acc="f64", expf="ggml_v_expf")
# one_chunk per thread chunk of keys, then ggml_flash_attn_ext_reduce_partials
FA_SPLIT = FloatOrder("flash_attn_ext_split_kv", lanes=8, accs=4, fold="f32x8_reduce", fma=True,
                      f16_at=("q", "v_acc"), expf="glibc")
# a batch of sequences (each row its own sequence, its own cache and cells): every row the order its
# sequence's decode takes alone, FA_REFERENCE below 512 of its cells, FA_SPLIT from 512 (by its own
# cell count and llama_threads), as choose_attention_kernel decides for one row
FA_ROWS = FloatOrder("flash_attn_ext_f16 per sequence: one_chunk|split_kv", lanes=8, accs=4, fold="f32x8_reduce",
                     fma=True, f16_at=("q", "v_acc"), expf="glibc")

# ---- K-quants against q8_K activations (backends/reference/matmul_kquants.py spells them out) ----
# ggml-cpu.c:ggml_compute_forward_mul_mat: tiled/tiled.cpp:tiled_run_microtile_avx2 when src1 has
# >= 8 columns (ggml_tiled_min_batch), else arch/x86/quants.c:ggml_vec_dot_q{4,6}_K_q8_K
Q4_K_MUL_MAT = FloatOrder("ggml_vec_dot_q4_K_q8_K|tiled<8", lanes=8, fold="hsum8", fma=True)
Q6_K_MUL_MAT = FloatOrder("ggml_vec_dot_q6_K_q8_K|tiled<8", lanes=8, fold="hsum8", fma=True)
# repack.cpp q4_K_8x8_q8_K (rows % 8 == 0): ggml_gemm_q4_K_8x8_q8_K per group of 4 columns,
# ggml_gemv_q4_K_8x8_q8_K for the rest (arch/x86/repack.cpp)
Q4_K_REPACK = FloatOrder("ggml_gemm_q4_K_8x8_q8_K|gemv", fma=True)
MUL_MAT_ORDERS += (Q4_K_MUL_MAT, Q6_K_MUL_MAT, Q4_K_REPACK)

# one_chunk over a quantized cache: the only kernel ggml runs when K or V is not f16 (no tiled, no
# split-KV). A q8_0/q4_0 K: Q through quantize_row_q8_0, K.Q by the K type's vec_dot (one 8-lane fma
# accumulator over blocks, hsum8); an f16 K: Q rounded to f16, ggml_vec_dot_f16. An f16 V: the f16
# accumulator (rounded every key); a q8_0/q4_0 V: each row dequantized (ggml-base to_float) into an
# f32 accumulator by ggml_vec_mad_f32 (fma) and ggml_vec_scale_f32.
FA_REFERENCE_QK = FloatOrder("flash_attn_ext_f16_one_chunk", lanes=8, fold="hsum8", fma=True,
                             f16_at=("act_d", "v_acc"), expf="glibc")        # K q8_0/q4_0, V f16
FA_REFERENCE_QKV = FloatOrder("flash_attn_ext_f16_one_chunk", lanes=8, fold="hsum8", fma=True,
                              f16_at=("act_d",), expf="glibc")               # K and V q8_0/q4_0
FA_REFERENCE_QV = FloatOrder("flash_attn_ext_f16_one_chunk", lanes=8, accs=4, fold="f32x8_reduce", fma=True,
                             f16_at=("q",), expf="glibc")                    # K f16, V q8_0/q4_0
FA_QUANT_CACHE = (FA_REFERENCE_QK, FA_REFERENCE_QKV, FA_REFERENCE_QV)
