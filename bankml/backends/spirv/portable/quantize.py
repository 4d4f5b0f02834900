"""The portable profile's activation quantizers and int8 cache rows as SPIR-V, bit for bit the
numpy spec (quant.quantize_act / quant.quantize_blocks, attention.cache_row; docs/spirv.md).

`emit_quantize`: one invocation per block of `block` (32, 64, 128 or 256) elements. The block's
values are read canonical (a denormal a zero); bad = any inf or NaN; amax the largest magnitude
(as bits) of the finite ones, 0 for a bad block; (m, e) = quant._least_scale(amax, bits) from
amax's bits (bits = 4: m in 8..15, Sub32; 8: m in 128..255, PerBlock): with C the 24-bit
significand and p the exponent, d = 127·2^(17-bits), m1 = ceil(C/d), m2 = ceil(C/2d), m = m1 at
e = p-6-bits when m1 < 2^bits, else m2 at e = p-5-bits. Each code is the nearest integer (ties to
even) of x/(m·2^e), by integers: x = C·2^(q-150) (q its biased exponent field) and q-150-e is
below -8 (x's exponent is at most amax's), so the code is C / (m·2^t), t = e+150-q, rounded half
even from the u64 quotient and remainder (t capped at 40: a quotient past it is below 1/2 either
way). That is the exact quotient's nearest integer, which the spec's f64 division also gives
(quant._quantize's comment; ties are exact in f64). Codes within +-127 (never reached past:
|x| <= amax <= 127·m·2^e), 0 for m = 0 and for bad blocks. No float instruction at all.

    codes  u32 words: the int8 codes in x's order (K bytes per row)
    info   2 u32 per block: m | bad << 8, e (two's complement), kernels.act_buffers' layout

`emit_cache_row`: one invocation per row of D. amax as funcs.absmax (magnitude bits, a NaN passed
over, from +0), t = Emit.fmul(amax, INV_127), its f16 by integers (nearest even on the 13 dropped
bits, or on 126 - field bits into the f16 subnormal range, 0x7C00 past 65504 rounded), s that f16
as f32 (exact), inv = Emit.recip(s), each code of Emit.fmul(x, inv): NaN -> 0, magnitude >= 127 ->
+-127, else its significand shifted right by 150 - field, nearest even (integer rint); every code
0 when inv is infinite (s = 0).

    scale  u32 per row: the f16 bits
    codes  u32 words: ceil(D/4) per row, the row's int8 codes

    k = PortableKernels(runtime.open_device(0))
    a = quantize_act(k, x)              # quant.ActBlocks, == quant.quantize_act(x)
    a = quantize_blocks(k, x, 128)      # == quant.quantize_blocks(x, 128)
    rows = cache_rows(k, x)             # rows of attention.cache_dtype(D), == attention.cache_row(x)
"""
from __future__ import annotations

import functools

import numpy as np

from bankml.backends.spirv.portable.emit import EXP, MAG, SIGN, Emit
from bankml.backends.spirv.portable.kernels import LOCAL, _f16_to_f32, _f32_at, _Module, _store
from bankml.errors import BankmlError
from bankml.profiles.portable import attention, quant
from bankml.profiles.portable.tables import constants

BLOCKS = (32, 64, 128, 256)
MAX_GROUPS = 65535                # workgroups in x per dispatch (Vulkan's minimum limit)


def _least_scale(e: Emit, amax: int, bits: int) -> tuple[int, int]:
    """quant._least_scale of amax's magnitude bits (finite, canonical): (m, e as i32); (0, 0) for 0."""
    be = e.u("ShiftRightLogical", amax, e.c(23))
    c = e.u("BitwiseOr", e.u("BitwiseAnd", amax, e.c(0x7FFFFF)), e.c(0x800000))
    p = e.u("ISub", be, e.c(127))
    sb = e.u("ISub", e.c(17), bits)
    d = e.u("ShiftLeftLogical", e.c(127), sb)
    d2 = e.u("ShiftLeftLogical", d, e.c(1))
    m1 = e.u("UDiv", e.u("ISub", e.u("IAdd", c, d), e.c(1)), d)
    m2 = e.u("UDiv", e.u("ISub", e.u("IAdd", c, d2), e.c(1)), d2)
    small = e.b("ULessThan", m1, e.u("ShiftLeftLogical", e.c(1), bits))
    m = e.sel(small, m1, m2)
    ex = e.u("ISub", p, e.u("IAdd", bits, e.sel(small, e.c(6), e.c(5))))
    zero = e.b("IEqual", amax, e.c(0))
    return e.sel(zero, e.c(0), m), e.sel(zero, e.c(0), ex)


