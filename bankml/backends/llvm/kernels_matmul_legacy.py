"""Q4_0, Q5_0 and Q5_1 weights against q8_0 / q8_1 activations: the ggml vec_dots, as register tiles.

Float steps per (row, column) pair, exactly as backends/reference/matmul.py:
- Q4_0 (ggml_vec_dot_q4_0_q8_0 = tinyBLAS_Q0_AVX) and Q5_0 (ggml_vec_dot_q5_0_q8_0 = tinyBLAS_Q0_AVX):
  per 32-block acc = fma(r(wd*ad), float(s), acc), hsum8(acc); s holds the lane sums of the
  signed weights (nibble - 8, or code - 16) times the q8 activations (mul_sum_i8_pairs: psign
  then vpmaddubsw, never saturating: |w| <= 16, |a| <= 127).
- Q5_1 (ggml_vec_dot_q5_1_q8_1): the Q4_1 chain with s = code (0..31) x q8:
  acc = fma(r(wd*ad), float(s), acc), summs = fma(wm, as, summs); result r(hsum8(acc) + summs).
Codes are made in element order: element j < 16 from the low nibble of qs[j], j + 16 from its
high nibble, the fifth bit (Q5) from bit j of qh. Q4_0 matrices of 8k rows never come here:
ggml repacks them (kernels_matmul_repack.py).
Per column tile, prep (kernels_matmul_q's) converts the activation's f16 scales to f32 scratch [block][column].
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.common import f32, i1, i32, i64
from bankml.backends.llvm.kernels_matmul import TILERS, Tiler, at, block_loop, fma, hsum8, load_h, psign, splat, \
    sums_us8, v16i8, v32i8, zero8
from bankml.backends.llvm.kernels_matmul_q import _alloc as alloc, _prep as prep  # the Q8_0/Q4_1 column tiles
from bankml.ir import order as fo
from bankml.quants import Q4_0, Q5_0, Q5_1

v8f32 = ir.VectorType(f32, 8)
_CAT = ir.Constant(ir.VectorType(i32, 32), list(range(32)))


def col_d(b, cols, kb, c):
    """f32(a.d) of column c's 32-block kb (a scalar)."""
    return b.load(b.gep(cols.d, [b.add(b.mul(kb, i64(len(cols.x))), i64(c))]))


def nibbles(b, w, off):
    """The 32 nibbles (0..15) of qs at w + off, in element order: low nibbles, then high ones."""
    qs = b.load(at(b, w, off, v16i8), align=1)
    lo = b.and_(qs, ir.Constant(v16i8, [15] * 16))
    hi = b.lshr(qs, ir.Constant(v16i8, [4] * 16))
    return b.shuffle_vector(lo, hi, _CAT)


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


def _shape(M: int) -> tuple[int, int]:
    """Tiles of up to 8 columns, one row."""
    return 1, min(M, 8)


def _signed(block_bytes: int, values):
    """Q4_0 / Q5_0: the Q8_0 chain over signed weight values."""
    def tile(b, K, wrows, cols):
        R, C = len(wrows), len(cols.x)

        def step(ib, accs):
            wb, xb = b.mul(ib, i64(block_bytes)), b.mul(ib, i64(34))
            ad = [splat(b, col_d(b, cols, ib, c)) for c in range(C)]
            aq = [b.load(at(b, x, b.add(xb, i64(2)), v32i8), align=1) for x in cols.x]
            out = []
            for r, w in enumerate(wrows):
                wd = splat(b, load_h(b, w, wb))
                wq = values(b, w, wb)
                wabs = psign(b, wq, wq)
                for c in range(C):
                    s = b.sitofp(sums_us8(b, wabs, psign(b, aq[c], wq)), v8f32)
                    out.append(fma(b, b.fmul(wd, ad[c]), s, accs[r * C + c]))
            return out

        accs = block_loop(b, K // 32, [zero8()] * (R * C), step)
        return [[hsum8(b, accs[r * C + c]) for c in range(C)] for r in range(R)]
    return tile


def _q5_1(b, K, wrows, cols):
    R, C = len(wrows), len(cols.x)
    vc = ir.VectorType(f32, C)

    def step(ib, st):
        accs, summs = st[:R * C], st[R * C:]
        wb, xb = b.mul(ib, i64(24)), b.mul(ib, i64(36))
        at_c = b.bitcast(b.gep(cols.s, [b.mul(ib, i64(C))]), vc.as_pointer())
        as_ = b.load(at_c, align=4)
        ad = [col_d(b, cols, ib, c) for c in range(C)]
        aq = [b.load(at(b, x, b.add(xb, i64(4)), v32i8), align=1) for x in cols.x]
        na, ns = [], []
        for r, w in enumerate(wrows):
            wd, wm = load_h(b, w, wb), load_h(b, w, b.add(wb, i64(2)))
            wq = q5_1_codes(b, w, wb)
            for c in range(C):
                s = b.sitofp(sums_us8(b, wq, aq[c]), v8f32)
                na.append(fma(b, splat(b, b.fmul(wd, ad[c])), s, accs[r * C + c]))
            ns.append(fma(b, splat(b, wm, C), as_, summs[r]))
        return na + ns

    st = block_loop(b, K // 32, [zero8()] * (R * C) + [ir.Constant(vc, [0.0] * C)] * R, step)
    accs, summs = st[:R * C], st[R * C:]
    return [[b.fadd(hsum8(b, accs[r * C + c]), b.extract_element(summs[r], i32(c))) for c in range(C)]
            for r in range(R)]


TILERS[(Q4_0, fo.Q4_0_DOT)] = Tiler(_shape, alloc(), prep(34), _signed(18, q4_0_values))
TILERS[(Q5_0, fo.Q5_0_DOT)] = Tiler(_shape, alloc(), prep(34), _signed(22, q5_0_values))
TILERS[(Q5_1, fo.Q5_1_DOT)] = Tiler(_shape, alloc(with_s=True), prep(36), _q5_1)
