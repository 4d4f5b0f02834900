"""The portable profile's kernels as SPIR-V: matvec (F16, Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1,
Q4_K, Q6_K; Sub32, and PerBlock for the block formats), RMSNorm,
softmax, the row reductions fmax/absmax/argmax, l2norm and hadamard, the elementwise functions,
the int8-cache attention of one decode step, and Qwen3.5's conv and Gated-DeltaNet step, bit
for bit the numpy spec (bankml/profiles/portable/; docs/spirv.md, "The portable kernels").

Every float step is portable.emit's (NoContraction, flush and NaN by bit tests), every exact sum
is integer (int64, a 384-bit accumulator where int64 is too narrow). The host quantizes
activations with the spec (quant.quantize_act) and uploads them in this layout:

    codes   the int8 codes, K bytes per row (u32 words)
    info    2 u32 per block of 32: m | bad << 8, e (two's complement)
    tables  f32[611]: exp's 2^(j/64), recip's and rsqrt's seeds, ln's 64/i, hi and lo (tables.py)

    k = PortableKernels(runtime.open_device(0))
    y = k.matvec(w_raw, wtype, quant.quantize_act(x[None]))      # f32[rows]
    y = k.rmsnorm(x, w, eps); y = k.softmax(x)                     # rows of the last axis
    y = k.fmax(x); y = k.absmax(x); i = k.argmax(x)                # f32[rows], int64[rows]
    y = k.l2norm(x, eps); y = k.hadamard(x)                        # rows of the last axis
    y = k.unary("softplus", x)                                     # every element (funcs.<fn>)
    y = k.attention(q, k_rows, v_rows, mask, scale)                # one decode step, [H, D]
    y = k.attention_rows(q, k_rows, v_rows, masks, scale)          # M query rows, [M, H, D]
    y = k.attend_vector(q, k, v, scale)                            # f32 rows, attend_vector per head
    y, state = k.conv(x, kernel, state)                            # gdn.conv token by token
    y, state = k.gated_delta_net(q, k, v, g, beta, state, scale)   # gdn.gdn_row, per (head, row)
"""
from __future__ import annotations

import functools

import numpy as np

from bankml.backends.spirv import builder as B
from bankml.backends.spirv.portable.emit import EXP, QNAN, SIGN, Emit
from bankml.errors import BankmlError
from bankml.profiles.portable import gdn, quant
from bankml.profiles.portable.tables import exp_table, ln_tables, recip_table, rsqrt_table
from bankml.quants import F16, Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES

LOCAL = 64
MATVEC_TYPES = (F16, Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K)
UNARY = ("exp", "recip", "rsqrt", "ln", "ln1p", "sigmoid", "silu", "softplus")
_F32 = np.float32


def tables_bytes() -> bytes:
    return np.concatenate([exp_table(), recip_table(), rsqrt_table(), *ln_tables()]).astype("<f4").tobytes()


def act_buffers(a: quant.ActBlocks) -> tuple[bytes, bytes]:
    """(codes, info) of quantized activations (all rows, in order)."""
    info = np.empty(a.m.shape + (2,), "<u4")
    info[..., 0] = a.m.astype(np.uint32) | (a.bad.astype(np.uint32) << 8)
    info[..., 1] = a.e.astype(np.int64).astype(np.uint32)
    return np.ascontiguousarray(a.q, np.int8).tobytes(), info.tobytes()


# ---- module scaffolding
class _Module:
    def __init__(self, local: int = LOCAL, flushing: bool = False, rte: bool = True):
        """rte: declare RoundingModeRTE 32 (where the device offers it, as q1.matvec does)."""
        self.flushing, self.rte = flushing, rte
        self.m = m = B.Module()
        m.caps += [B.CAP_SHADER, B.CAP_INT64] + [B.CAP_RTE] * rte
        self.nbuf = 0
        self.bufs: list[int] = []
        self.local = local

    def buffer(self, name: str, elem: int | None = None, writable: bool = False) -> int:
        m = self.m
        arr = m.id()
        m.globals.append(B.inst("TypeRuntimeArray", arr, m.u32 if elem is None else elem))
        m.decorate(arr, B.DEC_ARRAY_STRIDE, 4)
        st = m.struct(f"{name}_t", [arr])
        v = m.variable(B.SC_STORAGE_BUFFER, st, name)
        m.decorate(v, B.DEC_DESCRIPTOR_SET, 0)
        m.decorate(v, B.DEC_BINDING, self.nbuf)
        if not writable:
            m.decorate(v, B.DEC_NON_WRITABLE)
        self.nbuf += 1
        return v

    def start(self, push: list[str]) -> tuple[Emit, list[int], int]:
        """The entry point: (emitter, push constant values, global invocation x)."""
        m = self.m
        pc = m.variable(B.SC_PUSH_CONSTANT, m.struct("params_t", [m.u32] * len(push)), "params")
        uvec3 = m.type("TypeVector", m.u32, 3)
        gid_v = m.variable(B.SC_INPUT, uvec3, "gl_GlobalInvocationID")
        m.decorate(gid_v, B.DEC_BUILTIN, B.BUILTIN_GLOBAL_ID)
        f = B.Function(m, "main", (self.local, 1, 1))
        if self.rte:
            m.modes.append(B.inst("ExecutionMode", f.fid, B.MODE_RTE, 32))
        e = Emit(m, f, getattr(self, "tables", None), self.flushing)
        gid3 = f.load(uvec3, gid_v)
        gid = f.op("CompositeExtract", m.u32, gid3, 0, name="gid")
        self.gid_y = f.op("CompositeExtract", m.u32, gid3, 1, name="gid_y")
        vals = [f.load(m.u32, f.chain(B.SC_PUSH_CONSTANT, m.u32, pc, e.c(i)), name=n) for i, n in enumerate(push)]
        return e, vals, gid


def _word(e: Emit, buf: int, byte_off: int) -> int:
    f = e.f
    p = f.chain(B.SC_STORAGE_BUFFER, e.m.u32, buf, e.c(0), f.u("ShiftRightLogical", byte_off, e.c(2)))
    return f.load(e.m.u32, p)


def _u8(e: Emit, buf: int, off: int) -> int:
    shift = e.u("ShiftLeftLogical", e.u("BitwiseAnd", off, e.c(3)), e.c(3))
    return e.u("BitFieldUExtract", _word(e, buf, off), shift, e.c(8))


def _s8(e: Emit, buf: int, off: int) -> int:
    return e.u("BitFieldSExtract", _u8(e, buf, off), e.c(0), e.c(8))


def _u16(e: Emit, buf: int, off: int) -> int:
    """Little-endian u16 at an even byte offset."""
    shift = e.u("ShiftLeftLogical", e.u("BitwiseAnd", off, e.c(2)), e.c(3))
    return e.u("BitFieldUExtract", _word(e, buf, off), shift, e.c(16))


def _f32_at(e: Emit, buf: int, idx: int) -> int:
    return e.canon(e.f.load(e.m.f32, e.f.chain(B.SC_STORAGE_BUFFER, e.m.f32, buf, e.c(0), idx)))


def _store(e: Emit, buf: int, idx: int, v: int, t: int | None = None) -> None:
    """buf[idx] = v, an f32 buffer's (or of element type t)."""
    e.f.store(e.f.chain(B.SC_STORAGE_BUFFER, e.m.f32 if t is None else t, buf, e.c(0), idx), v)


def _f16_parts(e: Emit, h: int) -> tuple[int, int, int]:
    """quant.f16_parts: (signed significand, exponent (i32), bad) of an f16's bits."""
    e5 = e.u("BitFieldUExtract", h, e.c(10), e.c(5))
    m10 = e.u("BitwiseAnd", h, e.c(1023))
    sub = e.b("IEqual", e5, e.c(0))
    sig = e.sel(sub, m10, e.u("BitwiseOr", m10, e.c(1024)))
    sig = e.sel(e.b("INotEqual", e.u("BitwiseAnd", h, e.c(0x8000)), e.c(0)), e.u("ISub", e.c(0), sig), sig)
    x = e.sel(sub, e.c(-24), e.u("ISub", e5, e.c(25)))
    return sig, x, e.b("IEqual", e5, e.c(31))


def _f16_to_f32(e: Emit, h: int) -> int:
    """An f16's value as f32, exactly (integer significand times a power of two)."""
    sig, x, bad = _f16_parts(e, h)
    mag = e.f.op("ConvertSToF", e.m.f32, sig)
    v = e.scale2(mag, x)
    special = e.u("BitwiseOr", e.u("ShiftLeftLogical", e.u("BitwiseAnd", h, e.c(0x8000)), e.c(16)),
                  e.sel(e.b("IEqual", e.u("BitwiseAnd", h, e.c(1023)), e.c(0)), e.c(EXP), e.c(QNAN)))
    neg_zero = e.b("IEqual", h, e.c(0x8000))
    out = e.sel(bad, special, e.bits(v))
    return e.flt(e.sel(neg_zero, e.c(SIGN), out))


def _fold(e: Emit, n: int, value, name: str) -> int:
    """arith.fold_sum of value(i) for i < n: 8 lanes (i mod 8, index order, from -0.0; missing
    elements -0.0), then the balanced tree."""
    f, m = e.f, e.m
    neg0 = e.flt(e.c(SIGN))
    lanes = [e.var(m.f32, f"{name}.l{l}", neg0) for l in range(8)]
    chunks = e.u("ShiftRightLogical", e.u("IAdd", n, e.c(7)), e.c(3))
    with f.loop(chunks, name) as c:
        for l in range(8):
            i = e.u("IAdd", e.u("ShiftLeftLogical", c, e.c(3)), e.c(l))
            ok = e.b("ULessThan", i, n)
            v = f.select(m.f32, ok, value(e.sel(ok, i, e.c(0))), neg0)
            f.store(lanes[l], e.fadd(f.load(m.f32, lanes[l]), v))
    vals = [f.load(m.f32, v) for v in lanes]
    while len(vals) > 1:
        vals = [e.fadd(vals[i], vals[i + 1]) for i in range(0, len(vals), 2)]
    return vals[0]


def _is_nan(e: Emit, x: int) -> int:
    return e.b("UGreaterThan", e.mag(x), e.c(EXP))


