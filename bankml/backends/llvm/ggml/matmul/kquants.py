"""Q4_K / Q6_K against q8_K activations, and the q8_K quantization, in the llvm backend.

The same paths and float chains as backends/reference/matmul_kquants.py (read its docstring);
the column rule too: ggml's tiled kernel from 8 columns, its vec_dot below (Q4_K_MUL_MAT,
Q6_K_MUL_MAT), and for repacked Q4_K the gemm for columns below M - M % 4, the gemv after
(Q4_K_REPACK); with params["per_column"] (a batch of sequences) every column takes its one-column
path, vec_dot or gemv. The integers are exact int32 sums (vpmaddubsw, then vpmaddwd with the sub-block
scales), so any grouping of them gives ggml's; each output is one chain of f32 steps over the
super-blocks. The gemm and the tiled kernel run tiles of LANE_TILES columns (widest first)
in the lanes of their float chains (activations interleaved once per tile, see _Scratch), the
1-3 columns left one at a time, or 2-3 of them as one tile of 4 lanes (a prompt's gemv tail and
tiled rest: columns(padded)); vec_dot (tiles of 4 sharing one decode) keeps a chain per column.
One thread takes a contiguous share of rows, in L2-sized chunks.

q8_K block (292 bytes): f32 d at 0, 256 int8 at 4, 16 int16 sums of 16 at 260.
"""
from __future__ import annotations

import functools

from llvmlite import ir

from bankml.backends.llvm.emit.core import (f32, for_range, i8, i16, i32, i64, intrinsic, kernel_arg, new_function,
    prefetch_lines, size, smin, thread_range, typed, v8f32)
from bankml.backends.llvm.ggml.matmul.tiling import CHUNK_BYTES, PREFETCH_MAX_COLS
from bankml.backends.llvm.ggml.rows import row_element
from bankml.backends.llvm.emit.simd import (at, block_loop, hsum8, load_h, madd, maddubs, scratch, splat,
    v16i16, v32i8, v8i32, zero8)
from bankml.backends.llvm.emit.core import fma
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir import order as fo
from bankml.ir.ops import Op
from bankml.quants import ACT_TYPES, Q4_K, Q6_K, Q8_K, WEIGHT_TYPES

Q8K_BYTES = ACT_TYPES[Q8_K].block_bytes      # block_q8_K, 292
v4f32, v16i32, v16i8 = ir.VectorType(f32, 4), ir.VectorType(i32, 16), ir.VectorType(i8, 16)
v32f32, v32i32 = ir.VectorType(f32, 32), ir.VectorType(i32, 32)
TILED_MIN_COLS, GEMM_COLS = 8, 4
TILE_COLS = 4                   # columns sharing one decode of the weights (vec_dot)
# gemm / tiled: widths of the column tiles in lanes, widest first. Each width is code to compile:
# Gemma 3's small-last graph JITs in 2.6 s with (8, 4), 3.2-3.5 s with (16, 8, 4) (2.0 s before lane
# tiles), for Q4_K / Q6_K kernels 7% / 13% faster at 512 columns with 16 (equal at 52): the first
# compile is a cost every new user pays, so the tiles stop at 8.
LANE_TILES = {Q4_K: (8, 4), Q6_K: (8, 4)}
PAD_COLS = 4                    # 2-3 columns a prompt leaves after its tiles: one tile of 4 lanes


# ---- QUANTIZE to q8_K --------------------------------------------------------------------

