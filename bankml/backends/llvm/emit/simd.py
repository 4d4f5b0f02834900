"""The SIMD vocabulary every llvm kernel speaks: vector types, lane shuffles and horizontal
sums in ggml's orders (hsum8, GGML_F32x8_REDUCE), the AVX2 integer dot steps (vpmaddubsw,
vpmaddwd, vpsignb), unaligned loads at byte offsets, stack scratch in the entry block."""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f16, f32, for_range, i8, i16, i32, i64, intrinsic, typed, v8f32


v8i8, v16i8, v32i8 = (ir.VectorType(i8, k) for k in (8, 16, 32))


v16i16, v8i32 = ir.VectorType(i16, 16), ir.VectorType(i32, 8)


v8f16 = ir.VectorType(f16, 8)


def splat(b: ir.IRBuilder, x, n: int = 8):
    t = ir.VectorType(x.type, n)
    v = b.insert_element(ir.Constant(t, ir.Undefined), x, i32(0))
    return b.shuffle_vector(v, ir.Constant(t, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))


def lanes(b: ir.IRBuilder, v, idx: list[int]):
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(i32, len(idx)), idx))


def hsum8(b: ir.IRBuilder, v):
    """hsum_float_8: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), each add in f32."""
    e = [b.extract_element(v, i32(i)) for i in range(8)]
    return b.fadd(b.fadd(b.fadd(e[0], e[4]), b.fadd(e[2], e[6])), b.fadd(b.fadd(e[1], e[5]), b.fadd(e[3], e[7])))


def _shuffle(b: ir.IRBuilder, x, y, idx: list[int]):
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, len(idx)), idx))


def hsum8_x8(b, v):
    """hsum8 of eight 8-lane vectors at once: lane c of the result is hsum8(v[c]), with the same
    f32 adds, ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)), run as 7 vector adds (and 14 shuffles) in
    place of 56 scalar ones."""
    half = [b.fadd(_shuffle(b, v[c], v[c + 4], [0, 1, 2, 3, 8, 9, 10, 11]),
                   _shuffle(b, v[c], v[c + 4], [4, 5, 6, 7, 12, 13, 14, 15])) for c in range(4)]
    # half[c]: (x0+x4, x1+x5, x2+x6, x3+x7) of v[c] in lanes 0-3, of v[c+4] in lanes 4-7
    pair = [b.fadd(_shuffle(b, half[c], half[c + 1], [0, 1, 8, 9, 4, 5, 12, 13]),
                   _shuffle(b, half[c], half[c + 1], [2, 3, 10, 11, 6, 7, 14, 15])) for c in (0, 2)]
    # pair[k]: (x0+x4)+(x2+x6), (x1+x5)+(x3+x7) of v[2k], then of v[2k+1] (lanes 0-3; v[2k+4], v[2k+5]: 4-7)
    return b.fadd(_shuffle(b, pair[0], pair[1], [0, 2, 8, 10, 4, 6, 12, 14]),
                  _shuffle(b, pair[0], pair[1], [1, 3, 9, 11, 5, 7, 13, 15]))


def transpose8(b, x):
    """The 8x8 transpose of eight 8-lane vectors (unpack, shuffle, 128-bit permute stages):
    lane j of result l is lane l of x[j]."""
    def shuf(a, c, idx):
        return b.shuffle_vector(a, c, ir.Constant(ir.VectorType(i32, 8), idx))
    t = []
    for i in range(0, 8, 2):
        t += [shuf(x[i], x[i + 1], [0, 8, 1, 9, 4, 12, 5, 13]), shuf(x[i], x[i + 1], [2, 10, 3, 11, 6, 14, 7, 15])]
    u = []
    for i in (0, 4):
        for a, c in ((t[i], t[i + 2]), (t[i + 1], t[i + 3])):
            u += [shuf(a, c, [0, 1, 8, 9, 4, 5, 12, 13]), shuf(a, c, [2, 3, 10, 11, 6, 7, 14, 15])]
    return [shuf(u[k % 4], u[k % 4 + 4], [0, 1, 2, 3, 8, 9, 10, 11] if k < 4 else [4, 5, 6, 7, 12, 13, 14, 15])
            for k in range(8)]


def hsums(b, accs):
    """[hsum8(a) for a in accs], eight at a time as vectors (hsum8_x8); a last group of fewer
    than eight is padded with zero vectors (lanes not read) where it has more than two."""
    out = []
    for k in range(0, len(accs), 8):
        group = accs[k:k + 8]
        if len(group) <= 2:
            out += [hsum8(b, a) for a in group]
            continue
        v = hsum8_x8(b, group + [zero8()] * (8 - len(group)))
        out += [b.extract_element(v, i32(c)) for c in range(len(group))]
    return out


