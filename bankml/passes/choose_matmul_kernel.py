"""vec_dot or llamafile tinyBLAS for each mul_mat, by the rule ggml-cpu uses.

ggml-cpu/ggml-cpu.c:ggml_compute_forward_mul_mat (GGML_USE_LLAMAFILE build):
  0. Q4_K with rows % 8 == 0 is repacked (repack.cpp q4_K_8x8_q8_K) and never reaches here:
     its order Q4_K_REPACK is gemm per 4 columns, gemv for the rest (matmul_kquants.py).
  1. ggml_compute_forward_mul_mat_tiled takes K-quants and IQ types with >= 8 columns: for
     Q4_K and Q6_K the orders Q4_K_MUL_MAT / Q6_K_MUL_MAT hold both this and step 4's vec_dot,
     which the backends pick by the column count (as ggml does at run time).
  2. llamafile_sgemm with the raw f32 src1 fails for every weight type we run
     (F16 wants an F16 B on AVX2, Q8_0 a Q8_0 B).
  3. src1 is converted to vec_dot_type; llamafile_sgemm is tried again
     (ggml-cpu/llamafile/sgemm.cpp:llamafile_sgemm):
       - n = ne11 (columns) < 2 -> false;
       - F16: tinyBLAS<8,__m256,...>::matmul needs m = ne01 (weight rows) % 4 == 0
         (16 vector registers: m%16, m%8 or m%4 tilings); any k works on AVX (masked tail);
       - Q8_0, Q4_0, Q5_0: tinyBLAS_Q0_AVX, always (its bits equal ggml_vec_dot_q8_0_q8_0 /
         _q4_0_q8_0 / _q5_0_q8_0: fma(r(da*db), lane sums, acc) per block, then the same hsum);
       - Q4_1, Q5_1, Q1_0, Q2_0 (and anything else): false.
     No contiguity or alignment condition applies to this second call (wdata is packed).
  4. Otherwise ggml_compute_forward_mul_mat_one_chunk calls vec_dot once per output.
Before all of this, a Q4_0 matrix whose row count is a multiple of 8 was put in the CPU_REPACK
buffer at load time (ggml-cpu/repack.cpp:ggml_repack_get_optimal_repack_type: AVX2 picks
q4_0_8x8_q8_0; llama.cpp's tied output, a duplicate of token_embd, is loaded as `output`
and repacked too): its mul_mat is the repack's forward_mul_mat, whose gemm (groups of 4
columns) and gemv (the rest) make the same per-output chain, Q4_0_REPACK.
Thread count never changes the bits (it only splits outputs and src1 block ranges).
In a batch of sequences (g.meta["seqs"]: each column one sequence's decode token) every column
takes the path ggml takes for that sequence alone, one column: the order for one column, and
params["per_column"] for the orders that hold two paths picked by the column count (Q4_K, Q6_K),
so that a sequence's bits do not depend on what else is in the batch.
Each weight type's share of this rule (its vec_dot order, the shapes that leave it) is its
entry in bankml/quants' table (WeightType.vec_dot, .by_shape).
"""
from __future__ import annotations

from bankml.ir import order as fo
from bankml.ir.dims import decide, prod_range
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.quants import WEIGHT_TYPES


def matmul_order(wtype: int, n_rows: int, n_cols: int) -> fo.FloatOrder:
    """The FloatOrder of ggml's mul_mat for a weight of type wtype with n_rows rows (ne01)
    times n_cols activation columns (ne11): its vec_dot, or its rule by shape (bankml/quants)."""
    if wtype not in WEIGHT_TYPES:
        raise ValueError(f"mul_mat: weight type {wtype} has no float order; bankml runs "
                         + " ".join(wt.name for wt in WEIGHT_TYPES.values()))
    return WEIGHT_TYPES[wtype].matmul_order(n_rows, n_cols)


def choose_matmul_kernel(g: Graph) -> Graph:
    """Attach matmul_order to every mul_mat whose src0 is a weight (for every column count a
    generic graph's sizes allow: the variants are cut so that one order holds)."""
    seqs = g.meta.get("seqs", False)

    def pick(n: Node) -> Node | None:
        w = g[n.inputs[0]]
        if w.op is not Op.WEIGHT:
            return None
        wtype, n_rows = int(w.params["ggml_type"]), w.shape[0]
        if seqs:                # each column alone: one column's order, every column through its path
            return n.replace(order=matmul_order(wtype, n_rows, 1), params={**n.params, "per_column": True})
        return n.replace(order=decide(lambda n_cols: matmul_order(wtype, n_rows, n_cols), prod_range(n.shape[:-1])))
    return g.map(pick, Op.MUL_MAT)
