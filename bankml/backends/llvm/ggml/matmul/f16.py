"""F16 weights (activation rounded to f16 by QUANTIZE): the two ggml paths, as register tiles.

- F16_TINYBLAS (llamafile tinyBLAS<8,__m256>::gemm_bloc, >= 2 columns): one 8-lane accumulator
  per output, acc = fma(A[l..l+8], B[l..l+8], acc) for l = 0, 8, ..; a K % 8 tail with zero-
  filled lanes; C = hsum8(acc). Tiles of 4 rows x 3 columns, as tinyBLAS's mnpack<4,3>.
- F16_VEC_DOT (ggml_vec_dot_f16, 1 column or rows % 4 != 0): four 8-lane accumulators over
  K & ~31, GGML_F32x8_REDUCE, leftovers added in f64. One row at a time (interleaved rows
  stream measurably slower).
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, f64, i32, i64, v8f32
from bankml.backends.llvm.ggml.matmul.tiling import Tiler, register_tiler, plain_cols
from bankml.backends.llvm.emit.simd import at, block_loop, f32x8_reduce, hsums, load_h, v8f16, zero8
from bankml.backends.llvm.emit.core import fma
from bankml.ir import order as fo
from bankml.quants import F16


def _load8(b, row, elem):
    return b.fpext(b.load(at(b, row, b.mul(elem, i64(2)), v8f16), align=1), v8f32)


def _tail8(b, row, start, K):
    """8 lanes from element start with the ones at K or past it zero (tinyBLAS's masked load)."""
    v = ir.Constant(v8f32, [0.0] * 8)
    for i in range(K - start):
        v = b.insert_element(v, load_h(b, row, i64(2 * (start + i))), i32(i))
    return v


def _tinyblas(b, K, wrows, xrows):
    R, C = len(wrows), len(xrows)

    def step(ib, accs):
        e = b.mul(ib, i64(8))
        wv = [_load8(b, w, e) for w in wrows]
        xv = [_load8(b, x, e) for x in xrows]
        return [fma(b, wv[r], xv[c], accs[r * C + c]) for r in range(R) for c in range(C)]

    accs = block_loop(b, K // 8, [zero8()] * (R * C), step)
    if K % 8:
        wv = [_tail8(b, w, K - K % 8, K) for w in wrows]
        xv = [_tail8(b, x, K - K % 8, K) for x in xrows]
        accs = [fma(b, wv[r], xv[c], accs[r * C + c]) for r in range(R) for c in range(C)]
    h = hsums(b, accs)
    return [h[r * C:(r + 1) * C] for r in range(R)]


def _vec_dot(b, K, wrows, xrows):
    R, C = len(wrows), len(xrows)

    def step(ib, accs):
        e = b.mul(ib, i64(32))
        xv = [[_load8(b, x, b.add(e, i64(8 * j))) for j in range(4)] for x in xrows]
        out = []
        for w in wrows:
            wv = [_load8(b, w, b.add(e, i64(8 * j))) for j in range(4)]
            for c in range(C):
                out += [fma(b, xv[c][j], wv[j], accs[len(out) + j]) for j in range(4)]
        return out

    accs = block_loop(b, K // 32, [zero8()] * (4 * R * C), step)
    res = []
    for r, w in enumerate(wrows):
        row = []
        for c, x in enumerate(xrows):
            s = f32x8_reduce(b, accs[4 * (r * C + c):4 * (r * C + c) + 4])
            if K % 32:
                tot = b.fpext(s, f64)
                for k in range(K - K % 32, K):
                    p = b.fmul(load_h(b, x, i64(2 * k)), load_h(b, w, i64(2 * k)))
                    tot = b.fadd(tot, b.fpext(p, f64))
                s = b.fptrunc(tot, f32)
            row.append(s)
        res.append(row)
    return res


register_tiler(F16, fo.F16_TINYBLAS, Tiler(shape=lambda M, K: (4, 3), alloc=lambda b, K, C: None, prep=plain_cols,
                                       tile=_tinyblas))
register_tiler(F16, fo.F16_VEC_DOT, Tiler(shape=lambda M, K: (1, 1), alloc=lambda b, K, C: None, prep=plain_cols,
                                      tile=_vec_dot))
