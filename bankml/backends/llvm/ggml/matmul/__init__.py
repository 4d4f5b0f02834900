"""mul_mat in ggml's orders: the register-tiled kernel (tiling) and one tiler per weight family:
f16 (vec_dot_f16, tinyBLAS), quant (Q8_0, Q4_1, Q1_0, Q2_0), legacy (Q4_0, Q5_0, Q5_1), repack
(Q4_0 8x8), q1_lut (Q1_0 decode by lookup tables), kquants (Q4_K, Q6_K against q8_K). legacy and
kquants also register their types' get_rows elements (rows.row_element)."""
from bankml.backends.llvm.ggml.matmul import f16, kquants, legacy, quant, repack, tiling  # noqa: F401
