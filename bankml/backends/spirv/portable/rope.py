"""The portable RoPE as SPIR-V: rotary.rope_table and rotary.rope in one kernel, bit for bit the
reference lowering (bankml/backends/reference/portable.py, Op.ROPE; docs/spirv.md).

One invocation per (row = token·H + head, lane): lane i < n_dims/2 makes pair i's cos/sin at
the token's position and rotates the pair, lane n_dims/2 + k copies element n_dims + k (a
partial rope, canonical). The host uploads the data rope_table reads as a buffer of u32 words:

    [0, 256)          C = tables.sincos_table()[0] (f32 bits)
    [256, 512)        S
    512 + 2i, +1      sig_i, s_i: t_i = rope_turns(...)[i] = sig_i · 2^-s_i (decimal, on the host)

The angle's fraction of a turn is integer (u64 p·sig_i, masked, split at s_i - 8 into the table
point j and the rest); d = rest·2^-s_i is rest rounded once to 24 bits (numpy's int64 -> f32)
then scaled by its exponent field (as np.ldexp then canon; for a normal t_i a nonzero d is at
least 2^-126, the denormal branch only guards); every f32 step after it is Emit's
fadd/fsub/fmul. No device sine, no FMA.

    k = PortableKernels(runtime.open_device(0))
    y = rope_run(k, x, pos, n_dims, freq_base, freq_scale, mode)     # x f32 [T, H, D]
"""
from __future__ import annotations

import functools

import numpy as np

from bankml.backends.spirv import builder as B
from bankml.backends.spirv.portable.emit import Emit, f32_bits
from bankml.backends.spirv.portable.kernels import LOCAL, _f32_at, _Module, _store
from bankml.errors import BankmlError
from bankml.profiles.portable.tables import SINCOS_N, constants, rope_turns, sincos_table

MODES = {"norm": 0, "neox": 1}
PAIRS_AT = 2 * SINCOS_N           # the data buffer: (sig, s) of pair i at PAIRS_AT + 2i
MAX_ROWS = 65535                  # workgroups in y per dispatch (Vulkan's minimum limit)


def rope_data(n_dims: int, freq_base: float, freq_scale: float) -> bytes:
    """The data buffer of one (n_dims, freq_base, freq_scale): C, S bits, then (sig_i, s_i)."""
    C, S = sincos_table()
    t = rope_turns(n_dims, float(freq_base), float(freq_scale)).view(np.uint32).astype(np.int64)
    e, frac = (t >> 23) & 0xFF, t & 0x7FFFFF
    pairs = np.stack([np.where(e == 0, 0, frac | 0x800000), 150 - e], axis=-1)
    return np.concatenate([C.view(np.uint32), S.view(np.uint32), pairs.reshape(-1).astype(np.uint32)]
                          ).astype("<u4").tobytes()


def _ldexp_rest(e: Emit, rest, s):
    """Bits of f32(rest)·2^-s as numpy's np.ldexp(rest.astype(f32), -s) then canon: rest (u64,
    < 2^41) rounded once to 24 bits, its exponent field lowered by s; a result in the denormal
    range is 0 but for 0xFFFFFF·2^-150, which ldexp rounds up to 2^-126 (unreached: a nonzero rest
    is below 2^(s-8) only when s <= 49, else it is p·sig >= 2^23 with s <= 149)."""
    rf = e.int_to_f32(rest, e.c(0))                       # +0 for 0; else exponent field >= 127
    ex = e.u("BitFieldUExtract", rf, e.c(23), e.c(8))
    e2 = e.u("ISub", ex, s)                               # i32
    normal = e.u("BitwiseOr", e.u("BitwiseAnd", rf, e.c(0x807FFFFF)), e.u("ShiftLeftLogical", e2, e.c(23)))
    edge = e.b("LogicalAnd", e.b("IEqual", e2, e.c(0)),
               e.b("IEqual", e.u("BitwiseAnd", rf, e.c(0x7FFFFF)), e.c(0x7FFFFF)))
    tiny = e.sel(edge, e.c(0x00800000), e.c(0))
    out = e.sel(e.b("SGreaterThan", e2, e.c(0)), normal, tiny)
    return e.flt(e.sel(e.b("IEqual", rf, e.c(0)), e.c(0), out))


def _cos_sin(e: Emit, data, pos, i):
    """rotary.rope_table's (cos, sin) of pair i at position pos (u32 < 2^17)."""
    f, m = e.f, e.m
    u32 = m.u32

    def word(idx):
        return f.load(u32, f.chain(B.SC_STORAGE_BUFFER, u32, data, e.c(0), idx))
    at = e.u("IAdd", e.c(PAIRS_AT), e.u("ShiftLeftLogical", i, e.c(1)))
    sig, s = word(at), word(e.u("IAdd", at, e.c(1)))
    prod = e.w("IMul", e.zext64(pos), e.zext64(sig))                       # < 2^41
    sm = e.zext64(e.sel(e.b("SLessThan", s, e.c(62)), s, e.c(62)))         # prod < 2^41: the mask's reach
    frac = e.w("BitwiseAnd", prod, e.w("ISub", e.w("ShiftLeftLogical", e.c64(1), sm), e.c64(1)))
    shift = e.u("ISub", s, e.c(8))
    shift = e.zext64(e.sel(e.b("SLessThan", shift, e.c(62)), shift, e.c(62)))   # past 41: j = 0
    j = e.w("ShiftRightLogical", frac, shift)
    rest = e.w("ISub", frac, e.w("ShiftLeftLogical", j, shift))
    jj = e.u("BitwiseAnd", e.lo32(j), e.c(SINCOS_N - 1))
    c = constants()
    k = lambda v: e.flt(e.c(f32_bits(float(v))))                                    # noqa: E731
    d = _ldexp_rest(e, rest, s)
    rho = e.fmul(d, k(c["TWO_PI"]))
    r2 = e.fmul(rho, rho)
    sin_r = e.fsub(rho, e.fmul(e.fmul(r2, k(c["SIXTH"])), rho))
    cos_r = e.fsub(k(1.0), e.fmul(r2, e.fsub(k(0.5), e.fmul(r2, k(c["TWENTYFOURTH"])))))
    cj, sj = e.canon(e.flt(word(jj))), e.canon(e.flt(word(e.u("IAdd", jj, e.c(SINCOS_N)))))
    cos = e.fsub(e.fmul(cj, cos_r), e.fmul(sj, sin_r))
    sin = e.fadd(e.fmul(sj, cos_r), e.fmul(cj, sin_r))
    return cos, sin


