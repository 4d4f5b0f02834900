"""Coded rows: a block-format matrix row as the engine reads it (the document's Scale, Segment,
CodedRow and COEF_BOUND), K-quants included, and the dot of such rows under either ActScaling.

Every weight is a·coef + b·offs of its segment, a and b f16 scales held exactly (Scale), coef
and offs small integers as stored:
  Q8_0, Q1_0, Q2_0,  segments of their block (32, 128, 64): a = d, coef the code (Q1_0 ±1,
  Q4_0, Q5_0         Q2_0 q - 1, Q4_0 q - 8, Q5_0 q - 16); no second scale
  Q4_1, Q5_1         segments of 32: a = d, coef q in 0..15 (0..31); b = the min, offs 1
  Q4_K               segments of 256: a = d, coef = sc·q (the sub-block's 6-bit scale times the
                     nibble); b = dmin, offs = -m (the sub-block's 6-bit min)
  Q6_K               segments of 256: a = d, coef = sc·(q - 32) (an int8 scale per 16)
No weight is ever rounded: the dot's terms are products of these integers with the activation
codes, summed exactly (arith.round_exact) and rounded once per group (Sub32) or per weight
block (PerBlock). For the legacy formats these are quant.terms' terms exactly, so `dot` gives
quant.mul_mat's bits under Sub32. The graphs read K-quant matrices through `dot_sub32` (mul_mat)
and `get_rows` (token embeddings); `reads` and `check_readable` cover every format.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bankml.profiles.portable.arith import F32
from bankml.profiles.portable import quant
from bankml.profiles.portable.arith import round_exact
from bankml.profiles.portable.quant import (GROUP, QK, ActBlocks, ActScaling, Unreadable, f16_parts, mul_mat,
                                            quantize_act, quantize_blocks, round_groups)
from bankml.quants import (F16, Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES, q4_0, q4_k, q5_0,
                           q5_1, q6_k)

LEGACY = (Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1)   # the 32/64/128-blocks with one or two f16 scales
K_QUANTS = (Q4_K, Q6_K)
COEF_BOUND = 128 * 32         # Q6_K's -128 · -32: no coef or offs of any format is larger


class Scale(NamedTuple):
    """A scale stored in a block: sig·2^exp, exactly. (Arrays: one per segment.)"""
    sig: np.ndarray
    exp: np.ndarray

    @classmethod
    def of(cls, h: np.ndarray) -> Scale:
        """f16 values as Scales; an infinite or NaN one is Unreadable (its row and segment)."""
        sig, exp, bad = f16_parts(np.asarray(h, np.float32).astype(np.float16))
        if bad.any():
            r, j = np.argwhere(bad.reshape(len(bad), -1))[0]
            raise Unreadable(int(r), int(j), "an infinite or NaN scale")
        return cls(sig, exp)


class Segment(NamedTuple):
    """A run of a row's elements under one pair of scales: the elements' coefficients under the
    first scale (codes times their sub-block scales) and under the second (the offset terms), as
    stored, exactly."""
    a: tuple[int, int]
    coef: np.ndarray
    b: tuple[int, int] | None
    offs: np.ndarray | None


class CodedRow(NamedTuple):
    """A row of a block-format matrix as the engine reads it: every weight is a·coef + b·offs of
    its segment. Held for several rows at once: a, b [rows, K/seg]; coef, offs int64 [rows, K]."""
    seg: int
    a: Scale
    coef: np.ndarray
    b: Scale | None
    offs: np.ndarray | None

    def segment(self, r: int, j: int) -> Segment:
        """Segment j of row r."""
        cut = slice(j * self.seg, (j + 1) * self.seg)
        b = None if self.b is None else (int(self.b.sig[r, j]), int(self.b.exp[r, j]))
        return Segment((int(self.a.sig[r, j]), int(self.a.exp[r, j])), self.coef[r, cut], b,
                       None if self.offs is None else self.offs[r, cut])


def coded_rows(raw: np.ndarray, wtype: int, k: int) -> CodedRow:
    """The rows of a weight (uint8 [rows, row_bytes]) of k columns as CodedRow."""
    if wtype == F16:
        raise ValueError("portable profile: an F16 weight is its own scale, not a coded row")
    if wtype == Q4_K:
        u = q4_k.unpack(raw, k)
        coef = np.repeat(u.sc, 32, axis=1).astype(np.int64) * u.q.astype(np.int64)
        offs = -np.repeat(u.m, 32, axis=1).astype(np.int64)
        return CodedRow(256, Scale.of(u.d), coef, Scale.of(u.dmin), offs)
    if wtype == Q6_K:
        u = q6_k.unpack(raw, k)
        coef = np.repeat(u.sc, 16, axis=1).astype(np.int64) * (u.q.astype(np.int64) - 32)
        return CodedRow(256, Scale.of(u.d), coef, None, None)
    if wtype not in LEGACY:
        raise ValueError(f"portable profile: no coded row for weight type {WEIGHT_TYPES[wtype].name}")
    u = WEIGHT_TYPES[wtype].unpack(raw, k)
    coef = u.q.astype(np.int64)
    if u.m is not None:                                              # Q4_1, Q5_1: the min once per element
        return CodedRow(32, Scale.of(u.d), coef, Scale.of(u.m), np.ones_like(coef))
    return CodedRow(WEIGHT_TYPES[wtype].block, Scale.of(u.d), coef, None, None)


def _block_terms(cr: CodedRow, a: ActBlocks, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per activation block of `block` elements (inside one segment): a·M·Σ coef·code at
    a.exp + e, and b's term beside it -> (p, x) [T, rows, K/block, 1 or 2]."""
    T, K = a.q.shape
    rows = len(cr.coef)
    per = cr.seg // block if block <= cr.seg else None
    if per is None or cr.seg % block:
        raise ValueError(f"activation blocks of {block} do not fit segments of {cr.seg}")
    codes = a.q.astype(np.float64).reshape(T, 1, -1, block)
    seg_of = np.arange(K // block) // per                              # each activation block's segment

    def term(scale: Scale, ints: np.ndarray):
        # exact in f64: |Σ ints·code| <= 256·4096·127 < 2^28; stacked per block (BLAS)
        wj = ints.astype(np.float64).reshape(rows, -1, block).transpose(1, 2, 0)     # [K/block, block, rows]
        dots = np.rint(np.matmul(codes[:, 0].transpose(1, 0, 2), wj)).transpose(1, 2, 0)  # [T, rows, K/block]
        return (a.m[:, None, :] * scale.sig[None][:, :, seg_of] * dots.astype(np.int64),
                a.e[:, None, :] + scale.exp[None][:, :, seg_of])
    p, x = term(cr.a, cr.coef)
    if cr.b is None:
        return p[..., None], x[..., None]
    p2, x2 = term(cr.b, cr.offs)
    return np.stack([p, p2], -1), np.stack([x, x2], -1)




def reads(wtype: int) -> bool:
    """Whether the engine's array reads matrices of ty (the weight types with an integer form:
    F16, the legacy block formats and the K-quants bankml has)."""
    return wtype == F16 or wtype in LEGACY or wtype in K_QUANTS


def check_readable(raw: np.ndarray, wtype: int) -> None:
    """Raise Unreadable for the first block of a weight (uint8 [rows, row_bytes]) whose scale (a
    K-quant's d or dmin) is infinite or NaN; the scales' bytes only."""
    if quant.reads(wtype):
        return quant.check_readable(raw, wtype)
    dt = {Q4_K: q4_k.DTYPE, Q6_K: q6_k.DTYPE, Q4_0: q4_0.DTYPE, Q5_0: q5_0.DTYPE, Q5_1: q5_1.DTYPE}[wtype]
    b = np.ascontiguousarray(raw).view(dt)
    bad = np.zeros(b.shape, bool)
    for name in ("d", "dmin", "m"):
        if name in dt.names:
            bad |= (b[name].view(np.uint16) & 0x7C00) == 0x7C00
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise Unreadable(int(r), int(j), "an infinite or NaN scale")


def dot_sub32(raw: np.ndarray, wtype: int, a: ActBlocks, rows_per_chunk: int | None = None) -> np.ndarray:
    """Sub32's dot of weight rows (uint8 [rows, row_bytes]) of any format the engine reads with
    activations quantized per 32 (quantize_act) -> f32 [T, rows]: each group of 256 exact,
    rounded once, the groups added in order (quant.mul_mat for the formats it reads)."""
    if quant.reads(wtype):
        return mul_mat(raw, wtype, a)
    T, K = a.q.shape
    if rows_per_chunk is None:                   # temporaries of about 2^21 elements
        rows_per_chunk = max(8, (1 << 21) // max(1, T * K))
    out = np.empty((T, len(raw)), F32)
    for r0 in range(0, len(raw), rows_per_chunk):
        p, e = _block_terms(coded_rows(raw[r0:r0 + rows_per_chunk], wtype, K), a, QK)
        out[:, r0:r0 + rows_per_chunk] = round_groups(p, e, a.bad[:, None, :], GROUP // QK)
    return out


def get_rows(raw: np.ndarray, wtype: int, k: int) -> np.ndarray:
    """Weight rows as f32, each weight's exact value a·coef + b·offs rounded once (quant.get_rows
    for the formats it reads)."""
    if quant.reads(wtype):
        return quant.get_rows(raw, wtype, k)
    cr = coded_rows(raw, wtype, k)
    per = np.arange(k) // cr.seg                                     # each element's segment
    p, x = [cr.a.sig[:, per] * cr.coef], [cr.a.exp[:, per]]
    if cr.b is not None:
        p.append(cr.b.sig[:, per] * cr.offs)
        x.append(cr.b.exp[:, per])
    return round_exact(np.stack(p, -1), np.stack(x, -1))


def block_of(wtype: int) -> int:
    """The weight block a PerBlock activation is quantized in against a matrix of this type: the
    format's own (its segment), 32, 64, 128 or 256 elements. F16 has none."""
    if wtype == F16:
        raise ValueError("portable profile: PerBlock scaling needs a block format, not F16")
    return WEIGHT_TYPES[wtype].block


def dot_blocks(raw: np.ndarray, wtype: int, a: ActBlocks, rows_per_chunk: int | None = None) -> np.ndarray:
    """PerBlock's dot: weight rows (uint8 [rows, row_bytes]) times activations quantized per the
    weight's block (quantize_blocks(x, block_of(wtype))) -> f32 [T, rows]: each weight block's
    terms exact, rounded once, the blocks added in order."""
    T, K = a.q.shape
    if rows_per_chunk is None:                   # temporaries of about 2^21 elements
        rows_per_chunk = max(8, (1 << 21) // max(1, T * K))
    out = np.empty((T, len(raw)), F32)
    for r0 in range(0, len(raw), rows_per_chunk):
        cr = coded_rows(raw[r0:r0 + rows_per_chunk], wtype, K)
        p, e = _block_terms(cr, a, cr.seg)
        out[:, r0:r0 + rows_per_chunk] = round_groups(p, e, a.bad[:, None, :], 1)
    return out


def dot(raw: np.ndarray, wtype: int, x: np.ndarray, scaling: ActScaling = ActScaling.SUB32) -> np.ndarray:
    """The f32 the engine produces for row · act: weight rows (uint8 [rows, row_bytes]) times f32
    activation rows x [T, K] under the given ActScaling -> [T, rows]. Sub32: each group of 256
    exact, rounded once, the groups added in order; PerBlock: each weight block's terms under
    its activation block's wide scale exact, rounded once, the blocks added in order (dot_blocks).
    F16 reads Sub32 only (quant.mul_mat), having no block."""
    if scaling is ActScaling.PER_BLOCK:
        return dot_blocks(raw, wtype, quantize_blocks(x, block_of(wtype)))
    if wtype == F16:
        return mul_mat(raw, wtype, quantize_act(x))
    a = quantize_act(x)
    p, e = _block_terms(coded_rows(raw, wtype, x.shape[-1]), a, QK)  # [T, rows, K/32, nt]
    return round_groups(p, e, a.bad[:, None, :], GROUP // QK)