# ---- matvec
def _decode(e: Emit, wtype: int, wbuf: int, rb: int, j: int):
    """Sub-block j (32 weights) of the row at byte rb: (weight(i) -> (int64 q, bad), ws, wx, bad,
    (ms, mx) or None): weight i is ws·2^wx·q (+ ms·2^mx), ms times the codes' sum in the dot.
    Q4_1, Q5_1: ms the min; Q4_K: q = sc·nibble, ms = dmin's significand times -m (coded.py's
    CodedRow: a·coef + b·offs, the sub-block's offs all -m); Q6_K: q = sc·(code - 32)."""
    if wtype == F16:
        def weight(i):
            elem = e.u("IAdd", e.u("ShiftLeftLogical", j, e.c(5)), i)
            h = _u16(e, wbuf, e.u("IAdd", rb, e.u("ShiftLeftLogical", elem, e.c(1))))
            sig, x, bad = _f16_parts(e, h)
            return e.w("ShiftLeftLogical", e.sext64(sig), e.zext64(e.u("IAdd", x, e.c(24)))), bad
        return weight, e.c(1), e.c(-24), e._false(), None
    if wtype == Q8_0:
        base = e.u("IAdd", rb, e.u("IMul", j, e.c(34)))
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, base))
        return (lambda i: (e.sext64(_s8(e, wbuf, e.u("IAdd", base, e.u("IAdd", i, e.c(2))))), None)), ws, wx, bad, None
    if wtype == Q4_1:
        base = e.u("IAdd", rb, e.u("IMul", j, e.c(20)))
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, base))
        ms, mx, mbad = _f16_parts(e, _u16(e, wbuf, e.u("IAdd", base, e.c(2))))

        def weight(i):
            byte = _u8(e, wbuf, e.u("IAdd", base, e.u("IAdd", e.u("BitwiseAnd", i, e.c(15)), e.c(4))))
            sh = e.u("ShiftLeftLogical", e.u("ShiftRightLogical", i, e.c(4)), e.c(2))
            return e.zext64(e.u("BitFieldUExtract", byte, sh, e.c(4))), None
        return weight, ws, wx, e.b("LogicalOr", bad, mbad), (ms, mx)
    if wtype == Q1_0:
        base = e.u("IAdd", rb, e.u("IMul", e.u("ShiftRightLogical", j, e.c(2)), e.c(18)))
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, base))

        def weight(i):
            t = e.u("IAdd", e.u("ShiftLeftLogical", e.u("BitwiseAnd", j, e.c(3)), e.c(5)), i)
            byte = _u8(e, wbuf, e.u("IAdd", base, e.u("IAdd", e.u("ShiftRightLogical", t, e.c(3)), e.c(2))))
            bit = e.u("BitFieldUExtract", byte, e.u("BitwiseAnd", t, e.c(7)), e.c(1))
            return e.sext64(e.sel(e.b("IEqual", bit, e.c(1)), e.c(1), e.c(-1))), None
        return weight, ws, wx, bad, None
    if wtype == Q2_0:
        base = e.u("IAdd", rb, e.u("IMul", e.u("ShiftRightLogical", j, e.c(1)), e.c(18)))
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, base))

        def weight(i):
            t = e.u("IAdd", e.u("ShiftLeftLogical", e.u("BitwiseAnd", j, e.c(1)), e.c(5)), i)
            byte = _u8(e, wbuf, e.u("IAdd", base, e.u("IAdd", e.u("ShiftRightLogical", t, e.c(2)), e.c(2))))
            code = e.u("BitFieldUExtract", byte, e.u("ShiftLeftLogical", e.u("BitwiseAnd", t, e.c(3)), e.c(1)), e.c(2))
            return e.sext64(e.u("ISub", code, e.c(1))), None
        return weight, ws, wx, bad, None
    if wtype in (Q4_0, Q5_0, Q5_1):
        qh, qs = {Q4_0: (None, 2), Q5_0: (2, 6), Q5_1: (4, 8)}[wtype]
        base = e.u("IAdd", rb, e.u("IMul", j, e.c(WEIGHT_TYPES[wtype].block_bytes)))
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, base))

        def code(i):                       # the low nibble (element i & 15, i >> 4 the half), the fifth bit
            byte = _u8(e, wbuf, e.u("IAdd", base, e.u("IAdd", e.u("BitwiseAnd", i, e.c(15)), e.c(qs))))
            c = e.u("BitFieldUExtract", byte, e.u("ShiftLeftLogical", e.u("ShiftRightLogical", i, e.c(4)), e.c(2)),
                    e.c(4))
            if qh is None:
                return c
            hb = _u8(e, wbuf, e.u("IAdd", base, e.u("IAdd", e.u("ShiftRightLogical", i, e.c(3)), e.c(qh))))
            return e.u("BitwiseOr", c, e.u("ShiftLeftLogical",
                                          e.u("BitFieldUExtract", hb, e.u("BitwiseAnd", i, e.c(7)), e.c(1)), e.c(4)))
        if wtype == Q5_1:
            ms, mx, mbad = _f16_parts(e, _u16(e, wbuf, e.u("IAdd", base, e.c(2))))
            return (lambda i: (e.zext64(code(i)), None)), ws, wx, e.b("LogicalOr", bad, mbad), (ms, mx)
        off = 8 if wtype == Q4_0 else 16
        return (lambda i: (e.sext64(e.u("ISub", code(i), e.c(off))), None)), ws, wx, bad, None
    if wtype in (Q4_K, Q6_K):
        jj = e.u("BitwiseAnd", j, e.c(7))                                # sub-block in the superblock
        base = e.u("IAdd", rb, e.u("IMul", e.u("ShiftRightLogical", j, e.c(3)), e.c(WEIGHT_TYPES[wtype].block_bytes)))
    if wtype == Q4_K:
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, base))
        ds, dx, dbad = _f16_parts(e, _u16(e, wbuf, e.u("IAdd", base, e.c(2))))
        # get_scale_min_k4(jj) of scales[12] at byte 4: bytes lo, lo + 4, lo + 8 (lo = jj & 3)
        lo = e.u("BitwiseAnd", jj, e.c(3))
        s0, s4, s8 = (_u8(e, wbuf, e.u("IAdd", base, e.u("IAdd", lo, e.c(4 + k)))) for k in (0, 4, 8))
        high = e.b("UGreaterThanEqual", jj, e.c(4))
        sc = e.sel(high, e.u("BitwiseOr", e.u("BitwiseAnd", s8, e.c(15)),
                             e.u("ShiftLeftLogical", e.u("ShiftRightLogical", s0, e.c(6)), e.c(4))),
                   e.u("BitwiseAnd", s0, e.c(63)))
        mn = e.sel(high, e.u("BitwiseOr", e.u("ShiftRightLogical", s8, e.c(4)),
                             e.u("ShiftLeftLogical", e.u("ShiftRightLogical", s4, e.c(6)), e.c(4))),
                   e.u("BitwiseAnd", s4, e.c(63)))
        qbase = e.u("IAdd", base, e.u("IAdd", e.c(16), e.u("ShiftLeftLogical", e.u("ShiftRightLogical", jj, e.c(1)),
                                                             e.c(5))))
        nsh = e.u("ShiftLeftLogical", e.u("BitwiseAnd", jj, e.c(1)), e.c(2))

        def weight(i):                     # sc · nibble (0..945)
            nib = e.u("BitFieldUExtract", _u8(e, wbuf, e.u("IAdd", qbase, i)), nsh, e.c(4))
            return e.zext64(e.u("IMul", sc, nib)), None
        # the second scale: dmin's significand times -m (|.| <= 2047·63), at dmin's exponent
        return weight, ws, wx, e.b("LogicalOr", bad, dbad), (e.u("ISub", e.c(0), e.u("IMul", ds, mn)), dx)
    if wtype == Q6_K:
        ws, wx, bad = _f16_parts(e, _u16(e, wbuf, e.u("IAdd", base, e.c(208))))
        h, kk = e.u("ShiftRightLogical", jj, e.c(2)), e.u("BitwiseAnd", jj, e.c(3))
        qlb = e.u("IAdd", base, e.u("IAdd", e.u("ShiftLeftLogical", h, e.c(6)),
                                    e.u("ShiftLeftLogical", e.u("BitwiseAnd", kk, e.c(1)), e.c(5))))
        qhb = e.u("IAdd", base, e.u("IAdd", e.c(128), e.u("ShiftLeftLogical", h, e.c(5))))
        lsh = e.u("ShiftLeftLogical", e.u("ShiftRightLogical", kk, e.c(1)), e.c(2))
        hsh = e.u("ShiftLeftLogical", kk, e.c(1))
        scb = e.u("IAdd", base, e.u("IAdd", e.c(192), e.u("ShiftLeftLogical", jj, e.c(1))))

        def weight(i):                     # sc[2jj + i/16] · (code - 32), sc int8
            low = e.u("BitFieldUExtract", _u8(e, wbuf, e.u("IAdd", qlb, i)), lsh, e.c(4))
            hi2 = e.u("BitFieldUExtract", _u8(e, wbuf, e.u("IAdd", qhb, i)), hsh, e.c(2))
            c = e.u("ISub", e.u("BitwiseOr", low, e.u("ShiftLeftLogical", hi2, e.c(4))), e.c(32))
            sc = _s8(e, wbuf, e.u("IAdd", scb, e.u("ShiftRightLogical", i, e.c(4))))
            return e.sext64(e.u("IMul", sc, c)), None
        return weight, ws, wx, bad, None
    raise BankmlError(f"portable SPIR-V matvec: no kernel for weight type {wtype}")


def _matvec_start(flushing: bool, rte: bool, count: str):
    """A matvec kernel's module: (module, Emit, its buffers (weights, codes, info, y), its push
    constants (rows, count, row bytes), the row, whether the row is one of the rows)."""
    k = _Module(flushing=flushing, rte=rte)
    bufs = (k.buffer("weights"), k.buffer("codes"), k.buffer("info"), k.buffer("y", k.m.f32, writable=True))
    e, push, row = k.start(["rows", count, "row_bytes"])
    return k, e, bufs, push, row, e.b("ULessThan", row, push[0])