def define_quantize_q8_k(m: ir.Module, g, n) -> ir.Function:
    """quantize_row_q8_K_ref: the first element of largest |x| gives iscale = -127/max."""
    x = g[n.inputs[0]]
    K = x.shape[-1]
    if K % 256:
        raise LoweringError(f"quantize {n.id}: a q8_K row of {K} is not a multiple of 256")
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    out, src, ith, nth, dims = fn.args
    M = size(b, dims, x.shape[:-1])
    fabs = intrinsic(m, "llvm.fabs.v8f32", v8f32, [v8f32])
    fmax = intrinsic(m, "llvm.vector.reduce.fmax.v8f32", f32, [v8f32])
    first = intrinsic(m, "llvm.vector.reduce.smin.v8i32", i32, [v8i32])
    rne = intrinsic(m, "llvm.roundeven.v32f32", v32f32, [v32f32])
    smin = intrinsic(m, "llvm.smin.v32i32", v32i32, [v32i32, v32i32])
    vsum = intrinsic(m, "llvm.vector.reduce.add.v16i32", i32, [v16i32])
    lo, hi = thread_range(b, b.mul(M, i64(K // 256)), ith, nth)
    with for_range(b, lo, hi, name="blk") as ib:
        xs = typed(b, b.gep(src, [b.mul(ib, i64(1024))]), f32)
        ob = b.gep(out, [b.mul(ib, i64(Q8K_BYTES))])
        # ggml's scan (amax = |x_j|, max = x_j where |x_j| > amax) keeps the largest magnitude (NaN
        # never greater) and the first element of it: the same two, found 8 lanes at a time
        ax = [b.call(fabs, [b.load(typed(b, b.gep(xs, [i64(8 * c)]), v8f32), align=4)]) for c in range(32)]
        def larger(a, acc):                                          # a where a > acc (NaN: acc)
            return b.select(b.fcmp_ordered(">", a, acc), a, acc)
        acc = [ir.Constant(v8f32, [0.0] * 8)] * 4
        for c, a in enumerate(ax):
            acc[c % 4] = larger(a, acc[c % 4])
        top = functools.reduce(lambda t, a: larger(a, t), acc[1:], acc[0])
        amax = b.call(fmax, [top])                                   # no NaN left: max is exact
        at_j = ir.Constant(v8i32, [256] * 8)
        for c in reversed(range(32)):                                # the first index of |x| == amax
            hit = b.fcmp_ordered("==", ax[c], splat(b, amax))
            at_j = b.select(hit, ir.Constant(v8i32, [8 * c + lane for lane in range(8)]), at_j)
        jmax = b.call(first, [at_j])
        jmax = b.select(b.icmp_signed("<", jmax, i32(256)), jmax, i32(0))     # none (all NaN): unused
        max_p = b.gep(xs, [b.zext(jmax, i64)])
        nz = b.fcmp_ordered("!=", amax, f32(0.0))
        iscale = b.select(nz, b.fdiv(f32(-127.0), b.load(max_p)), f32(0.0))
        b.store(b.select(nz, b.fdiv(f32(1.0), iscale), f32(0.0)), at(b, ob, 0, f32), align=1)
        for k in range(8):
            xv = b.load(typed(b, b.gep(xs, [i64(32 * k)]), v32f32), align=4)
            q = b.fptosi(b.call(rne, [b.fmul(xv, splat(b, iscale, 32))]), v32i32)
            q = b.trunc(b.call(smin, [q, ir.Constant(v32i32, [127] * 32)]), v32i8)
            b.store(q, at(b, ob, 4 + 32 * k, v32i8), align=1)
        for j in range(16):
            q = b.load(at(b, ob, 4 + 16 * j, v16i8), align=1)
            b.store(b.trunc(b.call(vsum, [b.sext(q, v16i32)]), i16), at(b, ob, 260 + 2 * j, i16), align=1)
    b.ret_void()
    return fn


# ---- integer pieces of one super-block -----------------------------------------------------

def _shuf(b, v, idx):
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(i32, len(idx)), idx))


def _pairs(b, v):
    """Lane i = v[2i] + v[2i+1]."""
    n = v.type.count
    return b.add(_shuf(b, v, list(range(0, n, 2))), _shuf(b, v, list(range(1, n, 2))))


def _reduce(b, v):
    n = v.type.count
    return b.call(intrinsic(b.module, f"llvm.vector.reduce.add.v{n}i32", i32, [v.type]), [v])


def _sum(b, vs):
    t = vs[0]
    for v in vs[1:]:
        t = b.add(t, v)
    return t


class _Weights:
    """Super-block ib of one weight row, decoded once for a tile of columns: f32 d (and dmin),
    code(s) the codes of 32-block s as bytes, scale(s) its scales as the i16 vector that
    vpmaddwd multiplies into the vpmaddubsw pairs (ggml's madd(scale, p16)), each emitted where
    first asked for. Q4_K: `sm` the 8 scales then the 8 mins as i16 lanes, `mins` the mins as
    i32 lanes; Q6_K: `sc_h` the 16 scales as i16 lanes, `sc16` as i32 lanes."""

    def __init__(self, b, wtype, wrow, ib):
        self.b, self.wtype = b, wtype
        self._codes, self._scales = {}, {}
        if wtype == Q4_K:
            self.wb = wb = b.gep(wrow, [b.mul(ib, i64(144))])
            self.dw, self.dmw = load_h(b, wb, 0), load_h(b, wb, 2)
            u = [b.load(at(b, wb, 4 + 4 * j, i32), align=1) for j in range(3)]
            km1, km2, km3 = i32(0x3f3f3f3f), i32(0x0f0f0f0f), i32(0x03030303)
            # ggml's utmp unpacking: bytes 0..7 the scales, 8..15 the mins (6 bits each)
            sc_lo = b.and_(u[0], km1)
            sc_hi = b.or_(b.and_(u[2], km2), b.shl(b.and_(b.lshr(u[0], i32(6)), km3), i32(4)))
            mn_lo = b.and_(u[1], km1)
            mn_hi = b.or_(b.and_(b.lshr(u[2], i32(4)), km2), b.shl(b.and_(b.lshr(u[1], i32(6)), km3), i32(4)))
            words = ir.Constant(ir.VectorType(i32, 4), ir.Undefined)
            for j, v in enumerate((sc_lo, sc_hi, mn_lo, mn_hi)):
                words = b.insert_element(words, v, i32(j))
            self.sm = b.zext(b.bitcast(words, v16i8), v16i16)                   # 8 scales, 8 mins
            self.mins = b.zext(_shuf(b, self.sm, list(range(8, 16))), v8i32)
        else:
            self.wb = wb = b.gep(wrow, [b.mul(ib, i64(210))])
            self.dw = load_h(b, wb, 208)
            sc8 = b.load(at(b, wb, 192, v16i8), align=1)
            self.sc16 = b.sext(sc8, v16i32)
            self.sc_h = b.sext(sc8, ir.VectorType(i16, 16))

    def code(self, s):
        if s not in self._codes:
            b, wb = self.b, self.wb
            c15, c4 = ir.Constant(v32i8, [15] * 32), ir.Constant(v32i8, [4] * 32)
            if self.wtype == Q4_K:
                raw = b.load(at(b, wb, 16 + 32 * (s // 2), v32i8), align=1)
                self._codes[s] = b.and_(raw, c15) if s % 2 == 0 else b.lshr(raw, c4)
            else:
                h, k = s // 4, s % 4
                ql = b.load(at(b, wb, 64 * h + 32 * (k & 1), v32i8), align=1)
                lo = b.and_(ql, c15) if k < 2 else b.lshr(ql, c4)
                qh = b.load(at(b, wb, 128 + 32 * h, v32i8), align=1)
                hi = b.shl(b.and_(b.lshr(qh, ir.Constant(v32i8, [2 * k] * 32)), ir.Constant(v32i8, [3] * 32)), c4)
                self._codes[s] = b.or_(lo, hi)
        return self._codes[s]

    def quarter(self, s, q):
        """Q4_K: code(s)'s bytes 8q..8q+7 in all four 8-byte slots (vpbroadcastq of the raw bytes,
        the nibbles cut after)."""
        b = self.b
        raw = b.load(at(b, self.wb, 16 + 32 * (s // 2) + 8 * q, i64), align=1)
        raw = b.bitcast(splat(b, raw, 4), v32i8)
        c15, c4 = ir.Constant(v32i8, [15] * 32), ir.Constant(v32i8, [4] * 32)
        return b.and_(raw, c15) if s % 2 == 0 else b.lshr(raw, c4)

    def halves(self, s, v):
        """Q6_K: code(s)'s quarters v and v + 2 each twice: [qv qv | qv+2 qv+2] (vpunpck[lh]qdq)."""
        v4 = ir.VectorType(i64, 4)
        c = self.b.bitcast(self.code(s), v4)
        return self.b.bitcast(self.b.shuffle_vector(c, c, ir.Constant(ir.VectorType(i32, 4), [v, v, v + 2, v + 2])),
                              v32i8)

    def scale(self, s):
        if s not in self._scales:
            b = self.b
            self._scales[s] = _shuf(b, self.sm, [s] * 16) if self.wtype == Q4_K else \
                _shuf(b, self.sc_h, [2 * s] * 8 + [2 * s + 1] * 8)
        return self._scales[s]


class _Ints:
    """The exact integers of one (weight row, activation column) super-block: `sub` the 8 lanes
    of each 32-block times its scales, `lanes` ggml's vec_dot lanes (Q6_K: less the 32*bias),
    `min4` Q4_K's 4 lanes of mins times 32-sums; ad the activation's f32 d. With pieces (1 or
    4: the lane chains' one column), s1, s2: the i32 sums of _LaneInts for this column."""

    def __init__(self, b, w: _Weights, xrow, ib, pieces=None):
        xb = b.gep(xrow, [b.mul(ib, i64(Q8K_BYTES))])
        self.ad = b.load(at(b, xb, 0, f32), align=1)
        bs16 = b.sext(b.load(at(b, xb, 260, v16i16), align=1), v16i32)
        self.sub = [madd(b, maddubs(b, w.code(s), b.load(at(b, xb, 4 + 32 * s, v32i8), align=1)), w.scale(s))
                    for s in range(8)]
        if w.wtype == Q4_K:
            self.min4 = _pairs(b, b.mul(_pairs(b, bs16), w.mins))           # <4 x i32>
            self.lanes = _sum(b, self.sub)
        else:
            bias = b.shl(_pairs(b, b.mul(bs16, w.sc16)), ir.Constant(v8i32, [5] * 8))
            self.lanes = b.sub(_sum(b, self.sub), bias)
        if pieces == 4:
            self.s1 = [_reduce(b, b.add(self.sub[2 * p], self.sub[2 * p + 1])) for p in range(4)]
            self.s2 = [b.extract_element(self.min4, i32(p)) for p in range(4)]
        elif pieces == 1:
            self.s1 = [_reduce(b, self.lanes)]
            self.s2 = [_reduce(b, self.min4)] if w.wtype == Q4_K else []


# ---- C columns in lanes (C in LANE_TILES): activations interleaved per column tile ---------
#
# Per column tile the activations are copied once (prep) into scratch, per super-block, group
# of columns and 32-block s, as 32-byte vectors of four 8-byte slots (quarters q: bytes
# 8q..8q+7 of one column's 32-block), which a weight row's code vector times (vpmaddubsw) with its quarters where the
# slots want them: int16 lanes that add in int16 before one vpmaddwd by the scales serves the
# whole group.
#   Q4_K, groups of 4 columns: vector q holds quarter q of columns 0..3; code quarter q in all
#     four slots (vpbroadcastq of the raw bytes, nibbles cut after). The four vectors add in
#     int16 (each lane at most 2*15*128 in magnitude: sums of 4 fit); vpmaddwd by the 32-block's
#     scale gives int32 [c0 c0 c1 c1 | c2 c2 c3 c3].
#   Q6_K, groups of 2 columns: vector 0 holds [c0 q0, c1 q0 | c0 q2, c1 q2], vector 1 quarters
#     1 and 3; the codes [q0 q0 | q2 q2] and [q1 q1 | q3 q3] are in-lane unpacks. The two add in
#     int16 (2*63*128 at most per lane: sums of 2 fit) with each 128-bit half inside one
#     16-element scale, so vpmaddwd by ggml's scale vector gives [c0 c0 c1 c1 | c0 c0 c1 c1].
# The sums of the activations' int16 sums with the mins (Q4_K) or the scales (Q6_K, the bias)
# go by pairs: prep stores, for each pair t of sums and each column, the two int16 side by side,
# and one vpmaddwd by the row's pair word t makes lane c = column c. Lane i of a tile holds
# column _lane_cols(wtype, C)[i]. Every sum is exact: any grouping gives ggml's integers.

GROUP = {Q4_K: 4, Q6_K: 2}      # columns per interleaved vector
PAIRS = {Q4_K: 4, Q6_K: 8}      # Q4_K: mins 2t, 2t+1 with S32; Q6_K: scales 2t, 2t+1 with S16


def _lane_cols(wtype, C):
    """The column of each lane of a C-column tile: Q4_K's 8-column pieces come out of their
    last vphaddd as columns [0 1 4 5 2 3 6 7]."""
    if wtype == Q6_K or C == 4:
        return list(range(C))
    return [8 * (i // 8) + [0, 1, 4, 5, 2, 3, 6, 7][i % 8] for i in range(C)]


def _slot(wtype, v, t):
    """(column in its group, quarter) of slot t of interleaved vector v."""
    return (t, v) if wtype == Q4_K else (t % 2, v + 2 * (t // 2))


class _Scratch:
    """Stack scratch of one column tile of C columns, K // 256 super-blocks: the interleaved
    activations (C * 256 bytes per block), the int16 pairs (PAIRS * C pairs per block), the
    f32 d (C per block), these two in lane order. `like`: a scratch of as many columns or more
    whose stack arrays this one reuses (tiles of different widths run one after another)."""

    def __init__(self, b, wtype, K, C, like=None):
        nb = K // 256
        self.C, self.wtype = C, wtype
        if like is not None:
            self.q, self.pairs, self.d = like.q, like.pairs, like.d
            return
        self.q = scratch(b, i8, nb * C * 256, "act.q")
        self.pairs = scratch(b, i16, nb * PAIRS[wtype] * 2 * C, "act.pairs")
        self.d = scratch(b, f32, nb * C, "act.d")

    def vector(self, b, ib, g, s, v):
        """Interleaved vector v (of GROUP) of 32-block s, column group g, super-block ib."""
        G = GROUP[self.wtype]
        return at(b, self.q, b.add(b.mul(ib, i64(self.C * 256)), i64(((g * 8 + s) * G + v) * 32)), v32i8)

    def fill(self, b, K, xrows):
        C, npairs, G = self.C, PAIRS[self.wtype], GROUP[self.wtype]
        lane_cols = _lane_cols(self.wtype, C)
        with for_range(b, 0, K // 256, name="prep") as ib:
            xbs = [b.gep(x, [b.mul(ib, i64(Q8K_BYTES))]) for x in xrows]
            qb = b.gep(self.q, [b.mul(ib, i64(C * 256))])
            with for_range(b, 0, 8, name="sub") as s:
                for g in range(C // G):
                    for v in range(G):
                        for t in range(4):
                            c, q = _slot(self.wtype, v, t)
                            src = b.add(b.mul(s, i64(32)), i64(4 + 8 * q))
                            dst = b.add(b.mul(s, i64(G * 32)), i64(g * 8 * G * 32 + v * 32 + 8 * t))
                            b.store(b.load(at(b, xbs[G * g + c], src, i64), align=1), at(b, qb, dst, i64), align=8)
            pb = b.gep(self.pairs, [b.mul(ib, i64(npairs * 2 * C))])
            db = b.gep(self.d, [b.mul(ib, i64(C))])
            for i, c in enumerate(lane_cols):
                b.store(b.load(at(b, xbs[c], 0, f32), align=1), b.gep(db, [i64(i)]))
                bs = b.load(at(b, xbs[c], 260, v16i16), align=1)
                if self.wtype == Q4_K:                                    # S32_j = S16_2j + S16_2j+1
                    bs = b.add(_shuf(b, bs, list(range(0, 16, 2))), _shuf(b, bs, list(range(1, 16, 2))))
                for t in range(npairs):
                    pair = b.bitcast(_shuf(b, bs, [2 * t, 2 * t + 1]), i32)
                    b.store(pair, typed(b, b.gep(pb, [i64(2 * (t * C + i))]), i32), align=4)


def _phadd(b, x, y):
    return b.call(intrinsic(b.module, "llvm.x86.avx2.phadd.d", v8i32, [v8i32, v8i32]), [x, y])


def _cat(b, vs):
    """One vector of the lanes of vs (equal types, a power of two of them), in order."""
    while len(vs) > 1:
        n = vs[0].type.count
        vs = [b.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, 2 * n), list(range(2 * n))))
              for x, y in zip(vs[0::2], vs[1::2])]
    return vs[0]


def _pair_dots(b, scr, ib, words):
    """[<C x i32> per pair t]: lane i = the int16 pair t of lane i's column times the row's
    pair word t (words: <8 x i32>, lane t), by vpmaddwd over 16 int16 at a time."""
    C, npairs = scr.C, PAIRS[scr.wtype]
    pb = b.gep(scr.pairs, [b.mul(ib, i64(npairs * 2 * C))])
    ms = []
    for k in range(npairs * 2 * C // 16):
        v = b.load(typed(b, b.gep(pb, [i64(16 * k)]), v16i16), align=32)
        ms.append(madd(b, v, b.bitcast(_shuf(b, words, [(8 * k + i) // C for i in range(8)]), v16i16)))
    if C == 4:
        return [h for m in ms for h in (_shuf(b, m, [0, 1, 2, 3]), _shuf(b, m, [4, 5, 6, 7]))]
    return [_cat(b, ms[i:i + C // 8]) for i in range(0, len(ms), C // 8)]


class _LaneInts:
    """The exact integers of one weight super-block against the C columns of a scratch, each a
    <C x i32> in lane order: pieces 4 (the gemm): s1[p] the scaled sums of 32-blocks 2p, 2p+1,
    s2[p] min_2p*S32_2p + min_2p+1*S32_2p+1; pieces 1: s1[0] the whole block (Q6_K: less the
    32*bias), s2[0] the sum of all 8 mins times 32-sums. ad the columns' f32 d."""

    def __init__(self, b, w: _Weights, scr: _Scratch, ib, pieces):
        C = scr.C
        self.ad = b.load(typed(b, b.gep(scr.d, [b.mul(ib, i64(C))]), ir.VectorType(f32, C)), align=4)
        G = GROUP[w.wtype]

        def blocks(subs):           # 32-blocks subs: the int32 vector of each column group (see above)
            acc = [None] * (C // G)
            for s in subs:
                for g in range(C // G):
                    if w.wtype == Q4_K:
                        x = [maddubs(b, w.quarter(s, q), b.load(scr.vector(b, ib, g, s, q), align=32))
                             for q in range(4)]
                        v = madd(b, b.add(b.add(x[0], x[1]), b.add(x[2], x[3])), w.scale(s))
                    else:
                        x = [maddubs(b, w.halves(s, v), b.load(scr.vector(b, ib, g, s, v), align=32)) for v in range(2)]
                        v = madd(b, b.add(x[0], x[1]), w.scale(s))
                    acc[g] = v if acc[g] is None else b.add(acc[g], v)
            return acc

        def lanes8(vs):             # 8 columns' int32 vectors (2 groups of 4, 4 pairs) as 8 lanes
            if G == 2:              # [c0 c0 c1 c1 | c0 c0 c1 c1] per pair: to [c0 c1 c2 c3 | c0 c1 c2 c3]
                vs = [_phadd(b, vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
                lo = b.shuffle_vector(vs[0], vs[1], ir.Constant(v8i32, [0, 1, 2, 3, 8, 9, 10, 11]))
                hi = b.shuffle_vector(vs[0], vs[1], ir.Constant(v8i32, [4, 5, 6, 7, 12, 13, 14, 15]))
                return b.add(lo, hi)
            even = b.shuffle_vector(vs[0], vs[1], ir.Constant(v8i32, [0, 2, 8, 10, 4, 6, 12, 14]))
            odd = b.shuffle_vector(vs[0], vs[1], ir.Constant(v8i32, [1, 3, 9, 11, 5, 7, 13, 15]))
            return b.add(even, odd)

        def lanes(vs):              # the groups' int32 vectors as <C x i32> in lane order
            if C == 4 and G == 2:
                v = _phadd(b, vs[0], vs[1])
                return b.add(_shuf(b, v, [0, 1, 2, 3]), _shuf(b, v, [4, 5, 6, 7]))
            if C == 4:              # [c0 c0 c1 c1 | c2 c2 c3 c3]
                return b.add(_shuf(b, vs[0], [0, 2, 4, 6]), _shuf(b, vs[0], [1, 3, 5, 7]))
            n = 8 // G
            return _cat(b, [lanes8(vs[i:i + n]) for i in range(0, len(vs), n)])

        if pieces == 4:
            self.s1 = [lanes(blocks([2 * p, 2 * p + 1])) for p in range(4)]
        else:
            self.s1 = [lanes(blocks(range(8)))]
        if w.wtype == Q4_K:
            mins = _pair_dots(b, scr, ib, _shuf(b, b.bitcast(w.sm, v8i32), [4, 5, 6, 7, 4, 5, 6, 7]))
            self.s2 = mins if pieces == 4 else [_sum(b, mins)]
        else:                       # less 32*(S16_2t*sc_2t + S16_2t+1*sc_2t+1) over the 8 pairs t
            bias = _sum(b, _pair_dots(b, scr, ib, b.bitcast(w.sc_h, v8i32)))
            self.s1 = [b.sub(self.s1[0], b.shl(bias, ir.Constant(bias.type, [5] * C)))]


def _f(b, i):
    return b.sitofp(i, f32 if isinstance(i.type, ir.IntType) else ir.VectorType(f32, i.type.count))


# ---- the float chains: one step per super-block, for each column of a tile ----------------------

class _VecDot:
    per_column = True

    def __init__(self, wtype):
        self.wtype = wtype

    def init(self, C):
        return [zero8()] + ([ir.Constant(v4f32, [0.0] * 4)] if self.wtype == Q4_K else [])

    def step(self, b, w, k, st):
        out = [fma(b, splat(b, b.fmul(k.ad, w.dw)), _f(b, k.lanes), st[0])]
        if self.wtype == Q4_K:
            out.append(fma(b, splat(b, b.fmul(b.fneg(k.ad), w.dmw), 4), _f(b, k.min4), st[1]))
        return out

    def finish(self, b, st):
        res = hsum8(b, st[0])
        if self.wtype == Q4_K:
            e = [b.extract_element(st[1], i32(i)) for i in range(4)]
            res = b.fadd(res, b.fadd(b.fadd(e[0], e[2]), b.fadd(e[1], e[3])))
        return res


def _zero(C):
    return f32(0.0) if C == 1 else ir.Constant(ir.VectorType(f32, C), [0.0] * C)


def _wide(b, x, like):
    """The f32 x as like's type: itself, or in every lane."""
    return splat(b, x, like.type.count) if isinstance(like.type, ir.VectorType) else x


class _Tiled:
    """One step per super-block on k.s1[0], k.s2[0] of one column (f32) or of C (lanes)."""
    per_column = False

    def __init__(self, wtype):
        self.wtype = wtype

    def init(self, C):
        return [_zero(C)]

    def step(self, b, w, k, st):
        res = b.fmul(_wide(b, w.dw, k.ad), _f(b, k.s1[0]))
        if self.wtype == Q4_K:
            res = fma(b, _wide(b, b.fneg(w.dmw), k.ad), _f(b, k.s2[0]), res)
        return [fma(b, res, k.ad, st[0])]

    def finish(self, b, st):
        return st[0]


class _Repacked:
    """gemv (pieces 1) / gemm (pieces 4: one step per 64 elements), one column or C in lanes."""
    per_column = False

    def __init__(self, pieces):
        self.pieces = pieces

    def init(self, C):
        return [_zero(C), _zero(C)]

    def step(self, b, w, k, st):
        acc, accm = st
        d, dm = b.fmul(_wide(b, w.dw, k.ad), k.ad), b.fmul(_wide(b, w.dmw, k.ad), k.ad)
        for s1, s2 in zip(k.s1, k.s2):
            acc = fma(b, _f(b, s1), d, acc)
            accm = fma(b, _f(b, s2), dm, accm)
        return [acc, accm]

    def finish(self, b, st):
        return b.fsub(st[0], st[1])


def _tile(b, chain, wtype, K, wrow, xrows, scr=None):
    """The outputs of one weight row for len(xrows) columns; the weights decoded once per block.
    A per-column chain keeps a state per column; the others one state for one column, or with a
    lane per column of the prepared scratch scr."""
    C = len(xrows)
    pieces = getattr(chain, "pieces", 1)
    if chain.per_column:
        n = len(chain.init(1))

        def step(ib, st):
            w = _Weights(b, wtype, wrow, ib)
            out = []
            for c, x in enumerate(xrows):
                out += chain.step(b, w, _Ints(b, w, x, ib), st[c * n:(c + 1) * n])
            return out

        st = block_loop(b, K // 256, chain.init(1) * C, step)
        return [chain.finish(b, st[c * n:(c + 1) * n]) for c in range(C)]

    def step(ib, st):
        w = _Weights(b, wtype, wrow, ib)
        k = _Ints(b, w, xrows[0], ib, pieces) if C == 1 else _LaneInts(b, w, scr, ib, pieces)
        return chain.step(b, w, k, st)

    res = chain.finish(b, block_loop(b, K // 256, chain.init(C), step))
    return [res] if C == 1 else [b.extract_element(res, i32(_lane_cols(wtype, C).index(c))) for c in range(C)]


@kernel(Op.MUL_MAT, order=(fo.Q4_K_REPACK, fo.Q4_K_MUL_MAT, fo.Q6_K_MUL_MAT))
def define_mul_mat_kquant(m: ir.Module, g, n) -> ir.Function:
    w, xq = g[n.inputs[0]], g[n.inputs[1]]
    wtype = int(w.params["ggml_type"])
    K = w.shape[1]
    if xq.op is not Op.QUANTIZE or int(xq.params["type"]) != Q8_K:
        raise LoweringError(f"mul_mat {n.name}: {WEIGHT_TYPES[wtype].name} wants q8_K activations")
    if K % 256 or (wtype, n.order) not in ((Q4_K, fo.Q4_K_REPACK), (Q4_K, fo.Q4_K_MUL_MAT), (Q6_K, fo.Q6_K_MUL_MAT)):
        raise LoweringError(f"mul_mat {n.name}: {WEIGHT_TYPES[wtype].name} with K = {K} and order "
                            f"{n.order.describe() if n.order else None} is not lowered")
    wrb, xrb = WEIGHT_TYPES[wtype].row_bytes(K), ACT_TYPES[Q8_K].row_bytes(K)
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    fn.linkage = "internal"
    out, wp, xp, ith, nth, dims = fn.args
    yp = typed(b, out, f32)
    M = size(b, dims, n.shape[:-1])
    rows_n = kernel_arg(b, dims)     # N, at run time: one kernel text for every row count of a K
    lo, hi = thread_range(b, rows_n, ith, nth)

    chunk = max(1, CHUNK_BYTES // wrb)
    few = b.icmp_signed("<=", M, i64(PREFETCH_MAX_COLS))

    def prefetch_next(r):
        """Row r + chunk's cache lines while row r runs (few columns: the reason in tiling.Tiler)."""
        nxt = b.add(r, i64(chunk))
        with b.if_then(b.and_(few, b.icmp_signed("<", nxt, hi))):
            prefetch_lines(b, wp, b.mul(nxt, i64(wrb)), wrb, 3)

    def columns(chain, c0, c1, widths, padded=False):
        """Columns [c0, c1) through one chain: per chunk of this thread's rows (weights that stay
        in L2), tiles of widths[0] columns, then of widths[1], ..., then one column at a time;
        the next chunk prefetched row by row. padded (a lane chain): 2 or 3 columns left after the
        tiles run as one tile of PAD_COLS lanes instead, the last column repeated in the lanes
        past them and only theirs stored (each lane its own chain: a column's bits do not depend
        on its neighbours; a 4-lane tile takes about 1.5 single columns' time)."""
        bounds = [c0]
        for C in widths:
            start = bounds[-1]
            bounds.append(b.add(start, b.mul(b.sdiv(b.sub(c1, start), i64(C)), i64(C))))
        widest = None

        def tile_rows(r0, r1, c, xrows, scr, n=None):
            if scr is not None:
                scr.fill(b, K, xrows)
            with for_range(b, r0, r1, name="row") as r:
                prefetch_next(r)
                res = _tile(b, chain, wtype, K, b.gep(wp, [b.mul(r, i64(wrb))]), xrows, scr)
                for j, v in enumerate(res):
                    at_j = b.gep(yp, [b.add(b.mul(b.add(c, i64(j)), rows_n), r)])
                    if n is None or j == 0:
                        b.store(v, at_j)
                    else:
                        with b.if_then(b.icmp_signed("<", i64(j), n)):
                            b.store(v, at_j)

        with for_range(b, lo, hi, step=chunk, name="chunk") as r0:
            r1 = smin(b, b.add(r0, i64(chunk)), hi)
            stages = list(zip(widths, bounds, bounds[1:]))
            if not padded:
                stages.append((1, bounds[-1], c1))
            for C, start, stop in stages:
                lanes = C > 1 and not chain.per_column
                scr = _Scratch(b, wtype, K, C, widest) if lanes else None
                widest = widest or scr
                with for_range(b, start, stop, step=C, name=f"ct{C}") as c:
                    tile_rows(r0, r1, c, [b.gep(xp, [b.mul(b.add(c, i64(j)), i64(xrb))]) for j in range(C)], scr)
            if padded:
                start = bounds[-1]
                left = b.sub(c1, start)
                with b.if_else(b.icmp_signed(">", left, i64(1))) as (several, one):
                    with several:
                        last = b.sub(left, i64(1))
                        xrows = [b.gep(xp, [b.mul(b.add(start, smin(b, i64(j), last)), i64(xrb))])
                                 for j in range(PAD_COLS)]
                        tile_rows(r0, r1, start, xrows, _Scratch(b, wtype, K, PAD_COLS, widest), left)
                    with one:
                        with b.if_then(b.icmp_signed("==", left, i64(1))):
                            tile_rows(r0, r1, start, [b.gep(xp, [b.mul(start, i64(xrb))])], None)

    if n.params.get("per_column"):          # a batch of sequences: every column as one alone
        if n.order is fo.Q4_K_REPACK:
            columns(_Repacked(1), i64(0), M, ())
        else:
            columns(_VecDot(wtype), i64(0), M, (TILE_COLS,))
    elif n.order is fo.Q4_K_REPACK:
        split = b.sub(M, b.srem(M, i64(GEMM_COLS)))           # gemm below, gemv from here
        columns(_Repacked(4), i64(0), split, LANE_TILES[wtype])
        columns(_Repacked(1), split, M, (), padded=True)
    else:
        with b.if_else(b.icmp_signed(">=", M, i64(TILED_MIN_COLS))) as (then, other):
            with then:
                columns(_Tiled(wtype), i64(0), M, LANE_TILES[wtype], padded=True)
            with other:
                columns(_VecDot(wtype), i64(0), M, (TILE_COLS,))
    b.ret_void()
    return fn


# ---- GET_ROWS: element j of a Q4_K / Q6_K row (dequantize_row_q4_K / _q6_K, no FMA) ------------

def kquant_element(b: ir.IRBuilder, gtype: int, row, j):
    blk, k = b.sdiv(j, i64(256)), b.srem(j, i64(256))

    def byte(off):                            # zero-extended i32 of the byte at this block + off
        return b.zext(b.load(at(b, row, b.add(b.mul(blk, i64(WEIGHT_TYPES[gtype].block_bytes)), off), i8)), i32)

    if gtype == Q4_K:
        base = b.mul(blk, i64(144))
        d, dmin = load_h(b, row, base), load_h(b, row, b.add(base, i64(2)))
        sub = b.sdiv(k, i64(32))
        low = b.icmp_signed("<", sub, i64(4))
        s_j, s_j4 = byte(b.add(sub, i64(4))), byte(b.add(sub, i64(8)))
        s_jm4 = byte(b.add(b.select(low, sub, b.sub(sub, i64(4))), i64(4)))
        six = lambda v: b.shl(b.lshr(v, i32(6)), i32(4))   # noqa: E731
        sc = b.select(low, b.and_(s_j, i32(63)), b.or_(b.and_(s_j4, i32(15)), six(s_jm4)))
        mn = b.select(low, b.and_(s_j4, i32(63)), b.or_(b.lshr(s_j4, i32(4)), six(s_j)))
        qb = byte(b.add(i64(16), b.add(b.mul(b.sdiv(k, i64(64)), i64(32)), b.srem(k, i64(32)))))
        q = b.select(b.icmp_signed("<", b.srem(k, i64(64)), i64(32)), b.and_(qb, i32(15)), b.lshr(qb, i32(4)))
        return b.fsub(b.fmul(b.fmul(d, b.uitofp(sc, f32)), b.uitofp(q, f32)), b.fmul(dmin, b.uitofp(mn, f32)))
    base = b.mul(blk, i64(210))
    d = load_h(b, row, b.add(base, i64(208)))
    h, r = b.sdiv(k, i64(128)), b.srem(k, i64(128))
    kk, l = b.sdiv(r, i64(32)), b.srem(r, i64(32))
    qlb = byte(b.add(b.add(b.mul(h, i64(64)), l), b.mul(b.and_(kk, i64(1)), i64(32))))
    nib = b.select(b.icmp_signed("<", kk, i64(2)), b.and_(qlb, i32(15)), b.lshr(qlb, i32(4)))
    qhb = byte(b.add(i64(128), b.add(b.mul(h, i64(32)), l)))
    hi = b.and_(b.lshr(qhb, b.trunc(b.mul(kk, i64(2)), i32)), i32(3))
    q = b.sub(b.or_(nib, b.shl(hi, i32(4))), i32(32))
    sc = b.sext(b.load(at(b, row, b.add(base, b.add(i64(192), b.sdiv(k, i64(16)))), i8)), i32)
    return b.fmul(b.fmul(d, b.sitofp(sc, f32)), b.sitofp(q, f32))


row_element(Q4_K)(lambda b, row, j: kquant_element(b, Q4_K, row, j))
row_element(Q6_K)(lambda b, row, j: kquant_element(b, Q6_K, row, j))
