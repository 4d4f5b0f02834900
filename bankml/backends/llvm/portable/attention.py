"""The llvm FLASH_ATTN kernel of the portable profile (docs/PORTABLE.md): attention.attention of
bankml/profiles/portable/ per (query row, head) (K/V head h // (H/Hkv)), step for step with the
emitters of backends/llvm/portable/funcs.py, so its bits are the reference backend's
(backends/reference/portable.py) for every thread count. Per task, the spec's steps:
  1. _quantize_q: q in blocks of 32 (quant.quantize_act, 32 lanes; the codes by
     portable.rows.nearest_quotient); _alignment: the exact score's alignment, once per q row;
  2. _scores: each score the exact integer dot of the codes times both scales rounded once:
     eight cells at a time in f64 (_scores8: vpmaddubsw dots, exact products and sums while the
     q blocks' exponent spread is within portable.f64.limit, one f64 -> f32 conversion), else
     (spread past the limit, a nonzero score below 2^-126 or from 2^127 up) per cell
     portable.exact.round_shifted (_exact_score); the scale on 8 lanes, a masked cell -inf
     without a dot (_score8); their max, any NaN, any live cell;
  3. _softmax over the n_kv cells in a stack buffer (eight -inf scores skip the exp: each is
     +0, and the sum's lanes add +0), then one recip of the tree8 sum; a row with live cells
     whose max is -inf is NaN (the softmax of -inf), one with none has no blocks;
  4. _values, per block of 32 cells with a live one (a block of none is not the document's
     block: skipped, it would add -0.0): w = r(p * s_v), 0 for a masked cell, and the
     power-of-two scale (_block_weights);
  5. _add_block: the block's exact int32 sums and one rounding (_value_block; 0 is +0, and a
     block of zero weights adds +0), blocks added in cell order into the output row (-0.0 at
     first, the sum of no blocks: _clear_out); _nan_row: a NaN score or weight makes the row NaN.

Under ActScaling PerBlock (order portable.attention_i8_per_block) step 1 is _quantize_head: the
q row one block of quant.wide_scale, its m and e given to every block of 32, so the exact score is
the one term's (steps 2-5 the same, with terms of up to 38 bits).

Threads split (query row, head) pairs; no result depends on the split. The K/V cache rows are
SET_ROWS's (backends/llvm/portable/ops.py): per (cell, K/V head) 2 bytes of f16 scale, then D int8 codes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from llvmlite import ir

from bankml.backends.llvm.portable import f64 as pf
from bankml.backends.llvm.portable import funcs as pm
from bankml.backends.llvm.emit.simd import psign, sums_us8
from bankml.backends.llvm.portable.ops import NEG0, _check, _load, _vload, _vstore
from bankml.backends.llvm.portable.rows import lane_sums, least_scale, nearest_quotient
from bankml.backends.llvm.portable.exact import room, round_shifted
from bankml.backends.llvm.emit.core import (dim, f16, f32, f64, for_range, i1, i8, i16, i32, i64, intrinsic,
    new_function, thread_range, typed, v8f32)
from bankml.backends.llvm.registry import kernel, kernel_name, kernel_type
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.profiles.portable.quant import QK, SUB_BITS, WIDE_BITS

v8i32 = ir.VectorType(i32, 8)

TERM_BITS = 34            # a score's term per block: |dot| < 2^19, m <= 15, |k scale significand| < 2^11


def _vector(b: ir.IRBuilder, xs: list, t: ir.VectorType) -> ir.Value:
    v = ir.Constant(t, ir.Undefined)
    for lane, x in enumerate(xs):
        v = b.insert_element(v, x, i32(lane))
    return v


def _any8(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1: any lane of an <8 x i1> is set."""
    return b.icmp_unsigned("!=", b.bitcast(v, ir.IntType(8)), ir.IntType(8)(0))


