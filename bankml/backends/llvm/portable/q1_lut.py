"""The portable profile's Q1_0 mat-vec (one column, decode) by table lookups: 16 weight rows'
group results at once, the spec's bits (bankml/profiles/portable/quant.py: mul_mat) by the f64
argument of backends/llvm/portable/f64.py.

A Q1_0 sub-block's dot with the pq8 codes is the same kind of exact integer as in ggml's Q1_0
path: per lane l (elements 4l..4l+3) the signed sum t of four codes picked by a nibble of the
weight bits. So the tables, transpose and lookups are ggml.matmul.q1_lut's: per column, once
per call, the 16 signed sums of each 4 codes (build_tables over the pq8 blocks, sub-block major:
a sub-block's four combos together, block_major), each as t & 31 and t >> 5 (|t| <= 508: -16..15);
per 128-block of 16 rows the bit bytes transposed in registers (transposed), and per sub-block k
and combo c one vpshufb of each table gives 32 (row, lane) parts (lookup_bytes).

Per 128-block (four sub-blocks) and row: the four combos' parts added as bytes (low parts at
most 4 * 31, high parts -64..60: no overflow), then one vpmaddubsw by (1, 32) makes the i16 lane
sums, the lane halves folded, so a <16 x i16> holds the 16 rows' dot_k (|dot| <= 8 * 508 < 2^15);
then I = sum_k dot_k * cmul_k in i32, cmul_k = am_k << (ae_k - aemin) (Cols.cmul; |I| < 2^31
while the group's activation spread is at most portable.f64.I32_SPREAD), exactly the integer
portable.f64.q1_0_blocks4 makes. Per group (two blocks; a last group of one) and row the f64
terms I * d * 2^aemin, exact, their f64 sum exact while the row's two scales' exponent spread
plus the activation spread is within portable.f64.limit, rounded once by the f64 -> f32
conversion. A row whose group is not proved so (spread past the limit or I32_SPREAD, an inf or
NaN scale, a bad activation block, a nonzero result below 2^-126) is the caller's exact path's:
group16 returns the rows' results and a 16-lane ok mask. Also prefetches the next 16 rows.
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.portable import f64 as pf
from bankml.backends.llvm.emit.core import f16, f32, f64, i8, i16, i32, i64, intrinsic, prefetch_lines
from bankml.backends.llvm.emit.simd import maddubs
from bankml.backends.llvm.ggml.matmul.q1_lut import (ROWS, block_major, build_tables, lookup_bytes, nibbles,
    scale_words, transposed, unpack_idx)
from bankml.backends.llvm.portable.rows import BLOCK_BYTES, TERM_BITS, splat_v, vconst
from bankml.quants import Q1_0

TABLE_BYTES_PER_32 = 256        # four combos x (low, high) x 32 bytes
v16i16, v16i32 = ir.VectorType(i16, 16), ir.VectorType(i32, 16)
v16f32, v16f64 = ir.VectorType(f32, 16), ir.VectorType(f64, 16)
_ROWS_IN_ORDER = list(range(ROWS))
_FOLD = [list(range(0, 8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32))]
SPLIT = 5                       # table bytes t & 31 and t >> 5: four of each add up within an int8
_WEIGHTS = ir.Constant(ir.VectorType(i8, 32), [1, 1 << SPLIT] * 16)          # vpmaddubsw: low + 32 * high
_INTERLEAVE = [unpack_idx(32, hi) for hi in (False, True)]   # vpunpck{l,h}bw of low and high parts


def tables(b, K: int, x, tbl) -> None:
    """The lookup tables of the pq8 column x (K codes) into tbl (K/32 * 256 bytes): each sum t
    as t & 31 and t >> 5 (SPLIT)."""
    build_tables(b, K, x, tbl, block_bytes=BLOCK_BYTES, codes_at=0, layout=block_major, split=SPLIT)


def block_sums(b, K: int, wrows, ib, cols):
    """<16 x i32>: per row, the 128-block ib's I = sum_k dot_k * cmul_k (see the module)."""
    byte = transposed(b, wrows, b.mul(ib, i64(18)))
    total = None
    for k in range(4):
        kb = b.add(b.mul(ib, i64(4)), i64(k))
        lo = hi = None
        for c in range(4):
            idx = nibbles(b, byte[4 * k + 2 * (c // 2)], c % 2 == 1)
            low, high = lookup_bytes(b, cols.lut, block_major(b, K, c, kb), idx)
            lo, hi = (low, high) if lo is None else (b.add(lo, low), b.add(hi, high))
        words = [maddubs(b, _WEIGHTS, b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(i32, 32), m)))
                 for m in _INTERLEAVE]
        dots = b.add(b.shuffle_vector(words[0], words[1], ir.Constant(ir.VectorType(i32, 16), _FOLD[0])),
                     b.shuffle_vector(words[0], words[1], ir.Constant(ir.VectorType(i32, 16), _FOLD[1])))
        cm = splat_v(b, b.load(b.gep(cols.cmul, [kb])), 16)
        term = b.mul(b.sext(dots, v16i32), cm)
        total = term if total is None else b.add(total, term)
    return total


def _prefetch(b, wrows, K: int, ib):
    """The next 16 rows' bytes (16 * K/128 * 18 from the tile's start), 288 a block: the decode
    streams its weights from DRAM."""
    prefetch_lines(b, wrows[0], b.add(i64(ROWS * (K // 128) * 18), b.mul(ib, i64(ROWS * 18))), ROWS * 18, 1)


def group16(b, K: int, wrows: list, gi, nblk: int, cols):
    """The group gi (nblk 128-blocks: 2, or 1 for a last group of four sub-blocks) of 16
    consecutive weight rows against one column: (<16 x f32> the rounded results, <16 x i1>
    whether each is the spec's; else the caller's exact path gives it)."""
    aemin = cols.per_group(b, cols.aemin, 0, gi)
    scale = splat_v(b, pf.pow2(b, aemin), 16)
    t, es = None, []
    for blk in range(nblk):
        ib = b.add(b.mul(gi, i64(2)), i64(blk))
        _prefetch(b, wrows, K, ib)
        words = scale_words(b, wrows, b.mul(ib, i64(18)), _ROWS_IN_ORDER)
        d = b.fpext(b.bitcast(words, ir.VectorType(f16, 16)), v16f64)
        term = b.fmul(b.sitofp(block_sums(b, K, wrows, ib, cols), v16f64), b.fmul(d, scale))
        t = term if t is None else b.fadd(t, term)
        es.append(pf.minmax(b, "umax", b.and_(words, vconst(v16i16, 0x7C00)), vconst(v16i16, 0x0400)))
    lo, hi = es[0], es[0]
    if nblk == 2:
        lo, hi = pf.minmax(b, "umin", es[0], es[1]), pf.minmax(b, "umax", es[0], es[1])
    aspread = cols.per_group(b, cols.aspread, 0, gi)
    column_ok = b.and_(b.icmp_unsigned("==", cols.per_group(b, cols.gbad, 0, gi), i32(0)),
                       b.icmp_signed("<=", aspread, i32(pf.I32_SPREAD)))
    spread = b.add(b.zext(b.lshr(b.sub(hi, lo), vconst(v16i16, 10)), v16i32), splat_v(b, aspread, 16))
    ok = b.and_(b.icmp_unsigned("!=", hi, vconst(v16i16, 0x7C00)),
                b.icmp_signed("<=", spread, vconst(v16i32, pf.limit(TERM_BITS[Q1_0], 8))))
    a = b.call(intrinsic(b.module, "llvm.fabs.v16f64", v16f64, [v16f64]), [t])
    tiny = b.and_(b.fcmp_ordered("<", a, vconst(v16f64, pf.TINY)), b.fcmp_ordered("!=", a, vconst(v16f64, 0.0)))
    ok = b.and_(b.and_(ok, b.not_(tiny)), splat_v(b, column_ok, 16))
    return b.fadd(b.fptrunc(t, v16f32), vconst(v16f32, 0.0)), ok


def all_lanes(b, ok):
    """i1: every lane of the <16 x i1> ok is set."""
    return b.icmp_unsigned("==", b.bitcast(ok, i16), i16(0xFFFF))

