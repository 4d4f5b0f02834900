"""The Q1_0 x q8_0 matrix-vector kernel as SPIR-V: ggml_vec_dot_q1_0_q8_0 (AVX2), bit for bit.

ggml-cpu/arch/x86/quants.c:ggml_vec_dot_q1_0_q8_0, checked in libggml-cpu.so (vmulps, 3x
vfmadd132ps, vfmadd231ps, then hsum_float_8). Lane l of the 8-wide accumulator holds the int32 sum
of elements 4l..4l+3 of a 32-block. Per Q1_0 block ib (128 weights = q8_0 blocks 4ib..4ib+3):

    s_K   = sum_{t<4} (bit ? q : (int8)-q)        exact integers over 4 bytes, |s_K| <= 512
    blk   = r(dy_0 * s_0); blk = fma(dy_K, s_K, blk)  K = 1..3
    acc_l = fma(d_w, blk, acc_l)
    out   = ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))    hsum_float_8

How the GPU gets the same bits without trusting OpFma (docs/spirv.md has the proofs):
- dy_K * s_K is exact in f32 (11-bit f16 significand x 12-bit integer), so fma(dy_K, s_K, blk) is
  one rounding of an exact product: OpFMul then OpFAdd give it.
- fma(d_w, blk, acc) is emulated: blk splits into two 12-bit halves, so both products with the
  11-bit d_w are exact; then Boldo-Melquiond's FMA with round-to-odd (TwoSum, round-to-odd by bit
  twiddling, one final RN add).
- Every value is a multiple of 2^-48 (f16 scales are multiples of 2^-24), so no f32 value is ever
  subnormal: denormal flushing cannot change a bit. f16 -> f32 is integer arithmetic.
Every OpFAdd/OpFSub/OpFMul is NoContraction; RoundingModeRTE (and DenormPreserve where offered).

One invocation per (row, lane): 64 invocations = 8 rows per workgroup; lane 0 of each row does the
hsum from workgroup memory. Bindings: 0 weights (raw Q1_0 rows, u32 words), 1 activation (raw
q8_0 row), 2 output f32[rows]. Push constants: rows, blocks per row (K/128).
"""
from __future__ import annotations

import functools

from bankml.backends.spirv import builder as B

LOCAL = 64                     # invocations per workgroup
LANES = 8                      # ggml's __m256 accumulator
ROWS_PER_GROUP = LOCAL // LANES
Q1_BYTES, Q8_BYTES = 18, 34    # block_q1_0 (f16 d + 16 bytes), block_q8_0 (f16 d + 32 int8)
VARIANTS = ("exact", "fma_mul_add")  # fma_mul_add rounds d_w*blk before adding: a wrong kernel


