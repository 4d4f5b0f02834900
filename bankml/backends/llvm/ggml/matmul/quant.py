"""Quantized weights against q8_0 / q8_1 activations: the ggml vec_dots, as register tiles.

Float steps per (row, column) pair, exactly as backends/reference/matmul.py:
- Q8_0 (ggml_vec_dot_q8_0_q8_0 = tinyBLAS_Q0_AVX): per 32-block acc = fma(r(wd*ad), float(s), acc);
  hsum8(acc).
- Q4_1 (ggml_vec_dot_q4_1_q8_1): the same with s = nibble x q8, plus the scalar chain
  summs = fma(wm, as, summs); result r(hsum8(acc) + summs).
- Q1_0 (ggml_vec_dot_q1_0_q8_0, AVX2): per 128-block blk = r(a0.d*s0), blk = fma(aK.d, sK, blk)
  for K = 1..3, acc = fma(wd, blk, acc); hsum8(acc).
- Q2_0 (ggml_vec_dot_q2_0_q8_0_generic: scalar, GCC-contracted): per 64-block sumi = 0;
  sumi = fma(float(is), ad, sumi) for its two 32-halves; sumf = fma(wd, sumi, sumf).
  The integer sums `is` are exact, so they are made in any order: codes are unpacked in a
  permuted order (one variable shift), the activation is permuted to match once per column
  tile, is = sum(q*a) - sum(a) reduces eight pairs at once (vphaddw tree), and the scalar
  float steps of the eight pairs run side by side in the lanes of one vector.
Per column tile, prep converts the activation's f16 scales to f32 scratch [block][column]. The
Q8_0 chain (dot_q0: Q8_0, Q4_0, Q5_0) and the Q4_1 chain (dot_q1: Q4_1, Q5_1): where rows run in
chunks, the chunk's weight scales are converted to f32 once (_chunk_wd), and Q4_0, Q5_0 and Q5_1
unpack the chunk's values once too; a tile of several columns makes its products r(wd*ad) into
scratch first (_products), and the eight hsum8 of a 1 x 8 tile run as vector adds (hsum8_x8). A
prompt's kernels of the Q8_0 chain (Tiler.wide, from WIDE_COLS columns: wide_q0) widen the chunk's
values and each column tile's quants to int16 once (widen_pairs), and make each lane sum with two
vpmaddwd and a vpaddd: 4 instead of 5 uops on the multiply ports per block product (pp512 of a
Q8_0 Qwen3.5-0.8B 1.15 -> 1.22x llama.cpp). A one-column Q4_1/Q5_1 tile (decode) takes a block's d
and m from one vcvtph2ps of its 4-byte head (_head: d in lane 0, m in lane 1) and runs the summs
chain in lane 1 of a vector, so no scalar conversion or shuffle waits on port 5. Q1_0 against
several columns (and a thread's last rows) expands its bits as ggml's AVX2 vec_dot does
(q1_0_neg_signs, q1_0_sums); against one column (decode), 16 rows at a time take their integer
sums from per-token lookup tables (backends/llvm/ggml/matmul/q1_lut.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from bankml.backends.llvm.emit.core import f16, f32, for_range, i8, i32, i64, intrinsic
from bankml.backends.llvm.ggml.matmul.tiling import Tiler, register_tiler
from bankml.backends.llvm.emit.simd import (at, block_loop, hsums, lanes, load_h, madd, maddubs, nibbles, psign,
    scratch, splat, sums_us8, v16i16, v32i8, zero8)
from bankml.backends.llvm.emit.core import fma
from bankml.backends.llvm.ggml.matmul.q1_lut import ROWS as LUT_ROWS, TABLE_BYTES, build_tables, lut_tile
from bankml.ir import order as fo
from bankml.quants import Q1_0, Q2_0, Q4_1, Q8_0

ONES = ir.Constant(v32i8, [1] * 32)
V4F32 = ir.VectorType(f32, 4)


@dataclass
class Cols:
    """One column tile: activation rows, and per 32-block of each column its f32 scales."""
    x: list              # C activation row pointers (i8*)
    d: object            # f32* [K/32][C]: f32(a.d)
    s: object = None     # f32* [K/32][C]: f32(a.s) (q8_1)
    asum: object = None  # i32* [K/32][C]: sum of the block's 32 quants (Q2_0)
    aq: object = None    # i8* [K/32][C][32]: the quants, permuted as Q2_0 codes unpack (Q2_0)
    lut: object = None   # i8* [K/32][TABLE_BYTES]: the one column's lookup tables (Q1_0, C = 1)
    wd: tuple = None     # (w0, f32* [rows][K/32]): f32(wd) of the chunk's rows from w0 (_chunk_wd)
    wq: object = None    # i8* [rows][K]: the chunk's weight values, unpacked once (_chunk_wd with values)
    w16: object = None   # <16 x i16>* [rows][K/32][2]: the chunk's signed values as widen_pairs (wide)
    a16: object = None   # <16 x i16>* [K/32][C][2]: the columns' quants as widen_pairs (with w16)


def _shape(M: int, K: int) -> tuple[int, int]:
    """Tiles of up to 8 columns, one row (several interleaved weight rows stream slower here)."""
    return 1, min(M, 8)


def _shape_q1_0(M: int, K: int) -> tuple[int, int]:
    """One column: 16 rows by table lookups (backends/llvm/ggml/matmul/q1_lut.py); several: 1 row x 8."""
    return (LUT_ROWS, 1) if M == 1 else (1, min(M, 8))


def _shape_q2_0(M: int, K: int) -> tuple[int, int]:
    """Q2_0 fills the 8 lanes of its float vector with pairs: 8 // M rows for small M."""
    return (max(1, 8 // M), M) if M < 8 else (1, 8)


def _shape_wide(M: int, K: int) -> tuple[int, int]:
    """The wide tiles (widen_pairs): 1 row x 8 columns while the 8 columns' widened quants (K/32
    x 8 x 64 bytes) stay within 32 KB of L1, else 2 rows x 4 columns."""
    C = 8 if K <= 2048 else 4
    return (8 // C, C) if M >= C else (1, M)


def _alloc(with_s=False, q2=False, lut=False, wide=False):
    def alloc(b, K, C):
        nb = K // 32 * C
        return {"d": scratch(b, f32, nb, "act.d"), "s": scratch(b, f32, nb, "act.s") if with_s else None,
                "asum": scratch(b, i32, nb, "act.sum") if q2 else None,
                "aq": scratch(b, i8, 32 * nb, "act.q") if q2 else None,
                "lut": scratch(b, i8, K // 32 * TABLE_BYTES, "act.lut") if lut else None,
                "a16": scratch(b, v16i16, 2 * nb, "act.q16") if wide else None}
    return alloc


PAIR_A = [4 * (j // 2) + j % 2 for j in range(16)]     # elements 4l, 4l+1 of a block, l = 0..7
PAIR_B = [e + 2 for e in PAIR_A]                      # elements 4l+2, 4l+3


def widen_pairs(b, v):
    """(A, B), two <16 x i16>: the 32 signed bytes of v sign-extended, A holding elements 4l and
    4l+1 in its lanes 2l, 2l+1 and B elements 4l+2, 4l+3. madd(A, A') + madd(B, B') of two blocks so
    widened is, in lane l, the exact sum over elements 4l..4l+3 of their products: ggml's
    mul_sum_i8_pairs lane sums (exact integers, so any way of making them gives its bits) by two
    vpmaddwd and a vpaddd, where its vpsignb, vpsignb, vpmaddubsw, vpmaddwd take four uops of
    the two ports that also run vcvtdq2ps and vfmadd."""
    return [b.sext(lanes(b, v, idx), v16i16) for idx in (PAIR_A, PAIR_B)]


def typed_gep(b, base, offset, t):
    return b.bitcast(b.gep(base, [offset]), t.as_pointer())


_PERM = [4 * (j % 8) + j // 8 for j in range(32)]      # Q2_0 code order: byte 8p+i is element 4i+p


def _prep(bb: int):
    """Fill the scratch of a column tile from activation blocks of bb bytes (34: q8_0, 36: q8_1)."""
    def prep(b, K, xrows, scr):
        C = len(xrows)
        cols = Cols(xrows, scr["d"], scr["s"], scr["asum"], scr["aq"], scr["lut"] if C == 1 else None, scr.get("wd"),
                    scr.get("wq"), scr.get("w16"), scr["a16"] if scr.get("w16") else None)
        with for_range(b, 0, K // 32, name="prep") as kb:
            for c, x in enumerate(xrows):
                xo = b.mul(kb, i64(bb))
                slot = b.add(b.mul(kb, i64(C)), i64(c))
                b.store(load_h(b, x, xo), b.gep(cols.d, [slot]))
                if cols.s is not None:
                    b.store(load_h(b, x, b.add(xo, i64(2))), b.gep(cols.s, [slot]))
                q = b.load(at(b, x, b.add(xo, i64(bb - 32)), v32i8), align=1)     # the block's quants
                if cols.a16 is not None:
                    for h, v in enumerate(widen_pairs(b, q)):
                        b.store(v, b.gep(cols.a16, [b.add(b.mul(slot, i64(2)), i64(h))]), align=32)
                if cols.aq is not None:
                    qp = lanes(b, q, _PERM)
                    b.store(qp, typed_gep(b, cols.aq, b.mul(slot, i64(32)), v32i8), align=32)
                    vsum = intrinsic(b.module, "llvm.vector.reduce.add.v32i32", i32, [ir.VectorType(i32, 32)])
                    b.store(b.call(vsum, [b.sext(q, ir.VectorType(i32, 32))]), b.gep(cols.asum, [slot]))
        if cols.lut is not None:
            build_tables(b, K, xrows[0], cols.lut)
        return cols
    return prep


def _chunk_wd(wbb: int, values=None, wide=False):
    """Tiler.chunk of the dot_q0 / dot_q1 tiles: the f32 scales of the chunk's weight blocks (wbb
    bytes, f16 scale first), converted once for all its column tiles. Rows are contiguous whole blocks, so
    block j of the chunk is at w0 + j * wbb. With values (packed types: Q4_0, Q5_0, Q4_1, Q5_1),
    each block's 32 values(b, w0, j * wbb) are unpacked once too, into scratch [block][32]: the
    column tiles then load them as Q8_0's tiles load their quants. wide (wide_q0: Q8_0, Q4_0,
    Q5_0): the signed values as widen_pairs instead, scratch [block][2] of <16 x i16>."""
    def chunk(b, K, w0, n, n_max, scr):
        wd = scratch(b, f32, n_max * (K // 32), "chunk.wd")
        wq = scratch(b, v32i8, n_max * (K // 32), "chunk.wq") if values and not wide else None
        w16 = scratch(b, v16i16, 2 * n_max * (K // 32), "chunk.w16") if wide else None
        with for_range(b, 0, b.mul(n, i64(K // 32)), name="wd") as j:
            b.store(load_h(b, w0, b.mul(j, i64(wbb))), b.gep(wd, [j]))
            if wide:
                for h, v in enumerate(widen_pairs(b, values(b, w0, b.mul(j, i64(wbb))))):
                    b.store(v, b.gep(w16, [b.add(b.mul(j, i64(2)), i64(h))]), align=32)
            elif values:
                b.store(values(b, w0, b.mul(j, i64(wbb))), b.gep(wq, [j]), align=32)
        scr["wd"] = (w0, wd)
        if wq is not None:
            scr["wq"] = wq
        if wide:
            scr["w16"] = w16
    return chunk


def _block_of(b, cols, w, wbb: int):
    """Index of row w's first block in the chunk's scratch (rows of whole wbb-byte blocks from w0)."""
    return b.udiv(b.sub(b.ptrtoint(w, i64), b.ptrtoint(cols.wd[0], i64)), i64(wbb))


def _values_of(b, cols, wrows, wbb: int, values):
    """get(w_index, wb, kb): the 32 values of row wrows[w_index]'s block kb (at byte wb): from the
    chunk's unpacked scratch when there is one, else unpacked in place."""
    if cols.wq is None:
        return lambda r, wb, kb: values(b, wrows[r], wb)
    first = [_block_of(b, cols, w, wbb) for w in wrows]
    return lambda r, wb, kb: b.load(b.gep(cols.wq, [b.add(first[r], kb)]), align=32)


def _head(b, w, wb):
    """<4 x f32>: the first four f16 of the block at w + wb (d, m, then code bytes: Q4_1, Q5_1) in
    one vcvtph2ps from memory: a one-column tile's two scales without a scalar conversion each
    (vpinsrw and vcvtph2ps take the shuffle port a decode step is short of)."""
    return b.fpext(b.load(at(b, w, wb, ir.VectorType(f16, 4)), align=1), V4F32)


def _col_d(b, cols, kb, c):
    """splat(f32(a.d)) of column c's 32-block kb."""
    C = len(cols.x)
    return splat(b, b.load(b.gep(cols.d, [b.add(b.mul(kb, i64(C)), i64(c))])))


def _finish(b, R, C, accs):
    h = hsums(b, accs)
    return [h[r * C:(r + 1) * C] for r in range(R)]


def _products(b, K, wrows, cols, wbb: int):
    """get(kb, r, c): splat of the f32 product r(wd * ad) of block kb, row r, column c (weight
    blocks of wbb bytes, their f16 scale first). Several columns: all products of the tile are
    made first, one vmulps per (block, row) for the C columns, into scratch [K/32][R][C], and get
    is a broadcast load (a load, not a vector op, in the fma loop). One column: made in place."""
    R, C = len(wrows), len(cols.x)
    if C == 1:
        return lambda kb, r, c: b.fmul(splat(b, load_h(b, wrows[r], b.mul(kb, i64(wbb)))),
                                       splat(b, b.load(b.gep(cols.d, [kb]))))
    vc = ir.VectorType(f32, C)
    dwp = scratch(b, f32, K // 32 * R * C, "tile.dw")
    if cols.wd is not None:         # the f32 scales from _chunk_wd: row r's blocks from first[r]
        w0, wd32 = cols.wd
        first = [_block_of(b, cols, w, wbb) for w in wrows]
    with for_range(b, 0, K // 32, name="dw") as kb:
        ad = b.load(typed_gep(b, cols.d, b.mul(kb, i64(C)), vc), align=4)
        for r, w in enumerate(wrows):
            if cols.wd is not None:
                wd = splat(b, b.load(b.gep(wd32, [b.add(first[r], kb)])), C)
            else:                   # vpbroadcastw, vcvtph2ps: the splat of f32(wd)
                wd = b.fpext(splat(b, b.load(at(b, w, b.mul(kb, i64(wbb)), f16), align=1), C), vc)
            dw = b.fmul(wd, ad)
            b.store(dw, typed_gep(b, dwp, b.add(b.mul(kb, i64(R * C)), i64(r * C)), vc), align=4)
    return lambda kb, r, c: splat(b, b.load(b.gep(dwp, [b.add(b.mul(kb, i64(R * C)), i64(r * C + c))])))


def dot_q0(wbb: int, values):
    """Tile of the Q8_0 chain (tinyBLAS_Q0_AVX) over signed weight values: per 32-block
    acc = fma(r(wd * ad), float(s), acc), then hsum8(acc); s holds the lane sums of values x q8
    (mul_sum_i8_pairs: vpsignb, then vpmaddubsw and vpmaddwd). Weight blocks of wbb bytes, their
    f16 scale first; values(b, w, wb) -> <32 x i8> of the block at w + wb. The products
    r(wd * ad) come from _products (the same f32 products as ggml's scalar wd * ad). Q8_0, and
    Q4_0 / Q5_0 (backends/llvm/ggml/matmul/legacy.py)."""
    def tile(b, K, wrows, cols):
        R, C = len(wrows), len(cols.x)
        dw_of = _products(b, K, wrows, cols, wbb)
        values_of = _values_of(b, cols, wrows, wbb, values)

        def step(ib, accs):
            wb, xb = b.mul(ib, i64(wbb)), b.mul(ib, i64(34))
            aq = [b.load(at(b, x, b.add(xb, i64(2)), v32i8), align=1) for x in cols.x]
            out = []
            for r in range(R):
                wq = values_of(r, wb, ib)
                wabs = psign(b, wq, wq)
                for c in range(C):
                    dw = dw_of(ib, r, c)
                    s = b.sitofp(sums_us8(b, wabs, psign(b, aq[c], wq)), ir.VectorType(f32, 8))
                    out.append(fma(b, dw, s, accs[r * C + c]))
            return out

        return _finish(b, R, C, block_loop(b, K // 32, [zero8()] * (R * C), step))
    return tile


def wide_q0(wbb: int, values) -> Tiler:
    """The wide twin of a dot_q0 tiler (Tiler.wide): the chunk's values and each column tile's
    quants as widen_pairs, tiles of _shape_wide."""
    return Tiler(_shape_wide, _alloc(wide=True), _prep(34), _wide_tile(wbb), _chunk_wd(wbb, values, wide=True))


def _wide_tile(wbb: int):
    """dot_q0's tile from the chunk's and the columns' widen_pairs: lane sums by 2 vpmaddwd and
    1 vpaddd, then the same float steps."""
    def tile(b, K, wrows, cols):
        R, C = len(wrows), len(cols.x)
        step = _wide_step(b, wrows, cols, wbb, _products(b, K, wrows, cols, wbb))
        return _finish(b, R, C, block_loop(b, K // 32, [zero8()] * (R * C), step))
    return tile


def _wide_step(b, wrows, cols, wbb: int, dw_of):
    R, C = len(wrows), len(cols.x)
    first = [_block_of(b, cols, w, wbb) for w in wrows]

    def pair(base, k):
        return [b.load(b.gep(base, [b.add(b.mul(k, i64(2)), i64(h))]), align=32) for h in (0, 1)]

    def step(ib, accs):
        a16 = [pair(cols.a16, b.add(b.mul(ib, i64(C)), i64(c))) for c in range(C)]
        out = []
        for r in range(R):
            w16 = pair(cols.w16, b.add(first[r], ib))
            for c in range(C):
                s = b.add(madd(b, w16[0], a16[c][0]), madd(b, w16[1], a16[c][1]))
                out.append(fma(b, dw_of(ib, r, c), b.sitofp(s, ir.VectorType(f32, 8)), accs[r * C + c]))
        return out
    return step


def dot_q1(wbb: int, codes):
    """Tile of the Q4_1 chain (ggml_vec_dot_q4_1_q8_1) over unsigned weight codes against q8_1:
    per 32-block acc = fma(r(wd * ad), float(s), acc) and summs = fma(wm, as, summs), then
    r(hsum8(acc) + summs); s holds the lane sums of codes x q8 (vpmaddubsw, vpmaddwd). Weight
    blocks of wbb bytes, f16 d then f16 m first; codes(b, w, wb) -> <32 x i8> (0..31) of the
    block at w + wb. Q4_1, and Q5_1 (backends/llvm/ggml/matmul/legacy.py)."""
    def tile(b, K, wrows, cols):
        R, C = len(wrows), len(cols.x)
        vc = ir.VectorType(f32, C)
        dw_of = _products(b, K, wrows, cols, wbb)
        codes_of = _values_of(b, cols, wrows, wbb, codes)

        def step(ib, st):
            accs, summs = st[:R * C], st[R * C:]
            wb, xb = b.mul(ib, i64(wbb)), b.mul(ib, i64(36))
            aq = [b.load(at(b, x, b.add(xb, i64(4)), v32i8), align=1) for x in cols.x]
            na, ns = [], []
            if C == 1:              # lanes of the block's head: 0 the product r(wd * ad), 1 the chain wm·as
                ad4, as4 = (splat(b, b.load(b.gep(a, [ib])), 4) for a in (cols.d, cols.s))
            else:
                as_ = b.load(typed_gep(b, cols.s, b.mul(ib, i64(C)), vc), align=4)
            for r, w in enumerate(wrows):
                wq = codes_of(r, wb, ib)
                if C == 1:
                    head = _head(b, w, wb)
                    s = b.sitofp(sums_us8(b, wq, aq[0]), ir.VectorType(f32, 8))
                    na.append(fma(b, lanes(b, b.fmul(head, ad4), [0] * 8), s, accs[r]))
                    ns.append(fma(b, head, as4, summs[r]))
                    continue
                wm = load_h(b, w, b.add(wb, i64(2)))
                for c in range(C):
                    s = b.sitofp(sums_us8(b, wq, aq[c]), ir.VectorType(f32, 8))
                    na.append(fma(b, dw_of(ib, r, c), s, accs[r * C + c]))
                ns.append(fma(b, splat(b, wm, C), as_, summs[r]))
            return na + ns

        vs = V4F32 if C == 1 else vc            # one column: the chain in lane 1 (_head's m)
        st = block_loop(b, K // 32, [zero8()] * (R * C) + [ir.Constant(vs, [0.0] * vs.count)] * R, step)
        h, summs = hsums(b, st[:R * C]), st[R * C:]
        lane = (lambda c: 1) if C == 1 else (lambda c: c)      # noqa: E731
        return [[b.fadd(h[r * C + c], b.extract_element(summs[r], i32(lane(c)))) for c in range(C)] for r in range(R)]
    return tile


def _q8_0_values(b, w, wb):
    return b.load(at(b, w, b.add(wb, i64(2)), v32i8), align=1)


_q8_0 = dot_q0(34, _q8_0_values)
_q4_1 = dot_q1(20, lambda b, w, wb: nibbles(b, w, b.add(wb, i64(4))))


_BYTE_SHUF = ir.Constant(v32i8, [j // 8 for j in range(32)])          # byte j of the expansion: bits byte j/8
_BIT_MASKS = ir.Constant(v32i8, [1 << (j % 8) for j in range(32)])     # ... and its bit j%8
_SAT_7F = ir.Constant(v32i8, [0x7F] * 32)
_MINUS_ONES16 = ir.Constant(v16i16, [-1] * 16)


def q1_0_neg_signs(b, word):
    """The 32 bits of one Q1_0 sub-block (i32) as sign bytes for vpsignb: negative where the
    bit is set, positive where it is clear, as ggml's AVX2 expansion (broadcast, vpshufb of the
    bytes, vpand with the bit masks) followed by one saturating add of 0x7F (bit set: 0x7F + 2^j
    >= 0x80 stays >= 0x80; clear: 0x7F), which replaces ggml's compare, xor and subtract."""
    v = b.bitcast(splat(b, word), v32i8)
    pshufb = intrinsic(b.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
    t = b.and_(b.call(pshufb, [v, _BYTE_SHUF]), _BIT_MASKS)
    return b.call(intrinsic(b.module, "llvm.uadd.sat.v32i8", v32i8, [v32i8, v32i8]), [t, _SAT_7F])


def q1_0_sums(b, aq, neg):
    """Lane l = sum over 4l..4l+3 of (+a where the bit is set, -a where clear), exact: vpsignb
    makes -(+-a), vpmaddubsw with ones the pair sums, vpmaddwd with -1 the negated quad sums."""
    return madd(b, maddubs(b, ONES, psign(b, aq, neg)), _MINUS_ONES16)


def _q1_0(b, K, wrows, cols):
    """One column (decode): sub-block by sub-block, each activation block loaded once for the R
    rows. Several columns (one row): the row's bits expanded once, column by column. Every
    (row, column) keeps ggml's float chain; the orders only keep the live vectors in registers."""
    R, C = len(wrows), len(cols.x)
    v8f = ir.VectorType(f32, 8)

    def word(w, wb, k):
        return b.load(at(b, w, b.add(wb, i64(2 + 4 * k)), i32), align=1)

    def step(ib, accs):
        wb, xb = b.mul(ib, i64(18)), b.mul(ib, i64(4 * 34))
        wd = [splat(b, load_h(b, w, wb)) for w in wrows]
        blk = [None] * (R * C)

        def sub_block(k, c, negs):
            ad = _col_d(b, cols, b.add(b.mul(ib, i64(4)), i64(k)), c)
            aq = b.load(at(b, cols.x[c], b.add(xb, i64(34 * k + 2)), v32i8), align=1)
            for r in range(R):
                s = b.sitofp(q1_0_sums(b, aq, negs[r]), v8f)
                p = r * C + c
                blk[p] = b.fmul(ad, s) if k == 0 else fma(b, ad, s, blk[p])

        if C == 1:
            for k in range(4):
                sub_block(k, 0, [q1_0_neg_signs(b, word(w, wb, k)) for w in wrows])
        else:
            negs = [[q1_0_neg_signs(b, word(w, wb, k)) for w in wrows] for k in range(4)]
            for c in range(C):
                for k in range(4):
                    sub_block(k, c, negs[k])
        return [fma(b, wd[p // C], blk[p], accs[p]) for p in range(R * C)]

    return _finish(b, R, C, block_loop(b, K // 128, [zero8()] * (R * C), step))


def _hsum_pairs(b, vs):
    """Exact i16 totals of up to 8 <16 x i16> vectors (|total| < 2^15), as lanes of a <len x i16>."""
    phadd = intrinsic(b.module, "llvm.x86.avx2.phadd.w", v16i16, [v16i16, v16i16])
    level = vs + [ir.Constant(v16i16, [0] * 16)] * (8 - len(vs))
    while len(level) > 1:           # after 3 levels lane h*8+i holds half h of vector i
        level = [b.call(phadd, [level[i], level[i + 1]]) for i in range(0, len(level), 2)]
    z = level[0]
    v8 = ir.VectorType(i32, 8)
    lo = b.shuffle_vector(z, z, ir.Constant(v8, list(range(8))))
    hi = b.shuffle_vector(z, z, ir.Constant(v8, list(range(8, 16))))
    t = b.add(lo, hi)
    return b.shuffle_vector(t, t, ir.Constant(ir.VectorType(i32, len(vs)), list(range(len(vs)))))


def _q2_0(b, K, wrows, cols):
    R, C = len(wrows), len(cols.x)
    P = R * C
    vp, vpi = ir.VectorType(f32, P), ir.VectorType(i32, P)
    v4i64 = ir.VectorType(i64, 4)
    shifts = ir.Constant(v4i64, [0, 2, 4, 6])
    three = ir.Constant(v32i8, [3] * 32)
    col_of = ir.Constant(ir.VectorType(i32, P), [p % C for p in range(P)])
    row_of = ir.Constant(ir.VectorType(i32, P), [p // C for p in range(P)])

    def per_pair(vec_c):            # a <C x t> vector, one value per column -> <P x t>, one per pair
        return b.shuffle_vector(vec_c, ir.Constant(vec_c.type, ir.Undefined), col_of)

    def step(ib, st):
        wb = b.mul(ib, i64(18))
        wdv = ir.Constant(ir.VectorType(f32, R), ir.Undefined)
        for r, w in enumerate(wrows):
            wdv = b.insert_element(wdv, load_h(b, w, wb), i32(r))
        wd = b.shuffle_vector(wdv, ir.Constant(wdv.type, ir.Undefined), row_of)
        sumi = ir.Constant(vp, [0.0] * P)
        for k in range(2):
            kb = b.add(b.mul(ib, i64(2)), i64(k))
            codes = []
            for w in wrows:         # byte 8p+i = element 4i+p of the half (see _PERM)
                q = b.load(at(b, w, b.add(wb, i64(2 + 8 * k)), i64), align=1)
                q4 = splat(b, q, 4)
                codes.append(b.and_(b.bitcast(b.lshr(q4, shifts), v32i8), three))
            base = b.mul(kb, i64(C))
            aq = [b.load(typed_gep(b, cols.aq, b.mul(b.add(base, i64(c)), i64(32)), v32i8), align=32)
                  for c in range(C)]
            tot = _hsum_pairs(b, [maddubs(b, codes[p // C], aq[p % C]) for p in range(P)])
            asum = per_pair(b.load(typed_gep(b, cols.asum, base, ir.VectorType(i32, C)), align=4))
            ad = per_pair(b.load(typed_gep(b, cols.d, base, ir.VectorType(f32, C)), align=4))
            is_ = b.sub(b.sext(tot, vpi), asum)                  # sum (q-1)*a = sum q*a - sum a
            sumi = fma(b, b.sitofp(is_, vp), ad, sumi)
        return [fma(b, wd, sumi, st[0])]

    sumf = block_loop(b, K // 64, [ir.Constant(vp, [0.0] * P)], step)[0]
    return [[b.extract_element(sumf, i32(r * C + c)) for c in range(C)] for r in range(R)]


def _q1_0_tile(b, K, wrows, cols):
    """16 rows against one column by table lookups; other tiles (several columns, a thread's
    last rows) as _q1_0."""
    if len(wrows) == LUT_ROWS and cols.lut is not None:
        return lut_tile(b, K, wrows, cols.x[0], cols.d, cols.lut)
    return _q1_0(b, K, wrows, cols)


register_tiler(Q8_0, fo.Q8_0_DOT, Tiler(_shape, _alloc(), _prep(34), _q8_0, _chunk_wd(34),
                                    wide=wide_q0(34, _q8_0_values)))
register_tiler(Q4_1, fo.Q4_1_DOT, Tiler(_shape, _alloc(with_s=True), _prep(36), _q4_1, _chunk_wd(20)))
register_tiler(Q1_0, fo.Q1_0_DOT, Tiler(_shape_q1_0, _alloc(lut=True), _prep(34), _q1_0_tile))
register_tiler(Q2_0, fo.Q2_0_DOT, Tiler(_shape_q2_0, _alloc(q2=True), _prep(34), _q2_0))