def _all_lanes(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1: every lane of an <n x i1> is set."""
    n = v.type.count
    return b.icmp_unsigned("==", b.bitcast(v, ir.IntType(n)), ir.IntType(n)((1 << n) - 1))


def _all8(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1: every lane of an <8 x i1> is set."""
    return b.icmp_unsigned("==", b.bitcast(v, ir.IntType(8)), ir.IntType(8)(255))


def _q_scale(b: ir.IRBuilder, amax: ir.Value, bits: int):
    """quant.act_scale (bits 4) or quant.wide_scale (bits 8) of a finite amax >= 0: (m, e) as i64."""
    m, e, _ = least_scale(b, pm.bits(b, amax), bits)
    return b.zext(m, i64), b.sext(e, i64)


def _pow2(b: ir.IRBuilder, e: ir.Value) -> ir.Value:
    """2^e as f64 for an i64 e in the normal range."""
    return b.bitcast(b.shl(b.add(e, i64(1023)), i64(52)), f64)


def _f16_parts(b: ir.IRBuilder, h: ir.Value):
    """quant.f16_parts of f16 bits h (i16): (signed significand i64, exponent i32, bad i1)."""
    u = b.zext(h, i64)
    e5, m10 = b.and_(b.lshr(u, i64(10)), i64(31)), b.and_(u, i64(1023))
    sub_ = b.icmp_signed("==", e5, i64(0))
    sig = b.select(sub_, m10, b.or_(m10, i64(1024)))
    ex = b.select(sub_, i64(-24), b.sub(e5, i64(25)))
    sig = b.select(b.icmp_unsigned("!=", b.and_(u, i64(0x8000)), i64(0)), b.sub(i64(0), sig), sig)
    return sig, b.trunc(ex, i32), b.icmp_signed("==", e5, i64(31))


class _Var:
    """A mutable local (an alloca that mem2reg makes a register)."""

    def __init__(self, b: ir.IRBuilder, t: ir.Type, init, entry: ir.IRBuilder):
        entry.position_at_start(b.function.entry_basic_block)
        self.b, self.p = b, entry.alloca(t)
        b.store(init, self.p)

    def get(self):
        return self.b.load(self.p)

    def set(self, x) -> None:
        self.b.store(x, self.p)


@dataclass
class _Attn:
    """A portable flash_attn kernel's fixed values: its builder, sizes, pointers and stack scratch."""
    fn: ir.Function
    b: ir.IRBuilder
    entry: ir.IRBuilder            # _Var's allocas
    scale: ir.Constant             # n.params["scale"] as f32
    H: int
    D: int
    nsub: int                      # q blocks of 32 per row
    R: int                         # bytes of a cache row: the f16 scale, D codes
    Hkv: int
    grp: int
    k: ir.Value
    v: ir.Value
    pq: ir.Value
    pout: ir.Value
    pmask: ir.Value
    nkv: ir.Value
    qcodes: ir.Value               # the q row's codes
    scores: ir.Value               # the cells' scores, then exp(x - max), then w
    sums: ir.Value                 # a V block's int32 sums
    raw_slot: ir.Value             # eight cells' scores
    need_slot: ir.Value            # eight cells: the exact path gives the score
    wide: bool                     # PerBlock: the q head one block, m in 128..255

    @property
    def m(self) -> ir.Module:
        return self.b.module

    @property
    def term_bits(self) -> int:
        """Bits of a score's term per q block: |dot| < 2^19, |k scale significand| < 2^11, m < 2^4
        (2^8 wide)."""
        return TERM_BITS + 4 if self.wide else TERM_BITS

    def row(self, cache, cell, hk) -> ir.Value:
        """The cache row (i8*) of (cell, K/V head hk)."""
        b = self.b
        return b.gep(cache, [b.mul(b.add(b.mul(cell, i64(self.Hkv)), hk), i64(self.R))])


class _Task(NamedTuple):
    """One (query row, head) task: its mask row, K/V head and first q (and out) element."""
    mrow: ir.Value
    hk: ir.Value
    qbase: ir.Value


class _QRow(NamedTuple):
    """The task's q row after step 1: any bad block, each block's scale m * 2^e, and the exact
    score's alignment (the least exponent emin of the nonzero blocks, their spread above it,
    the shifts, the codes as <32 x i32>)."""
    bad: ir.Value
    ms: list
    es: list
    emin: ir.Value
    spread: ir.Value
    fits: ir.Value                 # the spread within portable.exact.room: i64 lanes suffice
    sh_v: ir.Value
    ae_v: ir.Value
    emin32: ir.Value
    qv: list
    red: ir.Function               # llvm.vector.reduce.add.v32i32


class _Cells(NamedTuple):
    """The task's values that every eight cells' scores read (_score8)."""
    qf: list                       # each q block's m * 2^e in f64
    f64_row: ir.Value              # the q blocks' spread within portable.f64.limit
    qb: list                       # the q codes, <32 x i8> per block
    scale8: ir.Value


@kernel(Op.FLASH_ATTN, order=po.FLASH_ATTN, profile="portable")
def define_flash_attn(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """attention.attention per (query row, head) task, in the steps of the module's docstring."""
    return _flash_attn(m, g, n, po.FLASH_ATTN)


@kernel(Op.FLASH_ATTN, order=po.FLASH_ATTN_BLOCKS, profile="portable")
def define_flash_attn_blocks(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    """attention.attention(..., PerBlock): each q head one block of wide scale (step 1), the rest as above."""
    return _flash_attn(m, g, n, po.FLASH_ATTN_BLOCKS)


def _flash_attn(m: ir.Module, g: Graph, n: Node, order) -> ir.Function:
    a, lo, hi = _setup(m, g, n, order)
    b = a.b
    with for_range(b, lo, hi, name="task") as task:
        mrow, h = b.sdiv(task, i64(a.H)), b.srem(task, i64(a.H))
        t = _Task(mrow, b.sdiv(h, i64(a.grp)), b.mul(task, i64(a.D)))
        q = _alignment(a, *_quantize_q(a, t))                      # 1.
        mx, anynan, anylive = _scores(a, t, q)                      # 2.
        minf = b.fcmp_ordered("==", mx.get(), f32(float("-inf")))
        rownan = _clear_out(a, t, b.or_(anynan.get(), b.and_(minf, anylive)))
        with b.if_then(b.and_(anylive, b.not_(b.or_(rownan.get(), minf)))):
            r = _softmax(a, mx)                                     # 3.
            _values(a, t, r, rownan)                                # 4. and 5.
        _nan_row(a, t, rownan)
    b.ret_void()
    return a.fn


def _setup(m: ir.Module, g: Graph, n: Node, order) -> tuple[_Attn, ir.Value, ir.Value]:
    """The node's shapes checked, the function, its scratch and this thread's tasks [lo, hi)."""
    _check(n, order)
    qn, kn, vn, mn = (g[i] for i in n.inputs)
    M, H, D = qn.shape
    Hkv, n_kv = kn.shape[1], mn.shape[1]
    if (kn.dtype, vn.dtype) != (po.CACHE_TYPE, po.CACHE_TYPE) or D % QK or D > 256 or H % Hkv \
            or tuple(kn.shape[1:]) != (Hkv, D) or tuple(vn.shape[1:]) != (Hkv, D) or mn.dtype != "f16":
        raise LoweringError(f"llvm portable profile: flash_attn {n.name or n.id}: q{qn.shape} k {kn.dtype}{kn.shape} "
                            f"v {vn.dtype}{vn.shape} mask {mn.dtype}{mn.shape} do not fit")
    scale = np.float32(n.params["scale"])
    fn, b = new_function(m, kernel_name(n), kernel_type(n))
    out, q, k, v, mask, ith, nth, dims = fn.args
    pq, pout, pmask = typed(b, q, f32), typed(b, out, f32), typed(b, mask, f16)
    nkv = dim(b, dims, n_kv)
    entry = ir.IRBuilder()
    qcodes = b.alloca(i8, size=D, name="qcodes")
    scores = b.alloca(f32, size=nkv, name="scores")
    sums = b.alloca(i32, size=D, name="sums")
    raw_slot = b.alloca(ir.ArrayType(f32, 8), name="raw8")
    need_slot = b.alloca(ir.ArrayType(i8, 8), name="need8")
    a = _Attn(fn, b, entry, f32(float(scale)), H, D, D // QK, 2 + D, Hkv, H // Hkv,
              k, v, pq, pout, pmask, nkv, qcodes, scores, sums, raw_slot, need_slot, order == po.FLASH_ATTN_BLOCKS)
    lo, hi = thread_range(b, b.mul(dim(b, dims, M), i64(H)), ith, nth)
    return a, lo, hi


def _quantize_q(a: _Attn, t: _Task) -> tuple:
    """1. The q row in blocks of 32 into a.qcodes (quant.quantize_act): any bad block, each block's m, e."""
    if a.wide:
        return _quantize_head(a, t)
    b = a.b
    v32i8, v32i32 = ir.VectorType(i8, QK), ir.VectorType(i32, QK)
    badq = i1(0)
    ms, es = [], []
    v32f32, v32f64, v32i64 = ir.VectorType(f32, QK), ir.VectorType(f64, QK), ir.VectorType(i64, QK)
    for sb in range(a.nsub):
        x = _load(b, a.pq, b.add(t.qbase, i64(sb * QK)), v32f32)
        ax = pm.fabs(b, x)
        fin = b.fcmp_ordered("<", ax, pm.const(v32f32, float("inf")))
        blk_bad = b.not_(_all_lanes(b, fin))
        abits = b.select(fin, pm.bits(b, ax), pm.const(v32i32, 0))           # |x| bits order as |x|
        umax = intrinsic(a.m, "llvm.vector.reduce.umax.v32i32", i32, [v32i32])
        amax = b.bitcast(b.call(umax, [abits]), f32)
        mq, eq = _q_scale(b, b.select(blk_bad, f32(0.0), amax), SUB_BITS)
        inv = _pow2(b, b.sub(i64(0), eq))
        div = b.sitofp(b.select(b.icmp_signed("==", mq, i64(0)), i64(1), mq), f64)
        zero_codes = b.or_(blk_bad, b.icmp_signed("==", mq, i64(0)))
        y = nearest_quotient(b, b.fmul(b.fpext(x, v32f64), pm.splat(b, inv, v32f64)), div)  # x 2^-e / m
        y = b.select(b.fcmp_ordered(">", y, pm.const(v32f64, 127.0)), pm.const(v32f64, 127.0), y)
        y = b.select(b.fcmp_ordered("<", y, pm.const(v32f64, -127.0)), pm.const(v32f64, -127.0), y)
        ya = b.and_(b.bitcast(y, v32i64), pm.const(v32i64, (1 << 63) - 1))
        finy = b.icmp_unsigned("<", ya, pm.const(v32i64, 0x7FF0000000000000))
        ok = b.and_(finy, pm.splat(b, b.not_(zero_codes), ir.VectorType(i1, QK)))
        code = b.select(ok, b.fptosi(y, v32i8), pm.const(v32i8, 0))
        b.store(code, _codes_at(b, a.qcodes, sb), align=1)
        badq = b.or_(badq, blk_bad)
        ms.append(mq)
        es.append(eq)
    return badq, ms, es


def _quantize_head(a: _Attn, t: _Task) -> tuple:
    """1. PerBlock: the q row as one block (attention.quantize_head(q, PER_BLOCK): quant.
    wide_scale of its absmax, each code rint(x·2^-e / m) by one f64 division), its m and e given
    to every block of 32 (the exact score is the one term's)."""
    b = a.b
    v32i8, v32i32 = ir.VectorType(i8, QK), ir.VectorType(i32, QK)
    v32f32, v32f64, v32i64 = ir.VectorType(f32, QK), ir.VectorType(f64, QK), ir.VectorType(i64, QK)
    umax = intrinsic(a.m, "llvm.vector.reduce.umax.v32i32", i32, [v32i32])
    xs, bad, amax = [], i1(0), i32(0)
    for sb in range(a.nsub):
        x = _load(b, a.pq, b.add(t.qbase, i64(sb * QK)), v32f32)
        ax = pm.fabs(b, x)
        fin = b.fcmp_ordered("<", ax, pm.const(v32f32, float("inf")))
        bad = b.or_(bad, b.not_(_all_lanes(b, fin)))
        top = b.call(umax, [b.select(fin, pm.bits(b, ax), pm.const(v32i32, 0))])     # |x| bits order as |x|
        amax = b.select(b.icmp_unsigned(">", top, amax), top, amax)
        xs.append(x)
    mq, eq = _q_scale(b, b.select(bad, f32(0.0), b.bitcast(amax, f32)), WIDE_BITS)
    inv = pm.splat(b, _pow2(b, b.sub(i64(0), eq)), v32f64)
    div = pm.splat(b, b.sitofp(b.select(b.icmp_signed("==", mq, i64(0)), i64(1), mq), f64), v32f64)
    zero_codes = pm.splat(b, b.or_(bad, b.icmp_signed("==", mq, i64(0))), ir.VectorType(i1, QK))
    roundeven = intrinsic(a.m, "llvm.roundeven.v32f64", v32f64, [v32f64])
    for sb, x in enumerate(xs):
        y = b.call(roundeven, [b.fdiv(b.fmul(b.fpext(x, v32f64), inv), div)])
        y = b.select(b.fcmp_ordered(">", y, pm.const(v32f64, 127.0)), pm.const(v32f64, 127.0), y)
        y = b.select(b.fcmp_ordered("<", y, pm.const(v32f64, -127.0)), pm.const(v32f64, -127.0), y)
        finy = b.icmp_unsigned("<", b.and_(b.bitcast(y, v32i64), pm.const(v32i64, (1 << 63) - 1)),
                               pm.const(v32i64, 0x7FF0000000000000))
        code = b.select(b.and_(finy, b.not_(zero_codes)), b.fptosi(y, v32i8), pm.const(v32i8, 0))
        b.store(code, _codes_at(b, a.qcodes, sb), align=1)
    return bad, [mq] * a.nsub, [eq] * a.nsub


def _codes_at(b: ir.IRBuilder, qcodes, sb: int) -> ir.Value:
    """<32 x i8>* to q block sb's codes."""
    return b.bitcast(b.gep(qcodes, [i64(sb * QK)]), ir.VectorType(i8, QK).as_pointer())


def _alignment(a: _Attn, badq, ms: list, es: list) -> _QRow:
    """1. The exact score's alignment (portable.exact.round_shifted's): least exponent, shifts, spread."""
    b = a.b
    big = i64(1 << 40)
    emin = big
    for mq, eq in zip(ms, es):
        emin = b.select(b.and_(b.icmp_signed("!=", mq, i64(0)), b.icmp_signed("<", eq, emin)), eq, emin)
    emin = b.select(b.icmp_signed("==", emin, big), i64(0), emin)
    shifts, spread = [], i64(0)
    for mq, eq in zip(ms, es):
        sh = b.select(b.icmp_signed("!=", mq, i64(0)), b.sub(eq, emin), i64(0))
        shifts.append(sh)
        spread = b.select(b.icmp_signed(">", sh, spread), sh, spread)
    fits = b.icmp_signed("<=", spread, i64(room(a.term_bits, a.nsub)))
    vn32 = ir.VectorType(i32, a.nsub)
    sh_v = _vector(b, [b.trunc(sh, i32) for sh in shifts], vn32)
    ae_v = _vector(b, [b.trunc(eq, i32) for eq in es], vn32)
    emin32 = b.trunc(emin, i32)
    v32i32 = ir.VectorType(i32, QK)
    qv = [b.sext(b.load(_codes_at(b, a.qcodes, sb), align=1), v32i32) for sb in range(a.nsub)]
    red = intrinsic(a.m, "llvm.vector.reduce.add.v32i32", i32, [v32i32])
    return _QRow(badq, ms, es, emin, spread, fits, sh_v, ae_v, emin32, qv, red)


def _scores(a: _Attn, t: _Task, q: _QRow) -> tuple[_Var, _Var, ir.Value]:
    """2. The scores r(q.k * scale), -inf for a masked cell, into a.scores (attention.attention);
    their max, any NaN, any live cell (i1)."""
    b = a.b
    # eight cells at a time: lane-wise running max (a tie of +-0 picks either: no bit
    # depends on the max's zero sign), any NaN and any live cell, folded after the cells
    v8i1 = ir.VectorType(i1, 8)
    vmx, vnan = _Var(b, v8f32, pm.const(v8f32, float("-inf")), a.entry), _Var(b, v8i1, pm.const(v8i1, 0), a.entry)
    vlive = _Var(b, v8i1, pm.const(v8i1, 0), a.entry)
    cells = _cells(a, t, q)
    with for_range(b, 0, a.nkv, 8, name="j8") as j8:
        sc, masked = _score8(a, t, q, cells, j8)
        _vstore(b, sc, a.scores, j8)
        cur = vmx.get()
        vmx.set(b.select(b.fcmp_ordered(">", sc, cur), sc, cur))
        vnan.set(b.or_(vnan.get(), pm.is_nan(b, sc)))
        vlive.set(b.or_(vlive.get(), b.not_(masked)))
    lanes = vmx.get()
    mx_all = b.extract_element(lanes, i32(0))
    for lane in range(1, 8):
        x = b.extract_element(lanes, i32(lane))
        mx_all = b.select(b.fcmp_ordered(">", x, mx_all), x, mx_all)
    return _Var(b, f32, mx_all, a.entry), _Var(b, i1, _any8(b, vnan.get()), a.entry), _any8(b, vlive.get())


def _cells(a: _Attn, t: _Task, q: _QRow) -> _Cells:
    """2. (once per task) the q scales and codes of _scores8."""
    b = a.b
    qf = [b.fmul(b.sitofp(mq, f64), _pow2(b, eq)) for mq, eq in zip(q.ms, q.es)]    # m * 2^e, 0 for m = 0
    f64_row = b.icmp_signed("<=", q.spread, i64(pf.limit(a.term_bits, a.nsub)))
    qb = [b.load(_codes_at(b, a.qcodes, sb), align=1) for sb in range(a.nsub)]
    return _Cells(qf, f64_row, qb, pm.splat(b, a.scale, v8f32))


def _score8(a: _Attn, t: _Task, q: _QRow, cells: _Cells, j8) -> tuple:
    """2. Eight cells' scores from j8: _scores8, else _exact_cells; then r(s * scale), NaN for a
    bad q block or K scale, -inf for a masked cell whatever its K row (no dots when all eight
    are). Returns the scores and which cells are masked."""
    b = a.b
    v8i1, ninf8 = ir.VectorType(i1, 8), pm.const(v8f32, float("-inf"))
    rows = [a.row(a.k, b.add(j8, i64(c)), t.hk) for c in range(8)]
    words = ir.Constant(pf.v8i16, [0] * 8)                     # the eight K scales' f16 bits
    for c, row in enumerate(rows):
        words = b.insert_element(words, b.load(b.bitcast(row, i16.as_pointer()), align=1), i32(c))
    kbad = b.icmp_unsigned("==", b.and_(words, pm.const(pf.v8i16, 0x7C00)), pm.const(pf.v8i16, 0x7C00))
    bad = b.or_(pm.splat(b, q.bad, v8i1), kbad)
    masked = _masked8(a, t, j8)
    with b.if_then(b.not_(_all8(b, masked))):                  # eight masked cells: no dots
        raw8, need8 = _scores8(b, rows, words, cells.qb, cells.qf, cells.f64_row, a.nsub)
        need8 = b.and_(need8, b.not_(masked))
        b.store(raw8, b.bitcast(a.raw_slot, v8f32.as_pointer()), align=4)
        with b.if_then(_any8(b, need8), likely=False):
            _exact_cells(a, t, q, j8, need8)
    score = b.load(b.bitcast(a.raw_slot, v8f32.as_pointer()), align=4)
    sc = pm.mul(b, pm.with_bits(b, bad, pm.QNAN, score), cells.scale8)
    return b.select(masked, ninf8, sc), masked


def _exact_cells(a: _Attn, t: _Task, q: _QRow, j8, need8) -> None:
    """2. The scores of need8's cells (of the eight from j8) by _exact_score into a.raw_slot."""
    b = a.b
    v8i8 = ir.VectorType(i8, 8)
    b.store(b.zext(need8, v8i8), b.bitcast(a.need_slot, v8i8.as_pointer()), align=1)
    with for_range(b, 0, 8, name="jc") as jc:
        with b.if_then(b.icmp_unsigned("!=", b.load(b.gep(a.need_slot, [i32(0), jc])), i8(0))):
            krow = a.row(a.k, b.add(j8, jc), t.hk)
            ks, kx, _ = _f16_parts(b, b.load(b.bitcast(krow, i16.as_pointer()), align=1))
            b.store(_exact_score(b, krow, q, ks, kx), b.gep(a.raw_slot, [i32(0), jc]))


def _clear_out(a: _Attn, t: _Task, nan) -> _Var:
    """5. The output row to -0.0 (the sum of no blocks); returns rownan: so far, nan (i1)."""
    b = a.b
    rownan = _Var(b, i1, nan, a.entry)
    neg0 = pm.const(v8f32, NEG0)
    with for_range(b, 0, a.D, 8, name="o") as o:
        _vstore(b, neg0, a.pout, b.add(t.qbase, o))
    return rownan


def _softmax(a: _Attn, mx: _Var) -> ir.Value:
    """3. funcs.softmax of a row whose max is finite: exp(x - max) in place in a.scores; returns
    r(1/tree8 sum)."""
    b = a.b
    ninf8 = pm.const(v8f32, float("-inf"))
    mxs = pm.splat(b, mx.get(), v8f32)
    lanes = _Var(b, v8f32, pm.const(v8f32, NEG0), a.entry)
    zero8 = pm.const(v8f32, 0.0)
    with for_range(b, 0, a.nkv, 8, name="e") as j:
        x = _vload(b, a.scores, j)
        # eight -inf scores (masked cells): exp(-inf - max) is +0 for the finite max
        with b.if_else(_all8(b, b.fcmp_ordered("==", x, ninf8))) as (masked8, live8):
            with masked8:
                _vstore(b, zero8, a.scores, j)
                lanes.set(pm.add(b, lanes.get(), zero8))
            with live8:
                e = pm.exp(b, pm.sub(b, x, mxs))
                _vstore(b, e, a.scores, j)
                lanes.set(pm.add(b, lanes.get(), e))
    return pm.recip(b, pm.tree(b, lanes.get()))


def _masked8(a: _Attn, t: _Task, j) -> ir.Value:
    """<8 x i1>: cells j..j+7 are masked (their mask -inf) for the task's row."""
    b = a.b
    mk = _vload(b, a.pmask, b.add(b.mul(t.mrow, a.nkv), j), ir.VectorType(f16, 8))
    return b.fcmp_ordered("==", b.fpext(mk, v8f32), pm.const(v8f32, float("-inf")))


def _values(a: _Attn, t: _Task, r, rownan: _Var) -> None:
    """4. and 5. Per block of 32 cells with a live one, in order: w = r(p * s_v), the block added
    into the output row."""
    b = a.b
    with for_range(b, 0, b.sdiv(a.nkv, i64(QK)), name="blk") as blk:
        dead = [_all8(b, _masked8(a, t, b.add(b.mul(blk, i64(QK)), i64(c8)))) for c8 in range(0, QK, 8)]
        with b.if_then(b.not_(b.and_(b.and_(dead[0], dead[1]), b.and_(dead[2], dead[3])))):
            _add_block(a, t, blk, *_block_weights(a, t, blk, r), rownan)


def _block_weights(a: _Attn, t: _Task, blk, r) -> tuple:
    """4. w = r(p * s_v) of the block's cells in place of p, 0 for a masked cell
    (attention.attention): max |w|, any NaN, any inf."""
    b = a.b
    v8i1, zero8f = ir.VectorType(i1, 8), pm.const(v8f32, 0.0)
    vamax = _Var(b, v8f32, pm.const(v8f32, 0.0), a.entry)  # |w| lane-wise: max in any order
    wnan, winf = _Var(b, v8i1, pm.const(v8i1, 0), a.entry), _Var(b, v8i1, pm.const(v8i1, 0), a.entry)
    r8 = pm.splat(b, r, v8f32)
    with for_range(b, 0, QK, 8, name="w") as jj:
        j = b.add(b.mul(blk, i64(QK)), jj)
        svw = ir.Constant(ir.VectorType(f16, 8), ir.Undefined)
        for c in range(8):
            sv = b.load(b.bitcast(a.row(a.v, b.add(j, i64(c)), t.hk), f16.as_pointer()), align=1)
            svw = b.insert_element(svw, sv, i32(c))
        w = pm.mul(b, pm.mul(b, _vload(b, a.scores, j), r8), pm.canon(b, b.fpext(svw, v8f32)))
        w = b.select(_masked8(a, t, j), zero8f, w)
        _vstore(b, w, a.scores, j)
        aw = pm.fabs(b, w)
        cur = vamax.get()
        vamax.set(b.select(b.fcmp_ordered(">", aw, cur), aw, cur))
        wnan.set(b.or_(wnan.get(), pm.is_nan(b, w)))
        winf.set(b.or_(winf.get(), b.fcmp_ordered("==", aw, pm.const(v8f32, float("inf")))))
    lanes8 = vamax.get()
    amax = _Var(b, f32, b.extract_element(lanes8, i32(0)), a.entry)
    for lane in range(1, 8):
        x, cur = b.extract_element(lanes8, i32(lane)), amax.get()
        amax.set(b.select(b.fcmp_ordered(">", x, cur), x, cur))
    return amax, _any8(b, wnan.get()), _any8(b, winf.get())


def _add_block(a: _Attn, t: _Task, blk, amax: _Var, wnan, winf, rownan: _Var) -> None:
    """5. The block's r(2^E * Σ W_j v_j) into the output row (_value_block; all w zero: +0 added);
    NaN w: the row NaN, inf: -inf."""
    b = a.b
    with b.if_then(wnan):
        rownan.set(i1(1))
    nonzero = b.fcmp_ordered(">", amax.get(), f32(0.0))
    with b.if_else(winf) as (then, otherwise):
        with then:       # the spec's W*v of an infinite w is NaN, cast to int64's least value
            ninf = pm.const(v8f32, float("-inf"))
            with for_range(b, 0, a.D, 8, name="oi") as o:
                at = b.add(t.qbase, o)
                _vstore(b, pm.add(b, _vload(b, a.pout, at), ninf), a.pout, at)
        with otherwise:
            with b.if_else(nonzero) as (some, none):
                with some:
                    with b.if_then(b.not_(wnan)):
                        _value_block(a, t, blk, amax.get())
                with none:         # every sum 0: +0 added (a -0.0 so far becomes +0)
                    zero8 = pm.const(v8f32, 0.0)
                    with for_range(b, 0, a.D, 8, name="oz") as o:
                        at = b.add(t.qbase, o)
                        _vstore(b, pm.add(b, _vload(b, a.pout, at), zero8), a.pout, at)


def _nan_row(a: _Attn, t: _Task, rownan: _Var) -> None:
    """5. The output row NaN where a score or a weight was (attention.attention's nan)."""
    b = a.b
    with b.if_then(rownan.get()):
        nan = pm.const(v8f32, float("nan"))
        with for_range(b, 0, a.D, 8, name="on") as o:
            _vstore(b, pm.canon(b, nan), a.pout, b.add(t.qbase, o))


def _scores8(b, rows: list, words, qb: list, qf: list, f64_row, nsub: int):
    """The scores of eight cells (their K rows, one K/V head; words their scales' f16 bits) in
    f64 (portable.f64's argument): each sub-block's exact integer dot (vpmaddubsw lanes), times
    the q block's scale m * 2^e, summed over the sub-blocks, times the K row's f16 scale: every
    product and sum exact when the q blocks' exponent spread is within
    portable.f64.limit(TERM_BITS, nsub) (f64_row), and one f64 -> f32 conversion rounds it once
    as round_exact does, +0 for an exact zero. Returns <8 x f32> the scores and <8 x i1> true
    where the exact path must give the cell's score instead (f64_row false, or a nonzero |score|
    below 2^-126 or at least 2^127). A bad K scale gives NaN or inf here; its cell is NaN
    either way (the caller's bad select)."""
    acc = None
    for sb in range(nsub):
        lanes = []
        for row in rows:
            kc = b.load(b.bitcast(b.gep(row, [i64(2 + sb * QK)]), qb[sb].type.as_pointer()), align=1)
            lanes.append(sums_us8(b, psign(b, kc, kc), psign(b, qb[sb], kc)))     # pair sums < 2^15
        t = b.fmul(b.sitofp(lane_sums(b, lanes), pf.v8f64), pm.splat(b, qf[sb], pf.v8f64))
        acc = t if acc is None else b.fadd(acc, t)
    s = b.fmul(acc, pf.f16_values(b, words))
    v8i64 = ir.VectorType(i64, 8)
    a = b.bitcast(b.and_(b.bitcast(s, v8i64), pm.const(v8i64, (1 << 63) - 1)), pf.v8f64)       # |s|
    tiny = b.and_(b.fcmp_ordered("<", a, pm.const(pf.v8f64, pf.TINY)), b.fcmp_ordered("!=", a, pm.const(pf.v8f64, 0.0)))
    need = b.or_(b.or_(tiny, b.fcmp_ordered(">=", a, pm.const(pf.v8f64, 2.0 ** 127))),
                 pm.splat(b, b.not_(f64_row), ir.VectorType(i1, 8)))
    r = b.fadd(b.fptrunc(s, v8f32), pm.const(v8f32, 0.0))
    return r, need


def _exact_score(b, krow, q: _QRow, ks, kx):
    """The cell's score by the exact path: q block sb . k block sb times both scales'
    significands, the terms aligned once (portable.exact.round_shifted)."""
    qv, ms, red, nsub = q.qv, q.ms, q.red, len(q.qv)
    terms = []
    for sb in range(nsub):
        kc = b.sext(b.load(b.bitcast(b.gep(krow, [i64(2 + sb * QK)]), ir.VectorType(i8, QK).as_pointer()), align=1),
                    qv[sb].type)
        dot = b.sext(b.call(red, [b.mul(kc, qv[sb])]), i64)                      # |.| < 2^19
        terms.append(b.mul(b.mul(dot, ms[sb]), ks))                             # |.| < 2^34
    kxv = pm.splat(b, kx, q.ae_v.type)
    return round_shifted(b, _vector(b, terms, ir.VectorType(i64, nsub)), q.sh_v, b.add(q.emin32, kx), q.fits,
                         b.add(q.ae_v, kxv))


def _value_block(a: _Attn, t: _Task, blk, amax) -> None:
    """5. One block of 32 cells with max |w| = amax > 0 (finite): E (attention._pow2_scale),
    W_j = rint(w_j / 2^E), the exact sums Σ W_j v_j (int32), r(2^E * sum) (+0 for 0) added
    into the output row."""
    b = a.b
    v8i8 = ir.VectorType(i8, 8)
    u = b.zext(pm.bits(b, amax), i64)
    c = b.or_(b.and_(u, i64(0x7FFFFF)), i64(0x800000))
    p = b.sub(b.and_(b.lshr(u, i64(23)), i64(255)), i64(127))
    E = b.select(b.icmp_signed("<=", c, i64(127 << 17)), b.sub(p, i64(6)), b.sub(p, i64(5)))
    inv = _pow2(b, b.sub(i64(0), E))
    zero8 = pm.const(v8i32, 0)
    with for_range(b, 0, a.D, 8, name="z") as o:
        _vstore(b, zero8, a.sums, o)
    with for_range(b, 0, QK, name="wc") as jj:
        j = b.add(b.mul(blk, i64(QK)), jj)
        w = b.fpext(b.load(b.gep(a.scores, [j])), f64)
        W = b.fptosi(pm.roundeven(b, b.fmul(w, inv)), i32)                          # exact, |W| <= 127
        with b.if_then(b.icmp_signed("!=", W, i32(0))):
            vcodes = b.gep(a.v, [b.add(b.mul(b.add(b.mul(j, i64(a.Hkv)), t.hk), i64(a.R)), i64(2))])
            Wv = pm.splat(b, W, v8i32)
            with for_range(b, 0, a.D, 8, name="acc") as o:
                vc = b.sext(_vload(b, vcodes, o, v8i8), v8i32)
                _vstore(b, b.add(_vload(b, a.sums, o, v8i32), b.mul(Wv, vc)), a.sums, o)
    E8 = pm.splat(b, b.trunc(E, i32), v8i32)
    with for_range(b, 0, a.D, 8, name="r") as o:
        r = pm.scale2(b, b.sitofp(_vload(b, a.sums, o, v8i32), v8f32), E8)
        at = b.add(t.qbase, o)
        _vstore(b, pm.add(b, _vload(b, a.pout, at), r), a.pout, at)