class _Kernel:
    """Emitter state: the module, the function and the common constants."""

    def __init__(self, rte: bool, denorm_preserve: bool):
        self.m = m = B.Module()
        m.caps += [B.CAP_SHADER] + [B.CAP_RTE] * rte + [B.CAP_DENORM_PRESERVE] * denorm_preserve
        self.f: B.Function | None = None
        self.rte, self.denorm_preserve = rte, denorm_preserve

    def c(self, v: int) -> int:
        return self.m.const(self.m.u32, v)

    def fc(self, v: float) -> int:
        return self.m.const(self.m.f32, v)

    # ---- loads from raw byte buffers (u32 words)
    def word(self, buf: int, byte_off: int) -> int:
        f, m = self.f, self.m
        p = f.chain(B.SC_STORAGE_BUFFER, m.u32, buf, self.c(0), f.u("ShiftRightLogical", byte_off, self.c(2)))
        return f.load(m.u32, p)

    def u8(self, buf: int, off: int) -> int:
        f = self.f
        shift = f.u("ShiftLeftLogical", f.u("BitwiseAnd", off, self.c(3)), self.c(3))
        return f.u("BitFieldUExtract", self.word(buf, off), shift, self.c(8))

    def u16(self, buf: int, off: int) -> int:
        """Little-endian u16 at an even byte offset."""
        f = self.f
        shift = f.u("ShiftLeftLogical", f.u("BitwiseAnd", off, self.c(2)), self.c(3))
        return f.u("BitFieldUExtract", self.word(buf, off), shift, self.c(16))

    def sext8(self, x: int) -> int:
        return self.f.u("BitFieldSExtract", x, self.c(0), self.c(8))

    # ---- float pieces
    def f16_to_f32(self, h: int, name: str) -> int:
        """Exact: float(mant | implicit) * 2^(max(e,1)-25), sign OR-ed in; e == 31 by bits."""
        f, m = self.f, self.m
        e = f.u("BitFieldUExtract", h, self.c(10), self.c(5))
        mant = f.u("BitwiseAnd", h, self.c(0x3FF))
        is_sub = f.cmp("IEqual", e, self.c(0))
        full = f.select(m.u32, is_sub, mant, f.u("BitwiseOr", mant, self.c(0x400)))
        e1 = f.select(m.u32, is_sub, self.c(1), e)
        pow2 = f.bitcast(m.f32, f.u("ShiftLeftLogical", f.u("IAdd", e1, self.c(102)), self.c(23)))
        mag = f.bitcast(m.u32, f.fmul(f.op("ConvertSToF", m.f32, full), pow2))
        special = f.u("BitwiseOr", self.c(0x7F800000), f.u("ShiftLeftLogical", mant, self.c(13)))
        mag = f.select(m.u32, f.cmp("IEqual", e, self.c(31)), special, mag)
        sign = f.u("ShiftLeftLogical", f.u("BitwiseAnd", h, self.c(0x8000)), self.c(16))
        return f.bitcast(m.f32, f.u("BitwiseOr", mag, sign), name=name)

    def two_sum(self, a: int, b: int) -> tuple[int, int]:
        """s = RN(a+b), e = a+b-s exactly (Knuth, 6 ops)."""
        f = self.f
        s = f.fadd(a, b)
        bb = f.fsub(s, a)
        return s, f.fadd(f.fsub(a, f.fsub(s, bb)), f.fsub(b, bb))

    def fma_exact(self, a: int, b: int, c: int, name: str) -> int:
        """RN(a*b + c) for a with <= 12 significant bits, no subnormals (Boldo-Melquiond 2008)."""
        f, m = self.f, self.m
        bh = f.bitcast(m.f32, f.u("BitwiseAnd", f.bitcast(m.u32, b), self.c(0xFFFFF000)))
        bl = f.fsub(b, bh)                                  # exact: the low 12 bits of b
        ph, pl = f.fmul(a, bh), f.fmul(a, bl)               # exact: <= 24-bit products
        uh = f.fadd(ph, pl)                                 # Fast2Sum, |ph| >= |pl|
        ul = f.fsub(pl, f.fsub(uh, ph))                     # uh + ul = a*b exactly
        th, tl = self.two_sum(c, uh)                        # th + tl = c + uh exactly
        s, e = self.two_sum(tl, ul)
        sb, eb = f.bitcast(m.u32, s), f.bitcast(m.u32, e)   # v = RO(tl + ul): round to odd
        inexact = f.cmp("INotEqual", f.u("BitwiseAnd", eb, self.c(0x7FFFFFFF)), self.c(0))
        even = f.cmp("IEqual", f.u("BitwiseAnd", sb, self.c(1)), self.c(0))
        same_sign = f.cmp("IEqual", f.u("ShiftRightLogical", f.u("BitwiseXor", sb, eb), self.c(31)),
                          self.c(0))
        step = f.select(m.u32, same_sign, self.c(1), self.c(0xFFFFFFFF))
        vb = f.select(m.u32, f.op("LogicalAnd", m.bool, inexact, even), f.u("IAdd", sb, step), sb)
        return f.fadd(th, f.bitcast(m.f32, vb), name=name)


def _buffer(m: B.Module, binding: int, elem: int, name: str, writable: bool) -> int:
    arr = m.id()
    m.globals.append(B.inst("TypeRuntimeArray", arr, elem))
    m.decorate(arr, B.DEC_ARRAY_STRIDE, 4)
    st = m.struct(f"{name}_t", [arr])
    v = m.variable(B.SC_STORAGE_BUFFER, st, name)
    m.decorate(v, B.DEC_DESCRIPTOR_SET, 0)
    m.decorate(v, B.DEC_BINDING, binding)
    if not writable:
        m.decorate(v, B.DEC_NON_WRITABLE)
    return v