def _code(e: Emit, xb: int, m: int, ex: int) -> int:
    """The code (u32, two's complement int8 in the low byte's sign-extended value) of the
    canonical f32 bits xb at scale m·2^ex (m >= 1): C / (m·2^t) rounded half even, signed."""
    q = e.u("BitFieldUExtract", xb, e.c(23), e.c(8))
    c = e.sel(e.b("IEqual", q, e.c(0)), e.c(0), e.u("BitwiseOr", e.u("BitwiseAnd", xb, e.c(0x7FFFFF)), e.c(0x800000)))
    t = e.u("ISub", e.u("IAdd", ex, e.c(150)), q)                           # >= 9 for a nonzero x
    t = e.sel(e.b("SGreaterThan", t, e.c(40)), e.c(40), t)
    t = e.sel(e.b("SLessThan", t, e.c(0)), e.c(0), t)                       # (a zero x only)
    den = e.w("ShiftLeftLogical", e.zext64(m), e.zext64(t))
    c64 = e.zext64(c)
    qq = e.w("UDiv", c64, den)
    r2 = e.w("ShiftLeftLogical", e.w("ISub", c64, e.w("IMul", qq, den)), e.c64(1))
    odd = e.b("INotEqual", e.w("BitwiseAnd", qq, e.c64(1)), e.c64(0))
    up = e.b("LogicalOr", e.b("UGreaterThan", r2, den), e.b("LogicalAnd", e.b("IEqual", r2, den), odd))
    n = e.lo32(e.w("IAdd", qq, e.sel64(up, e.c64(1), e.c64(0))))
    n = e.sel(e.b("UGreaterThan", n, e.c(127)), e.c(127), n)
    neg = e.b("INotEqual", e.u("BitwiseAnd", xb, e.c(SIGN)), e.c(0))
    return e.sel(neg, e.u("ISub", e.c(0), n), n)


def _pack(e: Emit, codes: list[int]) -> int:
    """Four codes (low bytes) into one little-endian u32 word."""
    w = e.u("BitwiseAnd", codes[0], e.c(0xFF))
    for j in range(1, 4):
        w = e.u("BitwiseOr", w, e.u("ShiftLeftLogical", e.u("BitwiseAnd", codes[j], e.c(0xFF)), e.c(8 * j)))
    return w


