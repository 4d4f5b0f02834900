"""Q4_0 matrices of 8k rows: ggml's CPU_REPACK path (q4_0_8x8_q8_0), as register tiles.

llama.cpp loads such a matrix into the CPU_REPACK buffer (ggml-cpu/repack.cpp), interleaving
8 rows; its mul_mat quantizes src1 to q8_0 (ggml_quantize_mat_q8_0_4x8 for groups of 4
columns, quantize_row_q8_0 for the rest: the same values) and runs
ggml_gemm_q4_0_8x8_q8_0 on the groups and ggml_gemv_q4_0_8x8_q8_0 on the rest
(arch/x86/repack.cpp: gemm/gemv_q4_b32_8x8_q8_0_lut_avx). Both keep, per output, one f32 lane:

    for each 32-block: S = exact int32 sum of the 32 products (nibble - 8) x q8
                       acc = fma(float(S), r(wd * ad), acc)
    result = acc                                   (no horizontal sum: FloatOrder Q4_0_REPACK)

How ggml splits the work (forward_mul_mat) decides who computes an output, never its bits:
threads quantize src1 in groups of 4 columns (i11 = 4*ith, step 4*nth), then the rest one by
one; rows go in chunks (about 4 per thread, at least 8 rows, bounds rounded up to multiples
of 8) taken from a shared counter; each chunk runs the gemm on columns [0, M - M % 4) and the
gemv on each remaining column.

bankml keeps the GGUF row layout. A tile is up to 8 weight rows x C columns, laid out as ggml's
gemv lays it: the 8 rows are the 8 lanes of one accumulator per column. The block sums of the
8 rows against one column come from vpmaddubsw products (|w| <= 8, |a| <= 127: pairs within
2,032) reduced by a vphaddw tree; every partial sum is within |S| <= 32 x 8 x 127 = 32,512, so
the 16-bit sums are exact.
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, i32, i64, intrinsic
from bankml.backends.llvm.ggml.matmul.tiling import Tiler, register_tiler
from bankml.backends.llvm.emit.simd import at, block_loop, load_h, maddubs, psign, splat, v16i16, v32i8, zero8
from bankml.backends.llvm.emit.core import fma
from bankml.backends.llvm.ggml.matmul.legacy import alloc, col_d, prep, q4_0_values
from bankml.ir import order as fo
from bankml.quants import Q4_0

v8f32, v8i32 = ir.VectorType(f32, 8), ir.VectorType(i32, 8)


def row_sums_i16(b, vs):
    """Lane i = the sum of the 16 lanes of vs[i] (up to 8 <16 x i16> vectors; 0 for missing ones),
    exact when every partial sum fits in 16 bits: three vphaddw levels leave half h of vector i
    in lane 8h + i, then the halves add."""
    phadd = intrinsic(b.module, "llvm.x86.avx2.phadd.w", v16i16, [v16i16, v16i16])
    level = list(vs) + [ir.Constant(v16i16, [0] * 16)] * (8 - len(vs))
    while len(level) > 1:
        level = [b.call(phadd, [level[i], level[i + 1]]) for i in range(0, len(level), 2)]
    z = level[0]
    lo = b.shuffle_vector(z, z, ir.Constant(v8i32, list(range(8))))
    hi = b.shuffle_vector(z, z, ir.Constant(v8i32, list(range(8, 16))))
    return b.add(lo, hi)


def _shape(M: int, K: int) -> tuple[int, int]:
    """8 rows (one accumulator's lanes) x up to 4 columns."""
    return 8, min(M, 4)


def _q4_0_repack(b, K, wrows, cols):
    R, C = len(wrows), len(cols.x)

    def step(ib, accs):
        wb, xb = b.mul(ib, i64(18)), b.mul(ib, i64(34))
        wq = [q4_0_values(b, w, wb) for w in wrows]
        wabs = [psign(b, q, q) for q in wq]
        wd = zero8()
        for r, w in enumerate(wrows):
            wd = b.insert_element(wd, load_h(b, w, wb), i32(r))
        out = []
        for c, x in enumerate(cols.x):
            aq = b.load(at(b, x, b.add(xb, i64(2)), v32i8), align=1)
            tot = row_sums_i16(b, [maddubs(b, wabs[r], psign(b, aq, wq[r])) for r in range(R)])
            s = b.sitofp(b.sext(tot, v8i32), v8f32)
            out.append(fma(b, s, b.fmul(wd, splat(b, col_d(b, cols, ib, c))), accs[c]))
        return out

    accs = block_loop(b, K // 32, [zero8()] * C, step)
    return [[b.extract_element(accs[c], i32(r)) for c in range(C)] for r in range(R)]


register_tiler(Q4_0, fo.Q4_0_REPACK, Tiler(_shape, alloc(), prep(34), _q4_0_repack))