def nibbles(b, w, off):
    """The 32 nibbles (0..15) of qs at w + off, in element order: low nibbles, then high ones.
    The 16 bytes loaded into both halves (vbroadcasti128, a load), the upper half shifted by 4
    (vpsrlvd), then one vpand: no cross-lane shuffle on the port that also broadcasts."""
    qs = b.load(at(b, w, off, v16i8), align=1)
    both = b.bitcast(b.shuffle_vector(qs, ir.Constant(v16i8, ir.Undefined),
                                      ir.Constant(ir.VectorType(i32, 32), list(range(16)) * 2)), v8i32)
    shifted = b.lshr(both, ir.Constant(v8i32, [0] * 4 + [4] * 4))
    return b.and_(b.bitcast(shifted, v32i8), ir.Constant(v32i8, [15] * 32))


def f32x8_reduce(b: ir.IRBuilder, accs):
    """GGML_F32x8_REDUCE of four 8-lane accumulators: s = (a0+a2)+(a1+a3) lanewise, t = s[0:4]+s[4:8],
    result (t0+t1)+(t2+t3)."""
    s = b.fadd(b.fadd(accs[0], accs[2]), b.fadd(accs[1], accs[3]))
    t = b.fadd(lanes(b, s, [0, 1, 2, 3]), lanes(b, s, [4, 5, 6, 7]))
    e = [b.extract_element(t, i32(i)) for i in range(4)]
    return b.fadd(b.fadd(e[0], e[1]), b.fadd(e[2], e[3]))


def alloca(b: ir.IRBuilder, t: ir.Type, init, name: str):
    """A stack slot in the entry block (SROA makes it a register), stored with init here."""
    with b.goto_entry_block():
        p = b.alloca(t, name=name)
    b.store(init, p)
    return p


def scratch(b: ir.IRBuilder, t: ir.Type, count: int, name: str):
    """A stack array of count t in the entry block (column-tile scratch); returns a t*."""
    with b.goto_entry_block():
        p = b.alloca(ir.ArrayType(t, max(1, count)), name=name)
        p.align = 32
        return b.bitcast(p, t.as_pointer())


def at(b: ir.IRBuilder, base, offset, t: ir.Type):
    """Typed pointer to base (i8*) + offset bytes."""
    return typed(b, b.gep(base, [offset if isinstance(offset, ir.Value) else i64(offset)]), t)


def load_h(b: ir.IRBuilder, base, offset):
    return b.fpext(b.load(at(b, base, offset, f16), align=1), f32)


def maddubs(b, u, s):
    return b.call(intrinsic(b.module, "llvm.x86.avx2.pmadd.ub.sw", v16i16, [v32i8, v32i8]), [u, s])


def madd(b, x, y):
    """vpmaddwd: lane l = x[2l]*y[2l] + x[2l+1]*y[2l+1], i16 pairs to i32."""
    return b.call(intrinsic(b.module, "llvm.x86.avx2.pmadd.wd", v8i32, [v16i16, v16i16]), [x, y])


def _madd_ones(b, p):
    return madd(b, p, ir.Constant(v16i16, [1] * 16))


def sums_us8(b, u, s):
    """Lane l = sum over 4l..4l+3 of u (0..255) * s (-127..127): ggml's mul_sum_us8_pairs."""
    return _madd_ones(b, maddubs(b, u, s))


def psign(b, x, s):
    """x where s > 0, -x (wrapping) where s < 0, 0 where s == 0: vpsignb."""
    return b.call(intrinsic(b.module, "llvm.x86.avx2.psign.b", v32i8, [v32i8, v32i8]), [x, s])


def sums_i8(b, x, y):
    """Lane l = sum over 4l..4l+3 of x*y, both signed: ggml's mul_sum_i8_pairs (psign trick)."""
    return sums_us8(b, psign(b, x, x), psign(b, y, x))


def block_loop(b, n_blocks, accs, step):
    """for ib in [0, n_blocks): accs = step(ib, accs) with accumulators kept in stack slots."""
    slots = [alloca(b, a.type, a, "acc") for a in accs]
    with for_range(b, 0, n_blocks, name="blk") as ib:
        new = step(ib, [b.load(s) for s in slots])
        for s, v in zip(slots, new):
            b.store(v, s)
    return [b.load(s) for s in slots]


def zero8():
    return ir.Constant(v8f32, [0.0] * 8)


def const_vec(x, t: ir.Type = v8f32) -> ir.Constant:
    return ir.Constant(t, [x] * t.count)


def broadcast(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A scalar f32 in all 8 lanes."""
    v = b.insert_element(ir.Constant(v8f32, ir.Undefined), x, i32(0))
    return b.shuffle_vector(v, ir.Constant(v8f32, ir.Undefined), ir.Constant(v8i32, [0] * 8))