@functools.cache
def emit_matvec(wtype: int, flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """y[t, r] = quant.group_dot(weight row r, activation row t): one invocation per (row, t)
    (workgroups of 64 rows, y = t). Bindings: 0 weights (raw GGUF rows), 1 codes, 2 info,
    3 y f32[T, rows]. Push: rows, K/32, row bytes."""
    k, e, (wbuf, cbuf, ibuf, obuf), (rows, nsub, row_bytes), row, valid = _matvec_start(flushing, rte, "nsub")
    m, f = k.m, e.f
    u32, u64 = m.u32, e.u64
    ngroups = e.sel(valid, e.u("ShiftRightLogical", e.u("IAdd", nsub, e.c(7)), e.c(3)), e.c(0))
    rb = e.u("IMul", row, row_bytes, name="rowbase")
    t_row = e.u("IMul", k.gid_y, nsub, name="act_block0")       # the activation row's first block
    P, X = e.terms()
    y = e.var(m.f32, "y", e.fc(0.0))
    with f.loop(ngroups, "g") as g:
        j0 = e.u("ShiftLeftLogical", g, e.c(3))
        left = e.u("ISub", nsub, j0)
        nj = e.sel(e.b("ULessThan", left, e.c(8)), left, e.c(8))
        cnt = e.var(u32, "cnt", e.c(0))
        bad = e.var(u32, "bad", e.c(0))
        with f.loop(nj, "j") as jj:
            j = e.u("IAdd", j0, jj)
            ab = e.u("IAdd", t_row, j)
            info0 = _word(e, ibuf, e.u("ShiftLeftLogical", ab, e.c(3)))
            ae = _word(e, ibuf, e.u("IAdd", e.u("ShiftLeftLogical", ab, e.c(3)), e.c(4)))
            am = e.u("BitwiseAnd", info0, e.c(0xFF))
            abad = e.b("INotEqual", e.u("ShiftRightLogical", info0, e.c(8)), e.c(0))
            weight, ws, wx, wbad, mins = _decode(e, wtype, wbuf, rb, j)
            dot = e.var(u64, "dot", e.c64(0))
            csum = e.var(u32, "csum", e.c(0))
            ebad = e.var(u32, "ebad", e.c(0))
            with f.loop(e.c(32), "i") as i:
                a = _s8(e, cbuf, e.u("IAdd", e.u("ShiftLeftLogical", ab, e.c(5)), i))
                q, qbad = weight(i)
                f.store(dot, e.w("IAdd", f.load(u64, dot), e.w("IMul", q, e.sext64(a))))
                if mins is not None:
                    f.store(csum, e.u("IAdd", f.load(u32, csum), a))
                if qbad is not None:
                    f.store(ebad, e.sel(qbad, e.c(1), f.load(u32, ebad)))
            amw = e.zext64(am)
            t = f.load(u32, cnt)
            e.put_term(P, X, t, e.w("IMul", e.w("IMul", amw, e.sext64(ws)), f.load(u64, dot)), e.u("IAdd", ae, wx))
            t = e.u("IAdd", t, e.c(1))
            if mins is not None:
                ms, mx = mins
                e.put_term(P, X, t, e.w("IMul", e.w("IMul", amw, e.sext64(ms)), e.sext64(f.load(u32, csum))),
                           e.u("IAdd", ae, mx))
                t = e.u("IAdd", t, e.c(1))
            f.store(cnt, t)
            anybad = e.b("LogicalOr", e.b("LogicalOr", abad, wbad), e.b("INotEqual", f.load(u32, ebad), e.c(0)))
            f.store(bad, e.sel(anybad, e.c(1), f.load(u32, bad)))
        _add_rounded(e, y, P, X, f.load(u32, cnt), f.load(u32, bad), e.b("IEqual", g, e.c(0)))
    return _store_row(k, e, obuf, (rows, row, valid), y)


def _add_rounded(e: Emit, y: int, P: int, X: int, n: int, bad: int, first: int) -> None:
    """y (an f32 variable) = the n terms' exact sum rounded once (NaN where bad is not 0), as is
    when first, else added to y (the rounded units added in order)."""
    f, f32 = e.f, e.m.f32
    r = e.flt(e.sel(e.b("INotEqual", bad, e.c(0)), e.c(QNAN), e.round_terms(P, X, n)))
    f.store(y, f.select(f32, first, r, e.fadd(f.load(f32, y), r)))


def _store_row(k: _Module, e: Emit, obuf: int, where: tuple, y: int) -> tuple[int, ...]:
    """y[t, row] = the f32 variable y where the row is one of the rows; the module's words."""
    rows, row, valid = where
    with e.f.if_then(valid, "store"):
        _store(e, obuf, e.u("IAdd", e.u("IMul", k.gid_y, rows), row), e.f.load(k.m.f32, y))
    e.f.end()
    return tuple(k.m.words())


BLOCK_TYPES = (Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K)     # PerBlock: every block format


@functools.cache
def emit_matvec_blocks(wtype: int, flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """PerBlock's dot (coded.dot_blocks): activations quantized per the weight's own block of B
    elements (quant.quantize_blocks, m in 128..255); per weight block the exact value of
    am·2^ae·(Σ ws·dot at wx + Σ ms·csum at mx) (its B/32 sub-blocks share the block's
    scales) rounded once, NaN where the activation block (or a scale) is bad, the blocks added
    in order (the first as is). One invocation per (row, t) (workgroups of 64 rows, y = t).
    Bindings: 0 weights (raw GGUF rows), 1 codes, 2 info (one entry per block of B), 3 y f32[T,
    rows]. Push: rows, K/B, row bytes."""
    per = WEIGHT_TYPES[wtype].block // 32
    k, e, (wbuf, cbuf, ibuf, obuf), (rows, nblk, row_bytes), row, valid = _matvec_start(flushing, rte, "nblk")
    m, f = k.m, e.f
    u32, u64 = m.u32, e.u64
    nb = e.sel(valid, nblk, e.c(0))
    rb = e.u("IMul", row, row_bytes, name="rowbase")
    t_blk = e.u("IMul", k.gid_y, nblk, name="act_block0")       # the activation row's first block
    P, X = e.terms()
    y = e.var(m.f32, "y", e.fc(0.0))
    with f.loop(nb, "b") as bi:
        ab = e.u("IAdd", t_blk, bi)
        info0 = _word(e, ibuf, e.u("ShiftLeftLogical", ab, e.c(3)))
        ae = _word(e, ibuf, e.u("IAdd", e.u("ShiftLeftLogical", ab, e.c(3)), e.c(4)))
        amw = e.zext64(e.u("BitwiseAnd", info0, e.c(0xFF)))
        abad = e.b("INotEqual", e.u("ShiftRightLogical", info0, e.c(8)), e.c(0))
        wdot = e.var(u64, "wdot", e.c64(0))                    # Σ ws·dot of the block's sub-blocks
        mdot = e.var(u64, "mdot", e.c64(0))                    # Σ ms·csum
        wxv, mxv = e.var(u32, "wx", e.c(0)), e.var(u32, "mx", e.c(0))
        bad = e.var(u32, "bad", e.sel(abad, e.c(1), e.c(0)))
        with f.loop(e.c(per), "s") as sj:
            j = e.u("IAdd", e.u("IMul", bi, e.c(per)), sj)       # the sub-block in the row
            cbase = e.u("ShiftLeftLogical", e.u("IAdd", e.u("IMul", t_blk, e.c(per)), j), e.c(5))
            weight, ws, wx, wbad, mins = _decode(e, wtype, wbuf, rb, j)
            dot = e.var(u64, "dot", e.c64(0))
            csum = e.var(u32, "csum", e.c(0))
            with f.loop(e.c(32), "i") as i:
                a = _s8(e, cbuf, e.u("IAdd", cbase, i))
                q, _ = weight(i)
                f.store(dot, e.w("IAdd", f.load(u64, dot), e.w("IMul", q, e.sext64(a))))
                if mins is not None:
                    f.store(csum, e.u("IAdd", f.load(u32, csum), a))
            f.store(wdot, e.w("IAdd", f.load(u64, wdot), e.w("IMul", e.sext64(ws), f.load(u64, dot))))
            f.store(wxv, wx)
            if mins is not None:
                ms, mx = mins
                f.store(mdot, e.w("IAdd", f.load(u64, mdot), e.w("IMul", e.sext64(ms), e.sext64(f.load(u32, csum)))))
                f.store(mxv, mx)
            f.store(bad, e.sel(wbad, e.c(1), f.load(u32, bad)))
        e.put_term(P, X, e.c(0), e.w("IMul", amw, f.load(u64, wdot)), e.u("IAdd", ae, f.load(u32, wxv)))
        if mins is not None:
            e.put_term(P, X, e.c(1), e.w("IMul", amw, f.load(u64, mdot)), e.u("IAdd", ae, f.load(u32, mxv)))
        _add_rounded(e, y, P, X, e.c(1 if mins is None else 2), f.load(u32, bad), e.b("IEqual", bi, e.c(0)))
    return _store_row(k, e, obuf, (rows, row, valid), y)


# ---- rmsnorm, softmax
@functools.cache
def emit_rmsnorm(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.rmsnorm over rows of n: one invocation per row.
    Bindings: 0 x f32[rows*n], 1 w f32[n], 2 tables, 3 y. Push: rows, n, eps bits."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf, wbuf = k.buffer("x", m.f32), k.buffer("w", m.f32)
    k.tables = k.buffer("tables", m.f32)
    obuf = k.buffer("y", m.f32, writable=True)
    e, (rows, n, eps), row = k.start(["rows", "n", "eps"])
    f = e.f
    valid = e.b("ULessThan", row, rows)
    nn = e.sel(valid, n, e.c(0))
    base = e.u("IMul", row, n)

    def sq(i):
        x = _f32_at(e, xbuf, e.u("IAdd", base, i))
        return e.fmul(x, x)
    s = _fold(e, nn, sq, "sumsq")
    r = e.rsqrt(e.fadd(e.div_n(s, n), e.canon(e.flt(eps))))           # a denormal eps reads as 0
    with f.loop(nn, "out") as i:
        y = e.fmul(_f32_at(e, xbuf, e.u("IAdd", base, i)), r)
        _store(e, obuf, e.u("IAdd", base, i), e.fmul(y, _f32_at(e, wbuf, i)))
    f.end()
    return tuple(m.words())


def _softmax_row(e: Emit, n: int, read, write, live=None) -> int:
    """funcs.softmax of read(i), i < n, into write(i, v); returns the row's NaN flag (bool). A row
    of -inf is NaN (-inf - -inf), but for the attention's scores with no live cell (`live`, a
    bool, false): zeros (attention.attention)."""
    f, m = e.f, e.m
    ninf = e.flt(e.c(0xFF800000))
    mx = e.var(m.f32, "mx", ninf)
    nan = e.var(m.u32, "rownan", e.c(0))
    with f.loop(n, "max") as i:
        v = read(i)
        f.store(nan, e.sel(_is_nan(e, v), e.c(1), f.load(m.u32, nan)))
        f.store(mx, f.select(m.f32, e.b("FOrdGreaterThan", v, f.load(m.f32, mx)), v, f.load(m.f32, mx)))
    mxv = f.load(m.f32, mx)
    allninf = e.b("IEqual", e.bits(mxv), e.c(0xFF800000))
    m0 = f.select(m.f32, allninf, e.fc(0.0), mxv)

    def ex(i):
        v = e.exp(e.fsub(read(i), m0))
        write(i, v)
        return v
    r = e.recip(_fold(e, n, ex, "sum"))
    isnan = e.b("INotEqual", f.load(m.u32, nan), e.c(0))
    isnan = e.b("LogicalOr", isnan, allninf if live is None else e.b("LogicalAnd", allninf, live))
    with f.loop(n, "scale") as i:
        y = e.fmul(read(i, raw=True), r)
        y = e.sel(allninf, e.c(0), e.bits(y))
        write(i, e.flt(e.sel(isnan, e.c(QNAN), y)))
    return isnan


@functools.cache
def emit_softmax(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.softmax over rows of n: one invocation per row.
    Bindings: 0 x f32[rows*n], 1 tables, 2 y. Push: rows, n."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf = k.buffer("x", m.f32)
    k.tables = k.buffer("tables", m.f32)
    obuf = k.buffer("y", m.f32, writable=True)
    e, (rows, n), row = k.start(["rows", "n"])
    valid = e.b("ULessThan", row, rows)
    nn = e.sel(valid, n, e.c(0))
    base = e.u("IMul", row, n)

    def read(i, raw=False):
        return _f32_at(e, obuf if raw else xbuf, e.u("IAdd", base, i))
    _softmax_row(e, nn, read, lambda i, v: _store(e, obuf, e.u("IAdd", base, i), v))
    e.f.end()
    return tuple(m.words())


@functools.cache
def emit_unary(fn: str, flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """y[i] = funcs.<fn>(x[i]) for fn in UNARY (exp, recip, rsqrt, ln, ln1p, sigmoid, silu,
    softplus). Bindings: 0 x, 1 tables, 2 y. Push: n."""
    if fn not in UNARY:
        raise BankmlError(f"portable SPIR-V: no unary kernel {fn!r}")
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf = k.buffer("x", m.f32)
    k.tables = k.buffer("tables", m.f32)
    obuf = k.buffer("y", m.f32, writable=True)
    e, (n,), i = k.start(["n"])
    with e.f.if_then(e.b("ULessThan", i, n), "valid"):
        _store(e, obuf, i, getattr(e, fn)(_f32_at(e, xbuf, i)))
    e.f.end()
    return tuple(m.words())


@functools.cache
def emit_binary(op: str, flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """y[i] = arith.<op>(a[i], b[i]) for op in add, sub, mul: the f32 steps alone (for their
    tests). Bindings: 0 a, 1 b, 2 y. Push: n."""
    if op not in ("add", "sub", "mul"):
        raise BankmlError(f"portable SPIR-V: no binary kernel {op!r}")
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    abuf, bbuf = k.buffer("a", m.f32), k.buffer("b", m.f32)
    obuf = k.buffer("y", m.f32, writable=True)
    e, (n,), i = k.start(["n"])
    with e.f.if_then(e.b("ULessThan", i, n), "valid"):
        _store(e, obuf, i, getattr(e, "f" + op)(_f32_at(e, abuf, i), _f32_at(e, bbuf, i)))
    e.f.end()
    return tuple(m.words())


# ---- row reductions, l2norm, hadamard (funcs.py)
def _row_module(flushing: bool, rte: bool, tables: bool, out_u32: bool = False, push=("rows", "n")):
    """A module of one invocation per row of n: bindings 0 x f32[rows*n], (1 tables), then y (f32,
    or u32). Returns (module, emitter, x, y, push values, row, row base, n (0 past the rows), valid)."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf = k.buffer("x", m.f32)
    if tables:
        k.tables = k.buffer("tables", m.f32)
    obuf = k.buffer("y", m.u32 if out_u32 else m.f32, writable=True)
    e, vals, row = k.start(list(push))
    valid = e.b("ULessThan", row, vals[0])
    return k, e, xbuf, obuf, vals, row, e.u("IMul", row, vals[1]), e.sel(valid, vals[1], e.c(0)), valid


@functools.cache
def emit_fmax(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.fmax over rows of n: the largest value, folded from -inf, a NaN passed over, a zero
    maximum +0. One invocation per row. Bindings: 0 x f32[rows*n], 1 y f32[rows]. Push: rows, n."""
    k, e, xbuf, obuf, _, row, base, nn, valid = _row_module(flushing, rte, False)
    f, f32 = e.f, k.m.f32
    mx = e.var(f32, "mx", e.flt(e.c(0xFF800000)))
    with f.loop(nn, "max") as i:
        v = _f32_at(e, xbuf, e.u("IAdd", base, i))
        f.store(mx, f.select(f32, e.b("FOrdGreaterThan", v, f.load(f32, mx)), v, f.load(f32, mx)))
    mb = e.bits(f.load(f32, mx))
    zero = e.b("IEqual", e.u("BitwiseAnd", mb, e.c(0x7FFFFFFF)), e.c(0))
    with f.if_then(valid, "store"):
        _store(e, obuf, row, e.flt(e.sel(zero, e.c(0), mb)))
    f.end()
    return tuple(k.m.words())


@functools.cache
def emit_absmax(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.absmax over rows of n: the largest magnitude, folded from +0, a denormal read as 0, a
    NaN passed over (magnitudes compared as their bits). One invocation per row. Bindings: 0 x
    f32[rows*n], 1 y f32[rows]. Push: rows, n."""
    k, e, xbuf, obuf, _, row, base, nn, valid = _row_module(flushing, rte, False)
    f, u32 = e.f, k.m.u32
    amax = e.var(u32, "amax", e.c(0))
    with f.loop(nn, "amax") as i:
        mag = e.mag(_f32_at(e, xbuf, e.u("IAdd", base, i)))
        up = e.b("LogicalAnd", e.b("ULessThanEqual", mag, e.c(EXP)), e.b("UGreaterThan", mag, f.load(u32, amax)))
        f.store(amax, e.sel(up, mag, f.load(u32, amax)))
    with f.if_then(valid, "store"):
        _store(e, obuf, row, e.flt(f.load(u32, amax)))
    f.end()
    return tuple(k.m.words())


@functools.cache
def emit_argmax(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.argmax over rows of n: the first index of the largest non-NaN value (the two zeros
    equal; of a row of -inf and NaN the first -inf), 0 when every element is NaN. One invocation
    per row. Bindings: 0 x f32[rows*n], 1 y u32[rows]. Push: rows, n."""
    k, e, xbuf, obuf, _, row, base, nn, valid = _row_module(flushing, rte, False, out_u32=True)
    f, m = e.f, k.m
    best, idx = e.var(m.f32, "best", e.flt(e.c(0xFF800000))), e.var(m.u32, "idx", e.c(0))
    found = e.var(m.u32, "found", e.c(0))
    with f.loop(nn, "argmax") as i:
        v = _f32_at(e, xbuf, e.u("IAdd", base, i))
        first = e.b("IEqual", f.load(m.u32, found), e.c(0))
        take = e.b("LogicalAnd", f.op("LogicalNot", m.bool, _is_nan(e, v)),
                   e.b("LogicalOr", first, e.b("FOrdGreaterThan", v, f.load(m.f32, best))))
        f.store(best, f.select(m.f32, take, v, f.load(m.f32, best)))
        f.store(idx, e.sel(take, i, f.load(m.u32, idx)))
        f.store(found, e.sel(take, e.c(1), f.load(m.u32, found)))
    with f.if_then(valid, "store"):
        f.store(f.chain(B.SC_STORAGE_BUFFER, m.u32, obuf, e.c(0), row), f.load(m.u32, idx))
    f.end()
    return tuple(m.words())


@functools.cache
def emit_l2norm(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.l2norm over rows of n: x · rsqrt(fold_sum(x·x) + eps). One invocation per row.
    Bindings: 0 x f32[rows*n], 1 tables, 2 y. Push: rows, n, eps bits."""
    k, e, xbuf, obuf, (_, _, eps), row, base, nn, _ = _row_module(flushing, rte, True, push=("rows", "n", "eps"))
    f = e.f

    def sq(i):
        x = _f32_at(e, xbuf, e.u("IAdd", base, i))
        return e.fmul(x, x)
    r = e.rsqrt(e.fadd(_fold(e, nn, sq, "sumsq"), e.canon(e.flt(eps))))
    with f.loop(nn, "out") as i:
        _store(e, obuf, e.u("IAdd", base, i), e.fmul(_f32_at(e, xbuf, e.u("IAdd", base, i)), r))
    f.end()
    return tuple(k.m.words())


@functools.cache
def emit_hadamard(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """funcs.hadamard over rows of n = 2^L, in y: for h = 1, 2, 4, ..., n/2, each pair
    (y[j], y[j+h]) of every 2h-block becomes (y[j] + y[j+h], y[j] - y[j+h]). One invocation per
    row. Bindings: 0 x f32[rows*n], 1 y f32[rows*n]. Push: rows, n, L."""
    k, e, xbuf, obuf, (_, n, L), row, base, nn, valid = _row_module(flushing, rte, False, push=("rows", "n", "L"))
    f = e.f
    with f.loop(nn, "copy") as i:
        _store(e, obuf, e.u("IAdd", base, i), _f32_at(e, xbuf, e.u("IAdd", base, i)))
    half = e.u("ShiftRightLogical", nn, e.c(1))
    with f.loop(e.sel(valid, L, e.c(0)), "stage") as s:
        h = e.u("ShiftLeftLogical", e.c(1), s)
        with f.loop(half, "pair") as p:
            # pair p: block p >> s (of 2h), offset p & (h - 1) in its lower half
            lo = e.u("IAdd", e.u("ShiftLeftLogical", e.u("ShiftRightLogical", p, s), e.u("IAdd", s, e.c(1))),
                     e.u("BitwiseAnd", p, e.u("ISub", h, e.c(1))))
            a_at, b_at = e.u("IAdd", base, lo), e.u("IAdd", e.u("IAdd", base, lo), h)
            a, b = _f32_at(e, obuf, a_at), _f32_at(e, obuf, b_at)
            _store(e, obuf, a_at, e.fadd(a, b))
            _store(e, obuf, b_at, e.fsub(a, b))
    f.end()
    return tuple(k.m.words())


# ---- Qwen3.5's recurrence (gdn.py)
@functools.cache
def emit_conv(silu: bool, flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """gdn.conv (silu) or gdn.conv_sum per token over T tokens: one invocation per channel, its
    ring the state's row (taps - 1 values, oldest first), left holding the last taps - 1 inputs.
    Bindings: 0 x f32[T*ch], 1 kernel f32[ch*taps], 2 tables, 3 state f32[ch*(taps-1)], 4 y
    f32[T*ch]. Push: T, ch, taps."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    xbuf, wbuf = k.buffer("x", m.f32), k.buffer("kernel", m.f32)
    k.tables = k.buffer("tables", m.f32)
    sbuf, obuf = k.buffer("state", m.f32, writable=True), k.buffer("y", m.f32, writable=True)
    e, (T, ch, taps), c = k.start(["T", "ch", "taps"])
    f = e.f
    keep = e.u("ISub", taps, e.c(1))
    with f.if_then(e.b("ULessThan", c, ch), "valid"):
        srow, wrow = e.u("IMul", c, keep), e.u("IMul", c, taps)
        with f.loop(T, "t") as t:
            acc = e.var(m.f32, "acc", e.fc(0.0))
            with f.loop(keep, "tap") as j:
                r = _f32_at(e, sbuf, e.u("IAdd", srow, j))
                f.store(acc, e.fadd(f.load(m.f32, acc), e.fmul(r, _f32_at(e, wbuf, e.u("IAdd", wrow, j)))))
            x = _f32_at(e, xbuf, e.u("IAdd", e.u("IMul", t, ch), c))
            y = e.fadd(f.load(m.f32, acc), e.fmul(x, _f32_at(e, wbuf, e.u("IAdd", wrow, keep))))
            if silu:                             # funcs.silu: y * recip(1 + exp(-y))
                y = e.silu(y)
            _store(e, obuf, e.u("IAdd", e.u("IMul", t, ch), c), y)
            with f.loop(e.u("ISub", keep, e.c(1)), "shift") as j:        # the ring moves on by one
                _store(e, sbuf, e.u("IAdd", srow, j), _f32_at(e, sbuf, e.u("IAdd", srow, e.u("IAdd", j, e.c(1)))))
            _store(e, sbuf, e.u("IAdd", srow, e.u("ISub", keep, e.c(1))), x)
    f.end()
    return tuple(m.words())


@functools.cache
def emit_gdn(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """gdn.gdn_row over T tokens: one invocation per (v-head h, value row r) of the state, its q/k
    head h % Hk; decay exp(g), kq = fdot(k, q) per token (each invocation its own, the same bits).
    Bindings: 0 q f32[T*Hk*S], 1 k, 2 v f32[T*Hv*S], 3 g f32[T*Hv], 4 beta, 5 tables, 6 state
    f32[Hv*S*S] (row r of head h at (h*S + r)*S), 7 out f32[T*Hv*S]. Push: T, Hk, Hv, S, scale bits."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    qbuf, kbuf, vbuf, gbuf, bbuf = (k.buffer(n, m.f32) for n in ("q", "k", "v", "g", "beta"))
    k.tables = k.buffer("tables", m.f32)
    sbuf, obuf = k.buffer("state", m.f32, writable=True), k.buffer("out", m.f32, writable=True)
    e, (T, Hk, Hv, S, scale), gid = k.start(["T", "Hk", "Hv", "S", "scale"])
    f = e.f
    with f.if_then(e.b("ULessThan", gid, e.u("IMul", Hv, S)), "valid"):
        h, r = e.u("UDiv", gid, S), e.u("UMod", gid, S)
        hq = e.u("UMod", h, Hk)
        row = e.u("IMul", gid, S)
        with f.loop(T, "t") as t:
            qb = e.u("IMul", e.u("IAdd", e.u("IMul", t, Hk), hq), S)
            th = e.u("IAdd", e.u("IMul", t, Hv), h)

            def q_(i):
                return _f32_at(e, qbuf, e.u("IAdd", qb, i))

            def k_(i):
                return _f32_at(e, kbuf, e.u("IAdd", qb, i))

            def m_(i):
                return _f32_at(e, sbuf, e.u("IAdd", row, i))
            kq = _fold(e, S, lambda i: e.fmul(k_(i), q_(i)), "kq")
            rq = _fold(e, S, lambda i: e.fmul(m_(i), q_(i)), "rq")
            rk = _fold(e, S, lambda i: e.fmul(m_(i), k_(i)), "rk")
            decay, beta = e.exp(_f32_at(e, gbuf, th)), _f32_at(e, bbuf, th)
            vr = _f32_at(e, vbuf, e.u("IAdd", e.u("IMul", th, S), r))
            coef = e.fmul(beta, e.fsub(vr, e.fmul(decay, rk)))
            with f.loop(S, "upd") as i:
                _store(e, sbuf, e.u("IAdd", row, i), e.fadd(e.fmul(decay, m_(i)), e.fmul(coef, k_(i))))
            y = e.fmul(e.fadd(e.fmul(decay, rq), e.fmul(coef, kq)), e.flt(scale))
            _store(e, obuf, e.u("IAdd", e.u("IMul", th, S), r), y)
    f.end()
    return tuple(m.words())


# ---- a lazily flushed head (gdn.py: Logged, gdn_flush, gdn_fold(_trailing), gdn_read)
def _log_buffers(k: _Module) -> tuple[int, int, int, int]:
    """The log's bindings 0..3: keys f32[L*S_k], values f32[L*S_v], g f32[L], beta f32[L]; then tables."""
    m = k.m
    bufs = tuple(k.buffer(n, m.f32) for n in ("keys", "values", "g", "beta"))
    k.tables = k.buffer("tables", m.f32)
    return bufs


@functools.cache
def emit_gdn_flush(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """gdn.gdn_flush of a head's rows: one invocation per value row r, every logged token's
    gdn_update (value r of its values) replayed in order over the row (no store: f32 rows).
    Bindings: 0-3 the log, 4 tables, 5 rows f32[S_v*S_k]. Push: L, S_k, S_v."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    kbuf, vbuf, gbuf, bbuf = _log_buffers(k)
    rbuf = k.buffer("rows", m.f32, writable=True)
    e, (L, Sk, Sv), r = k.start(["L", "S_k", "S_v"])
    f = e.f
    with f.if_then(e.b("ULessThan", r, Sv), "valid"):
        row = e.u("IMul", r, Sk)
        with f.loop(L, "tok") as t:
            kb = e.u("IMul", t, Sk)
            rk = _fold(e, Sk, lambda i: e.fmul(_f32_at(e, rbuf, e.u("IAdd", row, i)),
                                               _f32_at(e, kbuf, e.u("IAdd", kb, i))), "rk")
            decay, beta = e.exp(_f32_at(e, gbuf, t)), _f32_at(e, bbuf, t)
            vr = _f32_at(e, vbuf, e.u("IAdd", e.u("IMul", t, Sv), r))
            coef = e.fmul(beta, e.fsub(vr, e.fmul(decay, rk)))
            with f.loop(Sk, "upd") as i:
                at = e.u("IAdd", row, i)
                _store(e, rbuf, at, e.fadd(e.fmul(decay, _f32_at(e, rbuf, at)),
                                           e.fmul(coef, _f32_at(e, kbuf, e.u("IAdd", kb, i)))))
    f.end()
    return tuple(m.words())


@functools.cache
def emit_gdn_fold(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """gdn.gdn_fold_trailing of one head's log: one invocation walks the log newest first from q
    (coef = beta·(k·y), carried += coef·v[:width], y = decay·(y − coef·k)), writing (y, carried)
    when only the oldest `older` tokens are left, then at the end (gdn_fold: the second pair).
    Bindings: 0-3 the log, 4 tables, 5 q f32[S_k], 6 y f32[2*S_k] (newer, whole), 7 carried
    f32[2*width]. Push: L, S_k, S_v, width, older."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    kbuf, vbuf, gbuf, bbuf = _log_buffers(k)
    qbuf = k.buffer("q", m.f32)
    ybuf, cbuf = k.buffer("y", m.f32, writable=True), k.buffer("carried", m.f32, writable=True)
    e, (L, Sk, Sv, width, older), gid = k.start(["L", "S_k", "S_v", "width", "older"])
    f = e.f

    def snapshot(slot):                              # (y, carried) into the slot's half
        with f.loop(Sk, "sy") as i:
            _store(e, ybuf, e.u("IAdd", e.u("IMul", slot, Sk), i), _f32_at(e, ybuf, e.u("IAdd", Sk, i)))
        with f.loop(width, "sc") as i:
            _store(e, cbuf, e.u("IAdd", e.u("IMul", slot, width), i), _f32_at(e, cbuf, e.u("IAdd", width, i)))
    with f.if_then(e.b("IEqual", gid, e.c(0)), "one"):
        # the walk keeps (y, carried) in the second halves
        with f.loop(Sk, "y0") as i:
            _store(e, ybuf, e.u("IAdd", Sk, i), _f32_at(e, qbuf, i))
        with f.loop(width, "c0") as i:
            _store(e, cbuf, e.u("IAdd", width, i), e.fc(0.0))
        with f.loop(L, "walk") as w:
            t = e.u("ISub", e.u("ISub", L, w), e.c(1))               # newest first
            with f.if_then(e.b("IEqual", e.u("IAdd", t, e.c(1)), older), "stop"):
                snapshot(e.c(0))
            kb = e.u("IMul", t, Sk)
            ky = _fold(e, Sk, lambda i: e.fmul(_f32_at(e, kbuf, e.u("IAdd", kb, i)),
                                               _f32_at(e, ybuf, e.u("IAdd", Sk, i))), "ky")
            coef = e.fmul(_f32_at(e, bbuf, t), ky)
            decay = e.exp(_f32_at(e, gbuf, t))
            with f.loop(width, "carry") as i:
                at = e.u("IAdd", width, i)
                v = _f32_at(e, vbuf, e.u("IAdd", e.u("IMul", t, Sv), i))
                _store(e, cbuf, at, e.fadd(_f32_at(e, cbuf, at), e.fmul(coef, v)))
            with f.loop(Sk, "decay") as i:
                at = e.u("IAdd", Sk, i)
                kv = _f32_at(e, kbuf, e.u("IAdd", kb, i))
                _store(e, ybuf, at, e.fmul(decay, e.fsub(_f32_at(e, ybuf, at), e.fmul(coef, kv))))
        with f.if_then(e.b("IEqual", older, e.c(0)), "no_older"):      # the newer tokens are all
            snapshot(e.c(0))
    f.end()
    return tuple(m.words())


@functools.cache
def emit_gdn_read(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """gdn.gdn_read of each stored row through a folded query: (row·y + carried[r])·scale, one
    invocation per row. Bindings: 0 rows f32[R*S_k], 1 y f32[S_k], 2 carried f32[R], 3 out f32[R].
    Push: R, S_k, scale bits."""
    k = _Module(flushing=flushing, rte=rte)
    m = k.m
    rbuf, ybuf, cbuf = k.buffer("rows", m.f32), k.buffer("y", m.f32), k.buffer("carried", m.f32)
    obuf = k.buffer("out", m.f32, writable=True)
    e, (R, Sk, scale), r = k.start(["R", "S_k", "scale"])
    with e.f.if_then(e.b("ULessThan", r, R), "valid"):
        row = e.u("IMul", r, Sk)
        dot = _fold(e, Sk, lambda i: e.fmul(_f32_at(e, rbuf, e.u("IAdd", row, i)), _f32_at(e, ybuf, i)), "ry")
        _store(e, obuf, r, e.fmul(e.fadd(dot, _f32_at(e, cbuf, r)), e.flt(scale)))
    e.f.end()
    return tuple(m.words())


# ---- attention of one decode step
@functools.cache
def emit_attention(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """attention.attention of M query rows: one invocation per (head, row) (workgroups x = head,
    y = row). Bindings: 0 q codes (M*H*D), 1 q info (M*H*D/32 blocks), 2 K cache rows, 3 V cache
    rows (n_kv x Hkv rows of f16 scale + D int8), 4 mask f32[M*n_kv], 5 tables, 6 scratch
    f32[M*H*n_kv], 7 out f32[M*H*D]. Push: H, H/Hkv, Hkv, D, n_kv, scale bits."""
    k = _Module(local=1, flushing=flushing, rte=rte)
    m = k.m
    cbuf, ibuf, kbuf, vbuf = k.buffer("q_codes"), k.buffer("q_info"), k.buffer("k_cache"), k.buffer("v_cache")
    mbuf = k.buffer("mask", m.f32)
    k.tables = k.buffer("tables", m.f32)
    sbuf = k.buffer("scratch", m.f32, writable=True)
    obuf = k.buffer("out", m.f32, writable=True)
    e, (H, group, Hkv, D, n_kv, scale), h = k.start(["H", "group", "Hkv", "D", "n_kv", "scale"])
    f = e.f
    u32, f32 = m.u32, m.f32
    valid = e.b("ULessThan", h, H)
    ncell = e.sel(valid, n_kv, e.c(0))
    kvh = f.op("UDiv", u32, h, group, name="kv_head")
    rbytes = e.u("IAdd", D, e.c(2))
    nsub = e.u("ShiftRightLogical", D, e.c(5))

    def row_at(j):                                     # byte offset of cell j's row for kvh
        return e.u("IMul", e.u("IAdd", e.u("IMul", j, Hkv), kvh), rbytes)
    hq = e.u("IAdd", e.u("IMul", k.gid_y, H), h, name="row_head")     # the head's index in q, out
    mrow = e.u("IMul", k.gid_y, n_kv, name="mask_row")
    srow = e.u("IMul", hq, n_kv)
    P, X = e.terms()

    def dead(j):                                       # cell j masked for this row: no position
        return e.b("IEqual", e.bits(_f32_at(e, mbuf, e.u("IAdd", mrow, j))), e.c(0xFF800000))
    # 1. scores; a masked cell's -inf, whatever its K row
    anylive = e.var(u32, "anylive", e.c(0))
    with f.loop(ncell, "cell") as j:
        kr = row_at(j)
        ks, kx, kbad = _f16_parts(e, _u16(e, kbuf, kr))
        bad = e.var(u32, "sbad", e.sel(kbad, e.c(1), e.c(0)))
        with f.loop(nsub, "qs") as s:
            blk = e.u("IAdd", e.u("IMul", hq, nsub), s)
            info0 = _word(e, ibuf, e.u("ShiftLeftLogical", blk, e.c(3)))
            ae = _word(e, ibuf, e.u("IAdd", e.u("ShiftLeftLogical", blk, e.c(3)), e.c(4)))
            dot = e.var(u32, "sdot", e.c(0))
            with f.loop(e.c(32), "qi") as i:
                d = e.u("IAdd", e.u("ShiftLeftLogical", s, e.c(5)), i)
                a = _s8(e, cbuf, e.u("IAdd", e.u("IMul", hq, D), d))
                kv = _s8(e, kbuf, e.u("IAdd", kr, e.u("IAdd", d, e.c(2))))
                f.store(dot, e.u("IAdd", f.load(u32, dot), e.u("IMul", a, kv)))
            p = e.w("IMul", e.w("IMul", e.zext64(e.u("BitwiseAnd", info0, e.c(0xFF))), e.sext64(ks)),
                    e.sext64(f.load(u32, dot)))
            e.put_term(P, X, s, p, e.u("IAdd", ae, kx))
            qbad = e.b("INotEqual", e.u("ShiftRightLogical", info0, e.c(8)), e.c(0))
            f.store(bad, e.sel(qbad, e.c(1), f.load(u32, bad)))
        sc = e.flt(e.sel(e.b("INotEqual", f.load(u32, bad), e.c(0)), e.c(QNAN), e.round_terms(P, X, nsub)))
        dj = dead(j)
        sc = f.select(f32, dj, e.flt(e.c(0xFF800000)), e.fmul(sc, e.flt(scale)))
        f.store(anylive, e.sel(dj, f.load(u32, anylive), e.c(1)))
        _store(e, sbuf, e.u("IAdd", srow, j), sc)

    # 2. p = softmax(scores), in place
    def read(i, raw=False):
        return _f32_at(e, sbuf, e.u("IAdd", srow, i))
    live = e.b("INotEqual", f.load(u32, anylive), e.c(0))
    _softmax_row(e, ncell, read, lambda i, v: _store(e, sbuf, e.u("IAdd", srow, i), v), live)

    # 3. per block of 32 cells: w_j = r(p_j * s_vj) (0 for a masked cell), a power-of-two scale
    #    2^E, codes W_j, out += r(2^E * Σ_j W_j v_j) (+0 for an exact zero; a block with no live
    #    cell is none of the document's: -0.0); any NaN w: the head is NaN
    wa = e.var(m.type("TypeArray", u32, e.c(32)), "W")
    nan = e.var(u32, "wnan", e.c(0))
    obase = e.u("IMul", hq, D)
    with f.loop(e.u("ShiftRightLogical", ncell, e.c(5)), "vb") as b:
        amax = e.var(u32, "amax", e.c(0))
        blive = e.var(u32, "blive", e.c(0))

        def w_of(i):                                # (w of the block's cell i, whether it is masked)
            j = e.u("IAdd", e.u("ShiftLeftLogical", b, e.c(5)), i)
            sv = _f16_to_f32(e, _u16(e, vbuf, row_at(j)))
            dj = dead(j)
            return f.select(f32, dj, e.fc(0.0), e.fmul(read(j), sv)), dj
        with f.loop(e.c(32), "wmax") as i:
            w, dj = w_of(i)
            f.store(blive, e.sel(dj, f.load(u32, blive), e.c(1)))
            wb = e.bits(w)
            mag = e.u("BitwiseAnd", wb, e.c(0x7FFFFFFF))
            f.store(nan, e.sel(e.b("UGreaterThan", mag, e.c(EXP)), e.c(1), f.load(u32, nan)))
            f.store(amax, e.sel(e.b("UGreaterThan", mag, f.load(u32, amax)), mag, f.load(u32, amax)))
        am = f.load(u32, amax)                      # bits of max |w| (NaN handled by the flag)
        ab = e.u("BitFieldUExtract", am, e.c(23), e.c(8))
        cs = e.u("BitwiseOr", e.u("BitwiseAnd", am, e.c(0x7FFFFF)), e.c(0x800000))
        pe = e.u("ISub", ab, e.c(127))
        E = e.sel(e.b("ULessThanEqual", cs, e.c(127 << 17)), e.u("ISub", pe, e.c(6)), e.u("ISub", pe, e.c(5)))
        E = e.sel(e.b("IEqual", am, e.c(0)), e.c(0), E)
        with f.loop(e.c(32), "wq") as i:
            wb = e.bits(w_of(i)[0])
            be = e.u("BitFieldUExtract", wb, e.c(23), e.c(8))
            c = e.zext64(e.sel(e.b("IEqual", be, e.c(0)), e.c(0),
                               e.u("BitwiseOr", e.u("BitwiseAnd", wb, e.c(0x7FFFFF)), e.c(0x800000))))
            sh = e.u("ISub", e.u("IAdd", E, e.c(150)), be)          # >= 16 for |w| <= 127 * 2^E
            sh = e.sel(e.b("SGreaterThan", sh, e.c(60)), e.c(60), e.sel(e.b("SLessThan", sh, e.c(1)), e.c(1), sh))
            q = e.lo32(e.rne_shift64(c, sh))
            q = e.sel(e.b("INotEqual", e.u("BitwiseAnd", wb, e.c(SIGN)), e.c(0)), e.u("ISub", e.c(0), q), q)
            f.store(f.chain(B.SC_FUNCTION, u32, wa, i), q)
        with f.loop(D, "vd") as d:
            s = e.var(u32, "vsum", e.c(0))
            with f.loop(e.c(32), "vj") as i:
                j = e.u("IAdd", e.u("ShiftLeftLogical", b, e.c(5)), i)
                v = _s8(e, vbuf, e.u("IAdd", row_at(j), e.u("IAdd", d, e.c(2))))
                W = f.load(u32, f.chain(B.SC_FUNCTION, u32, wa, i))
                f.store(s, e.u("IAdd", f.load(u32, s), e.u("IMul", W, v)))
            sv = f.load(u32, s)
            r = e.sel(e.b("IEqual", f.load(u32, blive), e.c(0)), e.c(SIGN), e.int_to_f32(e.sext64(sv), E))
            oi = e.u("IAdd", obase, d)
            prev = f.load(f32, f.chain(B.SC_STORAGE_BUFFER, f32, obuf, e.c(0), oi))
            _store(e, obuf, oi, f.select(f32, e.b("IEqual", b, e.c(0)), e.flt(r), e.fadd(prev, e.flt(r))))
    with f.if_then(e.b("INotEqual", f.load(u32, nan), e.c(0)), "nan"):
        with f.loop(e.sel(valid, D, e.c(0)), "nanout") as d:
            _store(e, obuf, e.u("IAdd", obase, d), e.flt(e.c(QNAN)))
    f.end()
    return tuple(m.words())


# ---- attention over f32 rows (attention.attend_vector)
@functools.cache
def emit_attend_vector(flushing: bool = False, rte: bool = True) -> tuple[int, ...]:
    """attention.attend_vector of each head: one invocation per head (workgroups x = head).
    s_j = fdot(k_j, q) * scale (lanes by element), p = softmax(s) (`_softmax_row`, from the
    scores to the scratch's second half), out[d] = fdot over the positions of (v[j, d], p[j]) (lanes by position).
    Bindings: 0 q f32[H*D], 1 k f32[H*n*D], 2 v f32[H*n*D], 3 tables, 4 scratch f32[2*H*n]
    (the scores, then p), 5 out f32[H*D]. Push: H, n, D, scale bits."""
    k = _Module(local=1, flushing=flushing, rte=rte)
    m = k.m
    qbuf, kbuf, vbuf = k.buffer("q", m.f32), k.buffer("k", m.f32), k.buffer("v", m.f32)
    k.tables = k.buffer("tables", m.f32)
    pbuf = k.buffer("p", m.f32, writable=True)
    obuf = k.buffer("out", m.f32, writable=True)
    e, (H, n, D, scale), h = k.start(["H", "n", "D", "scale"])
    f = e.f
    valid = e.b("ULessThan", h, H)
    nn = e.sel(valid, n, e.c(0))
    dd = e.sel(valid, D, e.c(0))
    qbase, prow = e.u("IMul", h, D), e.u("IMul", h, n)
    kvbase = e.u("IMul", e.u("IMul", h, n), D)
    sc = e.canon(e.flt(scale))                                          # a denormal scale reads as 0
    # 1. scores: fdot(k_j, q) (lanes by element), times scale
    with f.loop(nn, "pos") as j:
        krow = e.u("IAdd", kvbase, e.u("IMul", j, D))

        def kq(i):
            return e.fmul(_f32_at(e, kbuf, e.u("IAdd", krow, i)), _f32_at(e, qbuf, e.u("IAdd", qbase, i)))
        _store(e, pbuf, e.u("IAdd", prow, j), e.fmul(_fold(e, D, kq, "kq"), sc))

    # 2. p = softmax(s) into the scratch's second half (not in place: `_fold` reads its element 0
    #    again for a last chunk's missing lanes, and the exp step writes what it reads)
    prow2 = e.u("IAdd", e.u("IMul", H, n), prow)

    def read(i, raw=False):
        return _f32_at(e, pbuf, e.u("IAdd", prow2 if raw else prow, i))
    _softmax_row(e, nn, read, lambda i, v: _store(e, pbuf, e.u("IAdd", prow2, i), v))

    # 3. out[d] = fdot over the positions of (v[j, d], p[j]) (lanes by position)
    with f.loop(dd, "out") as d:
        def vp(j):
            at = e.u("IAdd", kvbase, e.u("IAdd", e.u("IMul", j, D), d))
            return e.fmul(_f32_at(e, vbuf, at), read(j, raw=True))
        _store(e, obuf, e.u("IAdd", qbase, d), _fold(e, nn, vp, "vp"))
    f.end()
    return tuple(m.words())


# ---- host side
E_MIN, E_MAX = -136, 118          # the exponents quantize_act gives a finite f32 block


def _check_exponents(a: quant.ActBlocks) -> None:
    """The wide accumulator holds every sum of terms whose exponents are those of quantize_act's
    blocks (docs/spirv.md); hand-made blocks beyond them are refused, not summed wrong."""
    e = np.asarray(a.e)[np.asarray(a.m) != 0]
    if e.size and (e.min() < E_MIN or e.max() > E_MAX):
        raise BankmlError(f"portable matvec: activation exponents {e.min()}..{e.max()} outside "
                          f"{E_MIN}..{E_MAX} (what quant.quantize_act gives)")



class PortableKernels:
    """The portable kernels on one Vulkan device (programs built on first use, kept here)."""

    def __init__(self, device, flushing: bool = False):
        """flushing: every kernel acts as the worst denormal-flushing device (portable.emit.Emit)."""
        from bankml.backends.spirv import runtime
        if not device.int64:
            raise runtime.DeviceRefused(f"Vulkan device {device.info}: the portable kernels need shaderInt64")
        self.d, self._programs, self.flushing = device, {}, flushing
        self.rte = device.info.rte32
        self.tables = tables_bytes()

    def program(self, key, words, n_buffers, push_words):
        from bankml.backends.spirv import runtime
        if key not in self._programs:
            self._programs[key] = runtime.Program(self.d, words, n_buffers, push_words)
        return self._programs[key]

    def close(self) -> None:
        for p in self._programs.values():
            p.close()
        self._programs = {}

    def matvec(self, w_raw: np.ndarray, wtype: int, a: quant.ActBlocks) -> np.ndarray:
        """quant.mul_mat(w_raw, wtype, a)[0] for one activation row a ([1, K] or [K]) -> f32[rows]."""
        return self.mul_mat(w_raw, wtype, a)[0]

    def mul_mat(self, w_raw: np.ndarray, wtype: int, a: quant.ActBlocks) -> np.ndarray:
        """coded.dot_sub32(w_raw, wtype, a) (quant.mul_mat for the types it reads): activation rows
        a [T, K] -> f32 [T, rows], one dispatch."""
        w_raw = np.ascontiguousarray(w_raw, np.uint8)
        rows, row_bytes = w_raw.shape
        K = a.q.shape[-1]
        if wtype not in MATVEC_TYPES or WEIGHT_TYPES[wtype].row_bytes(K) != row_bytes \
                or K % max(32, WEIGHT_TYPES[wtype].block):
            raise BankmlError(f"portable matvec: {rows} rows of {row_bytes} bytes are not type {wtype} rows of {K}")
        _check_exponents(a)
        codes, info = act_buffers(a)
        p = self.program(("matvec", wtype), emit_matvec(wtype, self.flushing, self.rte), 4, 3)
        T = a.q.size // K
        out = p.run([w_raw.tobytes(), codes, info, 4 * rows * T], [rows, K // 32, row_bytes],
                    (-(-rows // LOCAL), T), {3: (_F32, rows * T)})
        return out[3].reshape(T, rows)

    def mul_mat_blocks(self, w_raw: np.ndarray, wtype: int, a: quant.ActBlocks) -> np.ndarray:
        """coded.dot_blocks(w_raw, wtype, a) (PerBlock): activation rows a [T, K] quantized per the
        weight's block (quant.quantize_blocks(x, coded.block_of(wtype))) -> f32 [T, rows]."""
        w_raw = np.ascontiguousarray(w_raw, np.uint8)
        rows, row_bytes = w_raw.shape
        K = a.q.shape[-1]
        if wtype not in BLOCK_TYPES or WEIGHT_TYPES[wtype].row_bytes(K) != row_bytes or K % WEIGHT_TYPES[wtype].block:
            raise BankmlError(f"portable matvec: {rows} rows of {row_bytes} bytes are not type {wtype} rows of {K}")
        nblk = K // WEIGHT_TYPES[wtype].block
        if a.m.shape[-1] != nblk:
            raise BankmlError(f"portable matvec: {a.m.shape[-1]} activation blocks per row, not {nblk} "
                              f"(PerBlock: blocks of the weight's {WEIGHT_TYPES[wtype].block})")
        codes, info = act_buffers(a)
        p = self.program(("matvec_blocks", wtype), emit_matvec_blocks(wtype, self.flushing, self.rte), 4, 3)
        T = a.q.size // K
        out = p.run([w_raw.tobytes(), codes, info, 4 * rows * T], [rows, nblk, row_bytes],
                    (-(-rows // LOCAL), T), {3: (_F32, rows * T)})
        return out[3].reshape(T, rows)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
        x = np.ascontiguousarray(x, _F32)
        n = x.shape[-1]
        rows = x.size // n
        w = np.ones(n, _F32) if w is None else np.ascontiguousarray(w, _F32)
        p = self.program("rmsnorm", emit_rmsnorm(self.flushing, self.rte), 4, 3)
        out = p.run([x.tobytes(), w.tobytes(), self.tables, 4 * x.size],
                    [rows, n, int(np.float32(eps).view(np.uint32))], -(-rows // LOCAL), {3: (_F32, x.size)})
        return out[3].reshape(x.shape)

    def softmax(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, _F32)
        n = x.shape[-1]
        rows = x.size // n
        p = self.program("softmax", emit_softmax(self.flushing, self.rte), 3, 2)
        out = p.run([x.tobytes(), self.tables, 4 * x.size], [rows, n], -(-rows // LOCAL), {2: (_F32, x.size)})
        return out[2].reshape(x.shape)

    def _rows(self, x: np.ndarray) -> tuple[np.ndarray, int, int]:
        """x as f32 rows of its last axis: (x, rows, n); n must be at least 1."""
        x = np.ascontiguousarray(x, _F32)
        n = x.shape[-1] if x.ndim else 0
        if n < 1:
            raise BankmlError(f"portable row kernel: rows of {list(x.shape)} are empty")
        return x, x.size // n, n

    def fmax(self, x: np.ndarray) -> np.ndarray:
        """funcs.fmax over the last axis -> f32[...]."""
        x, rows, n = self._rows(x)
        p = self.program("fmax", emit_fmax(self.flushing, self.rte), 2, 2)
        return p.run([x.tobytes(), 4 * rows], [rows, n], -(-rows // LOCAL), {1: (_F32, rows)})[1].reshape(x.shape[:-1])

    def absmax(self, x: np.ndarray) -> np.ndarray:
        """funcs.absmax over the last axis -> f32[...]."""
        x, rows, n = self._rows(x)
        p = self.program("absmax", emit_absmax(self.flushing, self.rte), 2, 2)
        return p.run([x.tobytes(), 4 * rows], [rows, n], -(-rows // LOCAL), {1: (_F32, rows)})[1].reshape(x.shape[:-1])

    def argmax(self, x: np.ndarray) -> np.ndarray:
        """funcs.argmax over the last axis -> int64[...]."""
        x, rows, n = self._rows(x)
        p = self.program("argmax", emit_argmax(self.flushing, self.rte), 2, 2)
        out = p.run([x.tobytes(), 4 * rows], [rows, n], -(-rows // LOCAL), {1: (np.uint32, rows)})[1]
        return out.astype(np.int64).reshape(x.shape[:-1])

    def l2norm(self, x: np.ndarray, eps: float) -> np.ndarray:
        """funcs.l2norm(x, eps) over the last axis."""
        x, rows, n = self._rows(x)
        p = self.program("l2norm", emit_l2norm(self.flushing, self.rte), 3, 3)
        out = p.run([x.tobytes(), self.tables, 4 * x.size], [rows, n, int(np.float32(eps).view(np.uint32))],
                    -(-rows // LOCAL), {2: (_F32, x.size)})
        return out[2].reshape(x.shape)

    def hadamard(self, x: np.ndarray) -> np.ndarray:
        """funcs.hadamard over the last axis (a power of two)."""
        x, rows, n = self._rows(x)
        if n & (n - 1):
            raise BankmlError(f"portable hadamard: length {n} is not a power of two")
        p = self.program("hadamard", emit_hadamard(self.flushing, self.rte), 2, 3)
        out = p.run([x.tobytes(), 4 * x.size], [rows, n, n.bit_length() - 1], -(-rows // LOCAL),
                    {1: (_F32, x.size)})
        return out[1].reshape(x.shape)

    def unary(self, fn: str, x: np.ndarray) -> np.ndarray:
        """funcs.<fn> of every element, fn in UNARY (exp, recip, rsqrt, ln, ln1p, sigmoid, silu,
        softplus)."""
        x = np.ascontiguousarray(x, _F32)
        p = self.program(("unary", fn), emit_unary(fn, self.flushing, self.rte), 3, 1)
        return p.run([x.tobytes(), self.tables, 4 * x.size], [x.size], -(-x.size // LOCAL),
                     {2: (_F32, x.size)})[2].reshape(x.shape)

    def binary(self, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """arith.add / sub / mul of every pair."""
        a, b = np.ascontiguousarray(a, _F32), np.ascontiguousarray(b, _F32)
        p = self.program(("binary", op), emit_binary(op, self.flushing, self.rte), 3, 1)
        return p.run([a.tobytes(), b.tobytes(), 4 * a.size], [a.size], -(-a.size // LOCAL),
                     {2: (_F32, a.size)})[2].reshape(a.shape)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
                  scaling: quant.ActScaling = quant.ActScaling.SUB32) -> np.ndarray:
        """attention.attention(q[None], k, v, mask[None], scale, scaling)[0]: q f32 [H, D]; k, v
        cache rows [n_kv, Hkv] (n_kv a multiple of 32); mask f32 [n_kv] -> f32 [H, D]."""
        return self.attention_rows(np.asarray(q)[None], k, v, np.asarray(mask)[None], scale, scaling)[0]

    def attention_rows(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
                       scaling: quant.ActScaling = quant.ActScaling.SUB32) -> np.ndarray:
        """attention.attention(q, k, v, mask, scale, scaling) in one dispatch: q f32 [M, H, D]; k, v
        cache rows [n_kv, Hkv] (n_kv a multiple of 32); mask f32 [M, n_kv] -> f32 [M, H, D]. Under
        PerBlock each head is one block of wide scale, its m and e given to every block of 32 (the
        exact score is the one term's, as attention.attention computes it)."""
        M, H, D = q.shape
        n_kv, Hkv = k.shape
        if n_kv % 32 or D % 32 or H % Hkv or np.shape(mask) != (M, n_kv):
            raise BankmlError(f"portable attention: n_kv {n_kv} and D {D} must be multiples of 32, H {H} of Hkv "
                              f"{Hkv}, the mask [{M}, {n_kv}] not {list(np.shape(mask))}")
        rows = np.asarray(q, _F32).reshape(M * H, D)
        if scaling is quant.ActScaling.PER_BLOCK:
            w = quant.quantize_blocks(rows, D)
            a = quant.ActBlocks(w.q, *(np.repeat(f, D // 32, -1) for f in (w.m, w.e, w.bad)))
        else:
            a = quant.quantize_act(rows)
        codes, info = act_buffers(a)
        p = self.program("attention", emit_attention(self.flushing, self.rte), 8, 6)
        out = p.run([codes, info, np.ascontiguousarray(k).tobytes(), np.ascontiguousarray(v).tobytes(),
                     np.ascontiguousarray(mask, _F32).tobytes(), self.tables, 4 * M * H * n_kv, 4 * M * H * D],
                    [H, H // Hkv, Hkv, D, n_kv, int(np.float32(scale).view(np.uint32))], (H, M),
                    {7: (_F32, M * H * D)})
        return out[7].reshape(M, H, D)

    def attend_vector(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
        """attention.attend_vector of each head: q f32 [H, D]; k, v f32 [H, n, D] (the cached
        rows, n >= 1) -> f32 [H, D], one dispatch (one invocation per head)."""
        q, k, v = (np.ascontiguousarray(a, _F32) for a in (q, k, v))
        if q.ndim != 2 or k.ndim != 3 or k.shape != v.shape or k.shape[::2] != q.shape or 0 in k.shape:
            raise BankmlError(f"portable attend_vector: q {list(q.shape)}, k {list(k.shape)} and v "
                              f"{list(v.shape)} do not agree (q [H, D], k and v [H, n, D], none empty)")
        H, n, D = k.shape
        p = self.program("attend_vector", emit_attend_vector(self.flushing, self.rte), 6, 4)
        out = p.run([q.tobytes(), k.tobytes(), v.tobytes(), self.tables, 8 * H * n, 4 * H * D],
                    [H, n, D, int(np.float32(scale).view(np.uint32))], H, {5: (_F32, H * D)})
        return out[5].reshape(H, D)

    def conv(self, x: np.ndarray, kernel: np.ndarray, state: np.ndarray, silu: bool = True
             ) -> tuple[np.ndarray, np.ndarray]:
        """gdn.conv (silu) or gdn.conv_sum of each token of x f32 [T, ch] over the ring state
        [ch, taps - 1] (oldest first) and kernel [ch, taps] -> (y [T, ch], the new state)."""
        x, kernel = np.ascontiguousarray(x, _F32), np.ascontiguousarray(kernel, _F32)
        state = np.ascontiguousarray(state, _F32)
        (T, ch), taps = x.shape, kernel.shape[-1]
        if kernel.shape != (ch, taps) or state.shape != (ch, taps - 1) or taps < 2:
            raise BankmlError(f"portable conv: x {list(x.shape)}, kernel {list(kernel.shape)}, state "
                              f"{list(state.shape)} do not fit")
        p = self.program(("conv", silu), emit_conv(silu, self.flushing, self.rte), 5, 3)
        out = p.run([x.tobytes(), kernel.tobytes(), self.tables, state.tobytes(), 4 * x.size], [T, ch, taps],
                    -(-ch // LOCAL), {3: (_F32, state.size), 4: (_F32, x.size)})
        return out[4].reshape(T, ch), out[3].reshape(state.shape)

    def gated_delta_net(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                        state: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """gdn.gdn_row per token, v-head and value row (q, k [T, Hk, S]; v [T, Hv, S]; g, beta
        [T, Hv]; state [Hv, S, S]) -> (out [T, Hv, S], the new state): the GATED_DELTA_NET node
        of the portable profile (backends/reference/portable.py)."""
        q, k, v = (np.ascontiguousarray(a, _F32) for a in (q, k, v))
        g, beta, state = (np.ascontiguousarray(a, _F32) for a in (g, beta, state))
        T, Hv, S = v.shape
        Hk = q.shape[1]
        if q.shape != (T, Hk, S) or k.shape != q.shape or g.shape != (T, Hv) or beta.shape != (T, Hv) \
                or state.shape != (Hv, S, S) or Hv % Hk:
            raise BankmlError(f"portable gated_delta_net: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, "
                              f"g {list(g.shape)}, beta {list(beta.shape)}, state {list(state.shape)} do not fit")
        p = self.program("gdn", emit_gdn(self.flushing, self.rte), 8, 5)
        out = p.run([q.tobytes(), k.tobytes(), v.tobytes(), g.tobytes(), beta.tobytes(), self.tables,
                     state.tobytes(), 4 * v.size], [T, Hk, Hv, S, int(np.float32(scale).view(np.uint32))],
                    -(-(Hv * S) // LOCAL), {6: (_F32, state.size), 7: (_F32, v.size)})
        return out[7].reshape(v.shape), out[6].reshape(state.shape)

    # ---- a lazily flushed head
    def _log(self, log, s_k: int, s_v: int) -> list[bytes]:
        """The log's buffers (gdn.log_arrays), then the tables."""
        try:
            return [a.tobytes() for a in gdn.log_arrays(log, s_k, s_v)] + [self.tables]
        except ValueError as e:
            raise BankmlError(f"portable gdn: {e}") from None

    def gdn_flush(self, rows: np.ndarray, log) -> np.ndarray:
        """gdn.gdn_flush of every row r (value r) of a head: rows f32 [S_v, S_k], log a non-empty
        list of gdn.Logged -> the flushed rows."""
        rows = np.ascontiguousarray(rows, _F32)
        Sv, Sk = rows.shape
        bufs = self._log(log, Sk, Sv)
        p = self.program("gdn_flush", emit_gdn_flush(self.flushing, self.rte), 6, 3)
        out = p.run(bufs + [rows.tobytes()], [len(log), Sk, Sv], -(-Sv // LOCAL), {5: (_F32, rows.size)})
        return out[5].reshape(rows.shape)

    def gdn_fold_trailing(self, log, q: np.ndarray, width: int, older: int):
        """gdn.gdn_fold_trailing: ((y, carried) over the newer tokens, (y, carried) over the whole log)."""
        q = np.ascontiguousarray(q, _F32)
        try:
            Sk, Sv = gdn.check_fold(log, q, width, older)
        except ValueError as e:
            raise BankmlError(f"portable gdn: {e}") from None
        p = self.program("gdn_fold", emit_gdn_fold(self.flushing, self.rte), 8, 5)
        out = p.run(self._log(log, Sk, Sv) + [q.tobytes(), 8 * Sk, 8 * width], [len(log), Sk, Sv, width, older], 1,
                    {6: (_F32, 2 * Sk), 7: (_F32, 2 * width)})
        y, c = out[6].reshape(2, Sk), out[7].reshape(2, width)
        return (y[0], c[0]), (y[1], c[1])

    def gdn_fold(self, log, q: np.ndarray, width: int):
        """gdn.gdn_fold: (the folded query, the collected values)."""
        return self.gdn_fold_trailing(log, q, width, 0)[1]

    def gdn_read(self, rows: np.ndarray, y: np.ndarray, carried: np.ndarray, scale: float) -> np.ndarray:
        """gdn.gdn_read of each row (rows f32 [R, S_k], carried [R]) -> f32 [R]."""
        rows, y, carried = (np.ascontiguousarray(a, _F32) for a in (rows, y, carried))
        try:
            gdn.check_read(rows, y, carried)
        except ValueError as e:
            raise BankmlError(f"portable gdn: {e}") from None
        R, Sk = rows.shape
        p = self.program("gdn_read", emit_gdn_read(self.flushing, self.rte), 4, 3)
        return p.run([rows.tobytes(), y.tobytes(), carried.tobytes(), 4 * R],
                     [R, Sk, int(np.float32(scale).view(np.uint32))], -(-R // LOCAL), {3: (_F32, R)})[3]