@functools.cache
def emit_quantize(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """quant._quantize per block: bindings 0 x f32[blocks*block], 1 codes u32[blocks*block/4],
    2 info u32[2*blocks]. Push: blocks, block, bits (4 or 8), blk0 (the first block of this
    dispatch)."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf = k.buffer("x", m.f32)
    cbuf = k.buffer("codes", m.u32, writable=True)
    ibuf = k.buffer("info", m.u32, writable=True)
    e, (blocks, block, bits, blk0), gid = k.start(["blocks", "block", "bits", "blk0"])
    f, u32 = e.f, m.u32
    blk = e.u("IAdd", gid, blk0)
    with f.if_then(e.b("ULessThan", blk, blocks), "valid"):
        base = e.u("IMul", blk, block)
        amax, bad = e.var(u32, "amax", e.c(0)), e.var(u32, "bad", e.c(0))
        with f.loop(block, "amax") as i:
            mag = e.mag(_f32_at(e, xbuf, e.u("IAdd", base, i)))
            fin = e.b("ULessThan", mag, e.c(EXP))
            f.store(amax, e.sel(e.b("LogicalAnd", fin, e.b("UGreaterThan", mag, f.load(u32, amax))),
                                mag, f.load(u32, amax)))
            f.store(bad, e.sel(fin, f.load(u32, bad), e.c(1)))
        isbad = e.b("INotEqual", f.load(u32, bad), e.c(0))
        ms, ex = _least_scale(e, e.sel(isbad, e.c(0), f.load(u32, amax)), bits)
        dead = e.b("LogicalOr", isbad, e.b("IEqual", ms, e.c(0)))
        m1 = e.sel(dead, e.c(1), ms)
        with f.loop(e.u("ShiftRightLogical", block, e.c(2)), "codes") as w:
            i0 = e.u("IAdd", base, e.u("ShiftLeftLogical", w, e.c(2)))
            cs = [_code(e, e.bits(_f32_at(e, xbuf, e.u("IAdd", i0, e.c(j)))), m1, ex) for j in range(4)]
            _store(e, cbuf, e.u("ShiftRightLogical", i0, e.c(2)), e.sel(dead, e.c(0), _pack(e, cs)), u32)
        _store(e, ibuf, e.u("ShiftLeftLogical", blk, e.c(1)),
               e.u("BitwiseOr", ms, e.sel(isbad, e.c(1 << 8), e.c(0))), u32)
        _store(e, ibuf, e.u("IAdd", e.u("ShiftLeftLogical", blk, e.c(1)), e.c(1)), ex, u32)
    f.end()
    return tuple(m.words())


def _f16_bits(e: Emit, t: int) -> int:
    """The f16 bits nearest (ties to even) to the f32 bits t (+0, normal or +inf): 0x7C00 past the
    f16 range, the f16 subnormals kept, 0 below half the least."""
    be = e.u("ShiftRightLogical", t, e.c(23))
    sig = e.zext64(e.u("BitwiseOr", e.u("BitwiseAnd", t, e.c(0x7FFFFF)), e.c(0x800000)))
    normal = e.b("UGreaterThanEqual", be, e.c(113))
    hn = e.u("IAdd", e.u("ShiftLeftLogical", e.u("ISub", be, e.c(113)), e.c(10)), e.lo32(e.rne_shift64(sig, e.c(13))))
    hn = e.sel(e.b("UGreaterThan", hn, e.c(0x7C00)), e.c(0x7C00), hn)
    sh = e.u("ISub", e.c(126), be)
    sh = e.sel(e.b("UGreaterThan", sh, e.c(60)), e.c(60), sh)
    hs = e.lo32(e.rne_shift64(sig, e.sel(normal, e.c(13), sh)))
    h = e.sel(normal, hn, hs)
    h = e.sel(e.b("UGreaterThanEqual", t, e.c(EXP)), e.c(0x7C00), h)
    return e.sel(e.b("IEqual", t, e.c(0)), e.c(0), h)


def _rint_code(e: Emit, pb: int) -> int:
    """int8_codes of one product's bits: NaN -> 0, within +-127, else nearest integer, ties even."""
    mag = e.u("BitwiseAnd", pb, e.c(MAG))
    be = e.u("ShiftRightLogical", mag, e.c(23))
    sig = e.zext64(e.u("BitwiseOr", e.u("BitwiseAnd", mag, e.c(0x7FFFFF)), e.c(0x800000)))
    sh = e.u("ISub", e.c(150), be)                                   # >= 17 below 127
    sh = e.sel(e.b("SGreaterThan", sh, e.c(60)), e.c(60), sh)
    sh = e.sel(e.b("SLessThan", sh, e.c(1)), e.c(1), sh)
    n = e.lo32(e.rne_shift64(sig, sh))
    n = e.sel(e.b("UGreaterThanEqual", mag, e.c(0x42FE0000)), e.c(127), n)       # 127.0 and up, inf
    n = e.sel(e.b("IEqual", be, e.c(0)), e.c(0), n)
    n = e.sel(e.b("UGreaterThan", mag, e.c(EXP)), e.c(0), n)
    neg = e.b("INotEqual", e.u("BitwiseAnd", pb, e.c(SIGN)), e.c(0))
    return e.sel(neg, e.u("ISub", e.c(0), n), n)


@functools.cache
def emit_cache_row(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """attention.cache_row per row of D: bindings 0 x f32[rows*D], 1 tables, 2 scale u32[rows],
    3 codes u32[rows*ceil(D/4)]. Push: rows, D, row0 (the first row of this dispatch)."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf = k.buffer("x", m.f32)
    k.tables = k.buffer("tables", m.f32)
    sbuf = k.buffer("scale", m.u32, writable=True)
    cbuf = k.buffer("codes", m.u32, writable=True)
    e, (rows, D, row0), gid = k.start(["rows", "D", "row0"])
    f, u32 = e.f, m.u32
    row = e.u("IAdd", gid, row0)
    with f.if_then(e.b("ULessThan", row, rows), "valid"):
        base = e.u("IMul", row, D)
        amax = e.var(u32, "amax", e.c(0))
        with f.loop(D, "amax") as i:
            mag = e.mag(_f32_at(e, xbuf, e.u("IAdd", base, i)))
            up = e.b("LogicalAnd", e.b("ULessThanEqual", mag, e.c(EXP)), e.b("UGreaterThan", mag, f.load(u32, amax)))
            f.store(amax, e.sel(up, mag, f.load(u32, amax)))
        t = e.fmul(e.flt(f.load(u32, amax)), e.fc(float(constants()["INV_127"])))
        h = _f16_bits(e, e.bits(t))
        _store(e, sbuf, row, h, u32)
        inv = e.recip(_f16_to_f32(e, h))
        dead = e.b("IEqual", e.mag(inv), e.c(EXP))
        words = e.u("ShiftRightLogical", e.u("IAdd", D, e.c(3)), e.c(2))
        with f.loop(words, "codes") as w:
            i0 = e.u("ShiftLeftLogical", w, e.c(2))
            cs = []
            for j in range(4):
                i = e.u("IAdd", i0, e.c(j))
                ok = e.b("ULessThan", i, D)
                x = _f32_at(e, xbuf, e.u("IAdd", base, e.sel(ok, i, e.c(0))))
                cs.append(e.sel(ok, _rint_code(e, e.bits(e.fmul(x, inv))), e.c(0)))
            _store(e, cbuf, e.u("IAdd", e.u("IMul", row, words), w), e.sel(dead, e.c(0), _pack(e, cs)), u32)
    f.end()
    return tuple(m.words())


def _quantize(kern, x: np.ndarray, block: int, bits: int) -> quant.ActBlocks:
    x = np.ascontiguousarray(x, np.float32)
    if block not in BLOCKS or x.ndim < 1 or x.shape[-1] % block:
        raise BankmlError(f"portable quantize: rows of {list(x.shape)} are not whole blocks of {block}")
    nblk = x.size // block
    shape = x.shape[:-1] + (x.shape[-1] // block,)
    if nblk == 0:
        z = np.zeros(shape, np.int64)
        return quant.ActBlocks(np.zeros(x.shape, np.int8), z, z.copy(), np.zeros(shape, bool))
    prog = kern.program("quantize", emit_quantize(kern.flushing, kern.rte), 3, 4)
    bufs = [x.tobytes(), x.size, 8 * nblk]
    codes, info = np.empty(x.size, np.int8), np.empty(2 * nblk, np.uint32)
    per = MAX_GROUPS * LOCAL
    for b0 in range(0, nblk, per):
        n = min(per, nblk - b0)
        out = prog.run(bufs, [nblk, block, bits, b0], -(-n // LOCAL),
                       {1: (np.int8, x.size), 2: (np.uint32, 2 * nblk)})
        codes[b0 * block:(b0 + n) * block] = out[1][b0 * block:(b0 + n) * block]
        info[2 * b0:2 * (b0 + n)] = out[2][2 * b0:2 * (b0 + n)]
    info = info.reshape(nblk, 2)
    m = (info[:, 0] & 0xFF).astype(np.int64).reshape(shape)
    bad = ((info[:, 0] >> 8) & 1).astype(bool).reshape(shape)
    e = info[:, 1].view(np.int32).astype(np.int64).reshape(shape)
    return quant.ActBlocks(codes.reshape(x.shape), m, e, bad)


def quantize_act(kern, x: np.ndarray) -> quant.ActBlocks:
    """quant.quantize_act(x) on the device of `kern` (a PortableKernels): x f32 [..., K], K a
    multiple of 32."""
    return _quantize(kern, x, quant.QK, quant.SUB_BITS)


def quantize_blocks(kern, x: np.ndarray, block: int) -> quant.ActBlocks:
    """quant.quantize_blocks(x, block) on the device: block 32, 64, 128 or 256."""
    return _quantize(kern, x, block, quant.WIDE_BITS)


def cache_rows(kern, x: np.ndarray) -> np.ndarray:
    """attention.cache_row(x) on the device: x f32 [..., D] -> rows [...] of cache_dtype(D)."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise BankmlError(f"portable cache_row: rows of {list(x.shape)} are empty")
    D = x.shape[-1]
    rows, words = x.size // D, -(-D // 4)
    out = np.zeros(x.shape[:-1], attention.cache_dtype(D))
    if rows == 0:
        return out
    prog = kern.program("cache_row", emit_cache_row(kern.flushing, kern.rte), 4, 3)
    bufs = [x.tobytes(), kern.tables, 4 * rows, 4 * rows * words]
    s, c = np.empty(rows, np.uint32), np.empty((rows, 4 * words), np.int8)
    per = MAX_GROUPS * LOCAL
    for r0 in range(0, rows, per):
        n = min(per, rows - r0)
        got = prog.run(bufs, [rows, D, r0], -(-n // LOCAL), {2: (np.uint32, rows), 3: (np.int8, 4 * rows * words)})
        s[r0:r0 + n] = got[2][r0:r0 + n]
        c[r0:r0 + n] = got[3].reshape(rows, 4 * words)[r0:r0 + n]
    flat = out.reshape(-1)
    flat["d"] = s.astype(np.uint16).view(np.float16)
    flat["qs"] = c[:, :D]
    return out
