"""Q1_0 x q8_0 mat-vec (one activation column) by table lookups, bit for bit ggml's float chain.

ggml_vec_dot_q1_0_q8_0 (AVX2) makes, per 32-value sub-block k of a 128-block and lane l, the
exact int32 sum s[k][l] of the four elements 4l..4l+3 (+a where the weight bit is set, -a
where it is clear), then per row and lane runs the float chain

    blk = r(ad0 * s0); blk = fma(adK, sK, blk) for K = 1..3; acc = fma(wd, blk, acc)

and folds acc with hsum8. Only the integer sums are made differently here; they are exact
integers, so any exact way gives the same bits.

A lane's four bits (a nibble of the weight row) pick one of 16 sign patterns. Per token, for
every (sub-block, lane), the 16 signed sums of its four activations are tabulated once
(build_tables, |t| <= 4 * 127 = 508), split into a low byte (t & 0xFF) and a signed high byte
(t >> 8, in -2..1). The tables are shared by every weight row: 16 rows run together, and one
vpshufb looks up 32 (row, lane) sums at once.

The rows keep the GGUF layout (no repacking). Pass 1, per 128-block: the 16 bytes of bits of
16 rows are transposed (three unpack stages and a vpermq) into 8 vectors, each holding one bit
byte of the 16 rows in its low 128-bit half and the next byte in its high half, and stored to
stack scratch with the rows' scales. A byte's low nibble is lane 2b of its sub-block, its high
nibble lane 2b+1, so a vector's nibbles give the lane pairs (0, 2), (1, 3), (4, 6), (5, 7) of
one sub-block: "combo" c = 0..3, the tables in the same layout. Pass 2 runs combo by combo over
all blocks (4 accumulators and 4 blk chains stay in registers): vpshufb of the low and of the
high bytes, vpunpck{l,h}bw to i16 (8 rows per half), vpmaddwd with (1, 0) or (0, 1) widens four
rows of each half to i32. So every float vector holds four rows' lanes (qa | qb) of one combo,
and the float chain above runs lane by lane in it. At the end, hsum8 = ((v0+v4)+(v2+v6)) +
((v1+v5)+(v3+v7)) is the vector sum of combos 0 and 2 (v0+v4 | v2+v6), combos 1 and 3, each
folded low half + high half. Pass 2 also prefetches the next 16 rows: a decode streams its
weights from DRAM.

The portable profile's Q1_0 mat-vec (backends/llvm/portable/q1_lut.py) shares the tables
(build_tables, its own layout, activation blocks and split), the transpose (transposed), the
lookups (lookup_bytes, nibbles) and scale_words.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.emit.core import f16, f32, for_range, i8, i16, i32, i64, intrinsic, prefetch_lines
from bankml.backends.llvm.emit.simd import at, block_loop, madd, scratch, splat, v16i16, v32i8, zero8
from bankml.backends.llvm.emit.core import fma

ROWS = 16                       # weight rows of one lookup tile
TABLE_BYTES = 4 * 2 * 32        # tables per 32-block: 4 combos x (low, high) x 32 bytes
COMBOS = [(0, 2), (1, 3), (4, 6), (5, 7)]      # (lane in the low half, lane in the high half)

v8i32, v8f32 = ir.VectorType(i32, 8), ir.VectorType(f32, 8)
v4f32 = ir.VectorType(f32, 4)


def typed_gep(b, base, offset, t):
    return b.bitcast(b.gep(base, [offset]), t.as_pointer())


def _mask(idx) -> ir.Constant:
    return ir.Constant(ir.VectorType(i32, len(idx)), [int(i) for i in idx])


# ---- the 16 x 16 byte transpose, with its byte labels simulated alongside ------------------

def unpack_idx(n: int, hi: bool) -> list[int]:
    """vpunpck{l,h}{bw,wd,dq} on a 256-bit vector of n elements: per 128-bit half, the low (or
    high) halves of x and y interleaved; indices into the concatenation x ++ y."""
    per, out = n // 2, []
    for half in range(2):
        for i in range(per // 2):
            e = half * per + (per // 2 if hi else 0) + i
            out += [e, n + e]
    return out


def _shuffle_bytes(b, x, y, width: int, idx: list[int]):
    t = ir.VectorType(ir.IntType(width), 256 // width)
    r = b.shuffle_vector(b.bitcast(x, t), b.bitcast(y, t), _mask(idx))
    return b.bitcast(r, v32i8)


def _simulate(x: np.ndarray, y: np.ndarray, width: int, idx: list[int]) -> np.ndarray:
    w = width // 8
    both = np.concatenate([x.reshape(-1, w), y.reshape(-1, w)])
    return both[idx].reshape(-1)


def _transpose_plan():
    """The unpack stages on labels row * 16 + byte; returns the byte j of the low half of each
    result vector and asserts that every vector holds bytes (j, j + 1) of rows 0..15 in order."""
    vecs = [np.concatenate([np.arange(16) + 16 * r, np.arange(16) + 16 * (r + 8)]) for r in range(8)]
    for width in (8, 16, 32):
        n = 256 // width
        vecs = [_simulate(vecs[i], vecs[i + 1], width, unpack_idx(n, hi)) for hi in (False, True)
                for i in range(0, 8, 2)]
    out = []
    for v in vecs:
        v = v.reshape(4, 8)[[0, 2, 1, 3]].reshape(-1)                      # vpermq 0, 2, 1, 3
        j = int(v[0] % 16)
        assert list(v[:16]) == [16 * r + j for r in range(16)], v
        assert list(v[16:]) == [16 * r + j + 1 for r in range(16)], v
        out.append(j)
    return out


_STAGES_BYTE = _transpose_plan()


def transposed(b, wrows, wb):
    """{j: vector} for j = 0, 2, ..., 14: bit byte j of rows 0..15 in the low half, byte j + 1
    in the high half (rows in order), from the 128-block at byte offset wb of each row."""
    v16 = ir.VectorType(i8, 16)
    vecs = []
    for r in range(8):
        lo = b.load(at(b, wrows[r], b.add(wb, i64(2)), v16), align=1)
        hi = b.load(at(b, wrows[r + 8], b.add(wb, i64(2)), v16), align=1)
        vecs.append(b.shuffle_vector(lo, hi, _mask(range(32))))
    for width in (8, 16, 32):
        n = 256 // width
        vecs = [_shuffle_bytes(b, vecs[i], vecs[i + 1], width, unpack_idx(n, hi)) for hi in (False, True)
                for i in range(0, 8, 2)]
    v4i64 = ir.VectorType(i64, 4)
    out = {}
    for j, v in zip(_STAGES_BYTE, vecs):
        q = b.bitcast(v, v4i64)
        out[j] = b.bitcast(b.shuffle_vector(q, ir.Constant(v4i64, ir.Undefined), _mask([0, 2, 1, 3])), v32i8)
    return out


# ---- tables (per token) ------------------------------------------------------------------

def _signs(i: int) -> list[int]:
    """Lane p (0..15) of a half: +1 where bit i of the pattern p is set, else -1."""
    return [1 if (p >> i) & 1 else -1 for p in range(16)]


def combo_major(b, K: int, c: int, kb):
    """Byte offset of the tables of combo c, 32-block kb (i64): [combo][K/32][low/high][32]
    (pass 2 here runs combo by combo)."""
    return b.add(i64(c * (K // 32) * 64), b.mul(kb, i64(64)))


def block_major(b, K: int, c: int, kb):
    """Byte offset of the tables of combo c, 32-block kb (i64): [K/32][combo][low/high][32]
    (the portable mat-vec reads a sub-block's four combos together)."""
    return b.add(b.mul(kb, i64(TABLE_BYTES)), i64(c * 64))


def build_tables(b, K: int, x, tbl, block_bytes: int = 34, codes_at: int = 2, layout=combo_major,
                 split: int = 8) -> None:
    """tbl at layout(K, c, kb): for combo c = (qa, qb) and 32-block kb, byte p of the low half
    is pattern p's sum t over lane qa (elements 4qa..4qa+3, +a where bit i of p is set, -a where
    clear), of the high half the same for lane qb; as two tables: t's low `split` bits (t & 0xFF
    for 8: the low byte) and t >> split (signed). The codes: 32 int8 at codes_at in each
    activation block of block_bytes (q8_0: 34, 2; pq8: 36, 0)."""
    v32i16 = ir.VectorType(i16, 32)
    signs = [ir.Constant(v32i16, _signs(i) * 2) for i in range(4)]
    shift = ir.Constant(v32i16, [split] * 32)
    low_bits = ir.Constant(v32i16, [(1 << split) - 1] * 32)
    with for_range(b, 0, K // 32, name="lut") as kb:
        a = b.sext(b.load(at(b, x, b.add(b.mul(kb, i64(block_bytes)), i64(codes_at)), v32i8), align=1), v32i16)
        for c, (qa, qb) in enumerate(COMBOS):
            t = None
            for i in range(4):
                ai = b.shuffle_vector(a, ir.Constant(v32i16, ir.Undefined), _mask([4 * qa + i] * 16 + [4 * qb + i] * 16))
                term = b.mul(ai, signs[i])
                t = term if t is None else b.add(t, term)
            base = layout(b, K, c, kb)
            b.store(b.trunc(t if split == 8 else b.and_(t, low_bits), v32i8), at(b, tbl, base, v32i8), align=32)
            b.store(b.trunc(b.ashr(t, shift), v32i8), at(b, tbl, b.add(base, i64(32)), v32i8), align=32)


# ---- the tile ----------------------------------------------------------------------------

_LO4 = ir.Constant(v32i8, [15] * 32)
_EVEN = ir.Constant(v16i16, [1, 0] * 8)
_ODD = ir.Constant(v16i16, [0, 1] * 8)
_ROWSETS = [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]   # rows of the 4 vectors


def lut_tile(b, K: int, wrows, x, d, tbl):
    """The 16 outputs of rows wrows (consecutive rows of the matrix) against the column whose
    tables are tbl and f32 scales d (d[kb]: f32(a.d) of 32-block kb). Returns [[value]] * 16."""
    assert len(wrows) == ROWS
    nblk = K // 128
    bits = scratch(b, v32i8, 8 * nblk, "lut.bits")          # [block][u * 4 + k]: transposed bit bytes
    wds = scratch(b, f32, 16 * nblk, "lut.wd")              # [block][16 rows, row sets in order]: f32(wd)
    with for_range(b, 0, nblk, name="lut.t") as ib:
        _transpose_block(b, wrows, ib, bits, wds)
    accs = []
    for c in range(4):
        accs += block_loop(b, nblk, [zero8()] * 4, lambda ib, acc: _combo_step(b, K, wrows, d, tbl, bits, wds, c, ib, acc))
    out = [None] * ROWS
    for s, rs in enumerate(_ROWSETS):
        sv, uv = b.fadd(accs[s], accs[8 + s]), b.fadd(accs[4 + s], accs[12 + s])   # combos 0+2, 1+3
        res = b.fadd(_fold(b, sv), _fold(b, uv))
        for i, r in enumerate(rs):
            out[r] = [b.extract_element(res, i32(i))]
    return out


def _fold(b, v):
    """Low half + high half of an 8-lane vector."""
    return b.fadd(b.shuffle_vector(v, v, _mask(range(4))), b.shuffle_vector(v, v, _mask(range(4, 8))))


def _transpose_block(b, wrows, ib, bits, wds) -> None:
    """Pass 1, block ib: the 16 rows' f16 scales as f32 (in row-set order, scale_words) and
    their bit bytes transposed, into scratch."""
    wb = b.mul(ib, i64(18))
    words = scale_words(b, wrows, wb, [r for rs in _ROWSETS for r in rs])
    scales = b.fpext(b.bitcast(words, ir.VectorType(f16, 16)), ir.VectorType(f32, 16))
    b.store(scales, typed_gep(b, wds, b.mul(ib, i64(16)), ir.VectorType(f32, 16)), align=4)
    byte = transposed(b, wrows, wb)
    for u in range(2):
        for k in range(4):
            b.store(byte[4 * k + 2 * u], b.gep(bits, [b.add(b.mul(ib, i64(8)), i64(4 * u + k))]), align=32)


def scale_words(b, wrows, wb, order):
    """<16 x i16>: lane i the f16 bits of the scale of row order[i]'s 128-block at byte offset
    wb (loaded as integers and packed in 4 i64, cheaper than 16 vpinsrw)."""
    v4i64 = ir.VectorType(i64, 4)
    packed = ir.Constant(v4i64, ir.Undefined)
    for q in range(4):
        word = None
        for j in range(4):
            h = b.zext(b.load(at(b, wrows[order[4 * q + j]], wb, i16), align=1), i64)
            h = b.shl(h, i64(16 * j)) if j else h
            word = h if word is None else b.or_(word, h)
        packed = b.insert_element(packed, word, i32(q))
    return b.bitcast(packed, v16i16)


def _combo_step(b, K, wrows, d, tbl, bits, wds, c, ib, acc):
    """Pass 2, combo c, block ib: the four sub-blocks' blk chains of the 4 row sets, then
    acc = fma(wd, blk, acc). Also prefetches the next 16 rows (16 * K/128 * 18 contiguous bytes,
    72 an iteration over the 4 * K/128 iterations of pass 2): the decode reads them from DRAM."""
    nblk = K // 128
    prefetch_lines(b, wrows[0], b.add(i64(ROWS * nblk * 18 + c * nblk * 72), b.mul(ib, i64(72))), 128, 1)
    u, n = divmod(c, 2)
    blk = [None] * 4
    for k in range(4):
        kb = b.add(b.mul(ib, i64(4)), i64(k))
        ad = splat(b, b.load(b.gep(d, [kb])))
        v = b.load(b.gep(bits, [b.add(b.mul(ib, i64(8)), i64(4 * u + k))]), align=32)
        for s, si in enumerate(_sums(b, tbl, combo_major(b, K, c, kb), nibbles(b, v, n))):
            f = b.sitofp(si, v8f32)
            blk[s] = b.fmul(ad, f) if k == 0 else fma(b, ad, f, blk[s])
    out = []
    for s in range(4):
        w4 = b.load(typed_gep(b, wds, b.add(b.mul(ib, i64(16)), i64(4 * s)), v4f32), align=4)
        out.append(fma(b, b.shuffle_vector(w4, w4, _mask([0, 1, 2, 3] * 2)), blk[s], acc[s]))
    return out


def _sums(b, tbl, base, idx):
    """The i32 sums of the 4 row sets, for nibbles idx (16 rows x lanes qa | qb) and the tables
    at byte offset base: lookup_words, then vpmaddwd with (1, 0) and (0, 1) to i32."""
    return [madd(b, w, k) for w in lookup_words(b, tbl, base, idx) for k in (_EVEN, _ODD)]


def lookup_words(b, tbl, base, idx):
    """The i16 sums of 16 rows x lanes (qa | qb) for nibbles idx and the tables at byte offset
    base: vpshufb of the low and of the high bytes, vpunpck{l,h}bw to i16. Two <16 x i16>: rows
    0..7 lane qa | rows 0..7 lane qb, then rows 8..15 the same."""
    low, high = lookup_bytes(b, tbl, base, idx)
    return [b.bitcast(b.shuffle_vector(low, high, _mask(unpack_idx(32, hi))), v16i16) for hi in (False, True)]


def lookup_bytes(b, tbl, base, idx):
    """vpshufb of the low and of the high table bytes at byte offset base for nibbles idx: two
    <32 x i8> of 16 rows x lanes (qa | qb)."""
    pshufb = intrinsic(b.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
    tl = b.load(at(b, tbl, base, v32i8), align=32)
    th = b.load(at(b, tbl, b.add(base, i64(32)), v32i8), align=32)
    return b.call(pshufb, [tl, idx]), b.call(pshufb, [th, idx])


def nibbles(b, v, high: bool):
    """The low (or high) nibbles of the bytes of v: table indices."""
    if high:
        v = b.bitcast(b.lshr(b.bitcast(v, v16i16), ir.Constant(v16i16, [4] * 16)), v32i8)
    return b.and_(v, _LO4)
