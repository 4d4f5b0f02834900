"""GET_ROWS elements of Q4_0, Q5_0 and Q5_1 weights: ggml-base's to_float (ggml-quants.c, no FMA).

Element k of a 32-block: the nibble is the low (k < 16) or high (k >= 16) half of qs[k % 16];
Q5 types add bit k of qh as the fifth bit.
    Q4_0: r((float)(nibble - 8) * d)      Q5_0: r((float)(code - 16) * d)      Q5_1: r(r(code * d) + m)
"""
from __future__ import annotations

from bankml.backends.llvm.emit.core import f32, i8, i32, i64
from bankml.backends.llvm.emit.simd import at, load_h
from bankml.backends.llvm.ggml.rows import row_element
from bankml.quants import Q4_0, Q5_0, Q5_1


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
def q4_0(b, row, j):
    base, k = _block(b, j, 18)
    q = b.sub(_nibble(b, row, b.add(base, i64(2)), k), i32(8))
    return b.fmul(b.sitofp(q, f32), load_h(b, row, base))


@row_element(Q5_0)
def q5_0(b, row, j):
    base, k = _block(b, j, 22)
    q = b.sub(_code5(b, row, b.add(base, i64(2)), b.add(base, i64(6)), k), i32(16))
    return b.fmul(b.sitofp(q, f32), load_h(b, row, base))


@row_element(Q5_1)
def q5_1(b, row, j):
    base, k = _block(b, j, 24)
    q = _code5(b, row, b.add(base, i64(4)), b.add(base, i64(8)), k)
    return b.fadd(b.fmul(b.sitofp(q, f32), load_h(b, row, base)), load_h(b, row, b.add(base, i64(2))))