@functools.cache
def emit_rope(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """rotary.rope_table + rotary.rope over rows of D (row = t·H + h), the dims past n_dims copied.
    Bindings: 0 x f32[rows*D], 1 pos u32[T], 2 data u32 (rope_data), 3 y f32.
    Push: rows, H, D, n_dims, mode (0 norm, 1 neox), row0 (the dispatch's first row).
    Invocations: x = lane (n_dims/2 + D - n_dims of them), y = row - row0."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf, pbuf = k.buffer("x", m.f32), k.buffer("pos", m.u32)
    data = k.buffer("data", m.u32)
    obuf = k.buffer("y", m.f32, writable=True)
    e, (rows, H, D, nd, mode, row0), lane = k.start(["rows", "H", "D", "nd", "mode", "row0"])
    f = e.f
    row = e.u("IAdd", k.gid_y, row0)
    half = e.u("ShiftRightLogical", nd, e.c(1))
    width = e.u("IAdd", half, e.u("ISub", D, nd))
    valid = e.b("LogicalAnd", e.b("ULessThan", row, rows), e.b("ULessThan", lane, width))
    base = e.u("IMul", row, D)
    with f.if_then(valid, "valid"):
        with f.if_then(e.b("ULessThan", lane, half), "rot"):
            t = e.f.op("UDiv", m.u32, row, H)
            pos = f.load(m.u32, f.chain(B.SC_STORAGE_BUFFER, m.u32, pbuf, e.c(0), t))
            cos, sin = _cos_sin(e, data, pos, lane)
            neox = e.b("INotEqual", mode, e.c(0))
            i0 = e.sel(neox, lane, e.u("ShiftLeftLogical", lane, e.c(1)))
            i1 = e.sel(neox, e.u("IAdd", lane, half), e.u("IAdd", i0, e.c(1)))
            i0, i1 = e.u("IAdd", base, i0), e.u("IAdd", base, i1)
            x0, x1 = _f32_at(e, xbuf, i0), _f32_at(e, xbuf, i1)
            _store(e, obuf, i0, e.fsub(e.fmul(x0, cos), e.fmul(x1, sin)))
            _store(e, obuf, i1, e.fadd(e.fmul(x0, sin), e.fmul(x1, cos)))
        with f.if_then(e.b("UGreaterThanEqual", lane, half), "copy"):
            idx = e.u("IAdd", base, e.u("IAdd", nd, e.u("ISub", lane, half)))
            _store(e, obuf, idx, _f32_at(e, xbuf, idx))
    f.end()
    return tuple(m.words())


def rope_run(kern, x: np.ndarray, pos, n_dims: int, freq_base: float, freq_scale: float,
             mode: str) -> np.ndarray:
    """The reference lowering of Op.ROPE on the device of `kern` (a PortableKernels): x f32
    [T, H, D], pos int [T] (0 <= pos < 2^17), the first n_dims of each head rotated (mode norm or
    neox), the rest canonical copies -> f32 [T, H, D]."""
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 3:
        raise BankmlError(f"portable rope: x of shape {list(x.shape)}, want [T, H, D]")
    T, H, D = x.shape
    if mode not in MODES or not 0 < n_dims <= D or n_dims % 2:
        raise BankmlError(f"portable rope: mode {mode!r} n_dims {n_dims} over head dim {D}")
    p = np.asarray(pos, np.int64).reshape(-1)
    if p.size != T:
        raise BankmlError(f"portable rope: {p.size} positions for {T} tokens")
    if p.size and (p.min() < 0 or p.max() >= 1 << 17):
        raise ValueError("rope_table: positions must be in 0 .. 2^17 - 1")
    if x.size == 0:
        return x.copy()
    prog = kern.program("rope", emit_rope(kern.flushing, kern.rte), 4, 6)
    rows, width = T * H, n_dims // 2 + D - n_dims
    bufs = [x.tobytes(), p.astype("<u4").tobytes(), rope_data(n_dims, freq_base, freq_scale), 4 * x.size]
    out = np.empty(x.size, np.float32)
    for row0 in range(0, rows, MAX_ROWS):
        n = min(MAX_ROWS, rows - row0)
        y = prog.run(bufs, [rows, H, D, n_dims, MODES[mode], row0], (-(-width // LOCAL), n),
                     {3: (np.float32, x.size)})[3]
        out[row0 * D:(row0 + n) * D] = y[row0 * D:(row0 + n) * D]
    return out.reshape(x.shape)