@functools.cache
def emit(rte: bool = True, denorm_preserve: bool = False, variant: str = "exact") -> tuple[int, ...]:
    """The kernel's SPIR-V words. rte/denorm_preserve: the float-controls modes the device offers."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown Q1_0 kernel variant {variant!r}; one of {VARIANTS}")
    k = _Kernel(rte, denorm_preserve)
    m = k.m
    wbuf = _buffer(m, 0, m.u32, "weights", False)
    abuf = _buffer(m, 1, m.u32, "act", False)
    obuf = _buffer(m, 2, m.f32, "out", True)
    pc_t = m.struct("params_t", [m.u32, m.u32])
    pc = m.variable(B.SC_PUSH_CONSTANT, pc_t, "params")
    uvec3 = m.type("TypeVector", m.u32, 3)
    gid_v = m.variable(B.SC_INPUT, uvec3, "gl_GlobalInvocationID")
    lid_v = m.variable(B.SC_INPUT, uvec3, "gl_LocalInvocationID")
    m.decorate(gid_v, B.DEC_BUILTIN, B.BUILTIN_GLOBAL_ID)
    m.decorate(lid_v, B.DEC_BUILTIN, B.BUILTIN_LOCAL_ID)
    red = m.variable(B.SC_WORKGROUP, m.type("TypeArray", m.f32, k.c(LOCAL)), "lanes")

    f = k.f = B.Function(m, "main", (LOCAL, 1, 1))
    for mode, on in ((B.MODE_RTE, rte), (B.MODE_DENORM_PRESERVE, denorm_preserve)):
        if on:
            m.modes.append(B.inst("ExecutionMode", f.fid, mode, 32))
    gid = f.op("CompositeExtract", m.u32, f.load(uvec3, gid_v), 0, name="gid")
    lid = f.op("CompositeExtract", m.u32, f.load(uvec3, lid_v), 0, name="lid")
    rows = f.load(m.u32, f.chain(B.SC_PUSH_CONSTANT, m.u32, pc, k.c(0)), name="rows")
    nb = f.load(m.u32, f.chain(B.SC_PUSH_CONSTANT, m.u32, pc, k.c(1)), name="nb")
    row = f.u("ShiftRightLogical", gid, k.c(3), name="row")
    lane = f.u("BitwiseAnd", gid, k.c(LANES - 1), name="lane")
    valid = f.cmp("ULessThan", row, rows, name="valid")
    nblk = f.select(m.u32, valid, nb, k.c(0), name="nblk")     # 0 blocks past the last row
    rowbase = f.u("IMul", row, f.u("IMul", nb, k.c(Q1_BYTES)), name="rowbase")
    lane4 = f.u("ShiftLeftLogical", lane, k.c(2))
    nib_byte = f.u("ShiftRightLogical", lane, k.c(1))
    nib_shift = f.u("ShiftLeftLogical", f.u("BitwiseAnd", lane, k.c(1)), k.c(2))
    acc = f.local(m.f32, "acc", k.fc(0.0))

    with f.loop(nblk, "ib") as ib:
        wb = f.u("IAdd", rowbase, f.u("IMul", ib, k.c(Q1_BYTES)), name="wb")
        dw = k.f16_to_f32(k.u16(wbuf, wb), name="d_w")
        ab0 = f.u("IMul", ib, k.c(4 * Q8_BYTES))
        blk = None
        for K in range(4):
            bits4 = f.u("BitFieldUExtract", k.u8(wbuf, f.u("IAdd", wb, f.u("IAdd", nib_byte, k.c(2 + 4 * K)))),
                        nib_shift, k.c(4), name=f"bits{K}")
            ab = f.u("IAdd", ab0, k.c(Q8_BYTES * K))
            dy = k.f16_to_f32(k.u16(abuf, ab), name=f"d_y{K}")
            qoff = f.u("IAdd", ab, f.u("IAdd", lane4, k.c(2)))
            s = k.c(0)
            for t in range(4):
                q = k.sext8(k.u8(abuf, f.u("IAdd", qoff, k.c(t))))
                neg = k.sext8(f.u("ISub", k.c(0), q))           # _mm256_sub_epi8 wraps -(-128)
                bit = f.cmp("INotEqual", f.u("BitFieldUExtract", bits4, k.c(t), k.c(1)), k.c(0))
                s = f.u("IAdd", s, f.select(m.u32, bit, q, neg))
            p = f.fmul(dy, f.op("ConvertSToF", m.f32, s), name=f"p{K}")   # exact product
            blk = p if blk is None else f.fadd(blk, p, name=f"blk{K}")     # = fma(dy, s, blk)
        a = f.load(m.f32, acc)
        if variant == "exact":
            new = k.fma_exact(dw, blk, a, name="acc.fma")
        else:
            new = f.fadd(f.fmul(dw, blk), a, name="acc.mul_add")
        f.store(acc, new)

    f.store(f.chain(B.SC_WORKGROUP, m.f32, red, lid), f.load(m.f32, acc))
    f.barrier()
    first = f.op("LogicalAnd", m.bool, valid, f.cmp("IEqual", lane, k.c(0)))
    with f.if_then(first, "hsum"):
        v = [f.load(m.f32, f.chain(B.SC_WORKGROUP, m.f32, red, f.u("IAdd", lid, k.c(j))), name=f"v{j}")
             for j in range(LANES)]
        lo = f.fadd(f.fadd(v[0], v[4]), f.fadd(v[2], v[6]))
        hi = f.fadd(f.fadd(v[1], v[5]), f.fadd(v[3], v[7]))
        f.store(f.chain(B.SC_STORAGE_BUFFER, m.f32, obuf, k.c(0), row), f.fadd(lo, hi, name="sum"))
    f.end()
    return tuple(m.words())
