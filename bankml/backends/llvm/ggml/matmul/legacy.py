"""Q4_0, Q5_0 and Q5_1 weights against q8_0 / q8_1 activations: the ggml vec_dots, as register tiles, and get_rows.

Float steps per (row, column) pair, exactly as backends/reference/matmul.py:
- Q4_0 (ggml_vec_dot_q4_0_q8_0 = tinyBLAS_Q0_AVX) and Q5_0 (ggml_vec_dot_q5_0_q8_0 = tinyBLAS_Q0_AVX):
  per 32-block acc = fma(r(wd*ad), float(s), acc), hsum8(acc); s holds the lane sums of the
  signed weights (nibble - 8, or code - 16) times the q8 activations (mul_sum_i8_pairs: psign
  then vpmaddubsw, never saturating: |w| <= 16, |a| <= 127).
- Q5_1 (ggml_vec_dot_q5_1_q8_1): the Q4_1 chain with s = code (0..31) x q8:
  acc = fma(r(wd*ad), float(s), acc), summs = fma(wm, as, summs); result r(hsum8(acc) + summs).
Codes are made in element order: element j < 16 from the low nibble of qs[j], j + 16 from its
high nibble, the fifth bit (Q5) from bit j of qh. Q4_0 matrices of 8k rows never come here:
ggml repacks them (backends/llvm/ggml/matmul/repack.py).
The tiles are ggml.matmul.quant's dot_q0 (Q4_0, Q5_0: the Q8_0 chain) and dot_q1 (Q5_1: the Q4_1
chain) over these values, with its column tiles (prep: the activation's f16 scales as f32
scratch [block][column]) and its per-chunk f32 weight scales.

GET_ROWS elements (ggml-base's to_float, ggml-quants.c, no FMA): element k of a 32-block is the
low (k < 16) or high (k >= 16) nibble of qs[k % 16]; Q5 types add bit k of qh as the fifth bit.
    Q4_0: r((float)(nibble - 8) * d)      Q5_0: r((float)(code - 16) * d)      Q5_1: r(r(code * d) + m)
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, i1, i8, i32, i64
from bankml.backends.llvm.ggml.matmul.tiling import Tiler, register_tiler
from bankml.backends.llvm.emit.simd import at, load_h, nibbles, v32i8
from bankml.backends.llvm.ggml.matmul.quant import (_alloc as alloc, _chunk_wd as chunk_wd, _prep as prep, _shape,
    dot_q0, dot_q1, wide_q0)
from bankml.backends.llvm.ggml.rows import row_element
from bankml.ir import order as fo
from bankml.quants import Q4_0, Q5_0, Q5_1


def col_d(b, cols, kb, c):
    """f32(a.d) of column c's 32-block kb (a scalar)."""
    return b.load(b.gep(cols.d, [b.add(b.mul(kb, i64(len(cols.x))), i64(c))]))


def fifth_bits(b, w, off):
    """16 in byte j where bit j of the u32 qh at w + off is set, else 0."""
    bits = b.bitcast(b.load(at(b, w, off, i32), align=1), ir.VectorType(i1, 32))
    return b.select(bits, ir.Constant(v32i8, [16] * 32), ir.Constant(v32i8, [0] * 32))


def q4_0_values(b, w, wb):
    """nibble - 8 (-8..7) of the Q4_0 block at w + wb (d at 0, qs at 2)."""
    return b.sub(nibbles(b, w, b.add(wb, i64(2))), ir.Constant(v32i8, [8] * 32))


def q5_0_values(b, w, wb):
    """code - 16 (-16..15) of the Q5_0 block at w + wb (d at 0, qh at 2, qs at 6)."""
    code = b.or_(nibbles(b, w, b.add(wb, i64(6))), fifth_bits(b, w, b.add(wb, i64(2))))
    return b.sub(code, ir.Constant(v32i8, [16] * 32))


def q5_1_codes(b, w, wb):
    """code (0..31) of the Q5_1 block at w + wb (d at 0, m at 2, qh at 4, qs at 8)."""
    return b.or_(nibbles(b, w, b.add(wb, i64(8))), fifth_bits(b, w, b.add(wb, i64(4))))


register_tiler(Q4_0, fo.Q4_0_DOT, Tiler(_shape, alloc(), prep(34), dot_q0(18, q4_0_values), chunk_wd(18, q4_0_values),
                                    wide=wide_q0(18, q4_0_values)))
register_tiler(Q5_0, fo.Q5_0_DOT, Tiler(_shape, alloc(), prep(34), dot_q0(22, q5_0_values), chunk_wd(22, q5_0_values),
                                    wide=wide_q0(22, q5_0_values)))
register_tiler(Q5_1, fo.Q5_1_DOT, Tiler(_shape, alloc(with_s=True), prep(36), dot_q1(24, q5_1_codes),
                                    chunk_wd(24, q5_1_codes)))


# ---- GET_ROWS: element j of a Q4_0 / Q5_0 / Q5_1 row ----------------------------------------------

def _nibble(b, row, qs, k):
    """Nibble k (0..31) of the 16 bytes at row + qs, as i32."""
    byte = b.load(at(b, row, b.add(qs, b.srem(k, i64(16))), i8))
    sh = b.trunc(b.mul(b.sdiv(k, i64(16)), i64(4)), i8)
    return b.zext(b.and_(b.lshr(byte, sh), i8(15)), i32)


def _code5(b, row, qh, qs, k):
    """The 5-bit code of element k: nibble | (bit k of the u32 at row + qh) << 4, as i32."""
    bits = b.load(at(b, row, qh, i32), align=1)
    high = b.and_(b.lshr(bits, b.trunc(k, i32)), i32(1))
    return b.or_(_nibble(b, row, qs, k), b.shl(high, i32(4)))


def _block(b, j, block_bytes):
    return b.mul(b.sdiv(j, i64(32)), i64(block_bytes)), b.srem(j, i64(32))


@row_element(Q4_0)
def q4_0_element(b, row, j):
    base, k = _block(b, j, 18)
    q = b.sub(_nibble(b, row, b.add(base, i64(2)), k), i32(8))
    return b.fmul(b.sitofp(q, f32), load_h(b, row, base))


@row_element(Q5_0)
def q5_0_element(b, row, j):
    base, k = _block(b, j, 22)
    q = b.sub(_code5(b, row, b.add(base, i64(2)), b.add(base, i64(6)), k), i32(16))
    return b.fmul(b.sitofp(q, f32), load_h(b, row, base))


@row_element(Q5_1)
def q5_1_element(b, row, j):
    base, k = _block(b, j, 24)
    q = _code5(b, row, b.add(base, i64(4)), b.add(base, i64(8)), k)
    return b.fadd(b.fmul(b.sitofp(q, f32), load_h(b, row, base)), load_h(b, row, b.add(base, i64(2))))
