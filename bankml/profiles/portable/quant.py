"""Activation blocks, weights as integers, and the exact group dot of the portable profile.

Activations: per block of 32, the scale is m * 2^e with m in 8..15, the least such that
127 * m * 2^e >= absmax (an all-zero block has m = 0); each code is the nearest integer of
x / (m * 2^e), ties to even, within +-127. A block holding NaN or an infinity is marked bad:
every dot that reads it is NaN.

Weights are never rounded: an F16 weight is its f16 value, a block weight d * q (Q8_0, Q1_0
+-1, Q2_0 q - 1) or d * q + min (Q4_1), d and min f16 values, each f16 value an integer
significand times a power of two (`f16_parts`).

The dot of a weight row with an activation row: within each group of 256 elements its exact
value (every product exact, every sum exact) rounded once to f32 (`arith.round_exact`); the
group results added in order with f32 adds. The exact value is computed per 32-element
sub-block as integer dots times integer scales times powers of two, but any other exact way
gives the same bits: this is what lets every backend compute it its own way.
"""
from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

from bankml.profiles.portable.arith import F32, add, canon, fields, round_exact
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES, q1_0, q2_0, q4_1, q8_0

QK = 32                     # activation block (the document's ACT_BLOCK)
GROUP = 256                 # elements summed exactly before one rounding
SUB_BITS = 4                # ActScaling Sub32: m in 8..15
WIDE_BITS = 8               # ActScaling PerBlock: m in 128..255 (the document: "an 8-bit significand")


class ActScaling(enum.Enum):
    """How an activation row is scaled, and so how a matrix row's dot with it rounds."""
    SUB32 = "Sub32"             # blocks of 32, m in 8..15; groups of 256 exact, rounded once, added in order
    PER_BLOCK = "PerBlock"      # the weight's own blocks, m in 128..255; each block rounded once, added in order


class Words(enum.Enum):
    """Words an activation crosses the array in.

    The document names the enum and no variant; every code it defines is a whole number within
    +-127 (block_scale: 127*m*2^e >= absmax; int8_codes), so one variant: a signed byte a code.
    (The SPIR-V kernels read four of those bytes from each 32-bit buffer word: the same bytes.)"""
    I8 = "i8"


class ActBlocks(NamedTuple):
    """Quantized activations: codes int8 [..., K], m and e int64 [..., K/32], bad bool [..., K/32]."""
    q: np.ndarray
    m: np.ndarray
    e: np.ndarray
    bad: np.ndarray

    def scales(self) -> np.ndarray:
        """The exact scales m * 2^e as f32 (they have 4 significant bits), 0 for bad blocks."""
        return np.ldexp(self.m.astype(np.float64), self.e).astype(F32)


class ActScale(NamedTuple):
    """An activation block's scale m·2^e: m in 8..15 per ActScaling::Sub32 block, in 128..255 per
    ActScaling::PerBlock block. (Arrays: one per block.)"""
    m: np.ndarray
    e: np.ndarray


def rne_div(x, m, e) -> np.ndarray:
    """The nearest integer to x / (m·2^e), ties to even, exactly (int64; x finite f32, m >= 1):
    x·2^-e is exact in f64 and one f64 division rounds the quotient so closely that rint (ties
    to even) gives the nearest integer of the exact quotient (|x·2^-e| < 2^15 has a granularity
    of 2^-8 or finer, so a quotient that is not a tie lies at least 2^-8/255 from one, far
    beyond f64's error there)."""
    with np.errstate(all="ignore"):
        y = np.ldexp(np.asarray(x, F32).astype(np.float64), -np.asarray(e)) / np.asarray(m)
    return np.rint(np.where(np.isfinite(y), y, 0)).astype(np.int64)


def _least_scale(amax: np.ndarray, bits: int) -> ActScale:
    """(m, e) of the least m * 2^e, m in 2^(bits-1)..2^bits - 1, with 127 * m * 2^e >= amax (finite,
    >= 0; (0, 0) for 0). With C the 24-bit significand of amax = C * 2^(p-23): m = ceil(C / (127 *
    2^k)) at e = p - 6 - bits, k = 17 - bits (just above 2^(bits-1) up to just above 2^bits), or,
    past 2^bits - 1, half of it rounded up at e + 1."""
    _, b, frac = fields(amax)
    c, p = frac | 0x800000, b - 127
    d = 127 << (17 - bits)
    m1 = (c + d - 1) // d
    m2 = (c + 2 * d - 1) // (2 * d)
    small = m1 <= (1 << bits) - 1
    m = np.where(small, m1, m2)
    e = np.where(small, p - 6 - bits, p - 5 - bits)
    zero = amax == 0
    return ActScale(np.where(zero, 0, m), np.where(zero, 0, e))


def act_scale(amax: np.ndarray) -> ActScale:
    """block_scale: the least scale m·2^e (m in 8..15) with 127·m·2^e ≥ amax, for a finite
    positive amax ((0, 0) for 0)."""
    return _least_scale(amax, SUB_BITS)


def wide_scale(amax: np.ndarray) -> ActScale:
    """The least scale m·2^e (m in 128..255) with 127·m·2^e ≥ amax, for a finite positive amax
    ((0, 0) for 0)."""
    return _least_scale(amax, WIDE_BITS)


def quantize_act(x: np.ndarray) -> ActBlocks:
    """quantize: x (a whole number of groups) quantized per block of ACT_BLOCK (Sub32 scales)."""
    return _quantize(x, QK, act_scale)


def quantize_blocks(x: np.ndarray, block: int) -> ActBlocks:
    """x (a whole number of blocks) quantized per weight block of block elements (PerBlock:
    wide_scale). m and e are per block of `block`."""
    return _quantize(x, block, wide_scale)


def _quantize(x: np.ndarray, block: int, scale) -> ActBlocks:
    """x f32 [..., K] (K a multiple of block) into blocks of codes at m * 2^e scales."""
    x = canon(x)
    xb = x.reshape(*x.shape[:-1], -1, block)
    with np.errstate(invalid="ignore"):
        bad = ~np.all(np.isfinite(xb), axis=-1)
        amax = np.where(bad, F32(0), np.max(np.abs(np.where(np.isfinite(xb), xb, F32(0))), axis=-1)).astype(F32)
    m, e = scale(amax)
    q = np.clip(rne_div(np.where(bad[..., None], F32(0), xb), np.where(m == 0, 1, m)[..., None], e[..., None]),
                -127, 127).astype(np.int8)                          # |x / scale| <= 127 in a block that is not bad
    q = np.where((m == 0)[..., None] | bad[..., None], 0, q).astype(np.int8)
    return ActBlocks(q.reshape(x.shape), m, e, bad)


def f16_parts(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An f16 value as (signed integer significand, exponent, bad): h = sig * 2^exp exactly;
    bad marks infinities and NaNs."""
    b = np.asarray(h, np.float16).view(np.uint16).astype(np.int64)
    s, e5, m10 = b >> 15, (b >> 10) & 31, b & 1023
    sig = np.where(e5 == 0, m10, m10 | 1024)
    exp = np.where(e5 == 0, -24, e5 - 25)
    return np.where(s == 1, -sig, sig), exp, e5 == 31


class Unreadable(ValueError):
    """A block a format stores that the engine cannot read: an infinite or NaN scale. (An F16
    weight is its own scale.) Raised for the first such block of a weight: its row and block
    (an F16 weight's element)."""

    def __init__(self, row: int, block: int, what: str, unit: str = "block"):
        super().__init__(f"row {row}, {unit} {block}: {what}")
        self.row, self.block = row, block


_SCALED = {Q8_0: q8_0.DTYPE, Q4_1: q4_1.DTYPE, Q1_0: q1_0.DTYPE, Q2_0: q2_0.DTYPE}


def reads(wtype: int) -> bool:
    """Whether the engine's array reads matrices of ty (the weight types with an integer form)."""
    return wtype == F16 or wtype in _SCALED


def check_readable(raw: np.ndarray, wtype: int) -> None:
    """Raise Unreadable for the first block of a weight (uint8 [rows, row_bytes]) whose scale (or
    Q4_1's min; an F16 element) is infinite or NaN; one pass over the scales' bytes only."""
    def nonfinite(h: np.ndarray) -> np.ndarray:          # f16 bits with the exponent all ones
        return (h.view(np.uint16) & 0x7C00) == 0x7C00
    if wtype == F16:
        bad, what, unit = nonfinite(np.ascontiguousarray(raw)), "an infinite or NaN f16 weight", "element"
    else:
        dt = _SCALED[wtype]
        b = np.ascontiguousarray(raw).view(dt)
        bad = nonfinite(b["d"]) | (nonfinite(b["m"]) if "m" in dt.names else False)
        what, unit = "an infinite or NaN scale", "block"
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise Unreadable(int(r), int(j), what, unit)


class WeightInts(NamedTuple):
    """A weight matrix as integers: per 32-element sub-block j of row r,
        weight[r, 32j + k] = ws[r, j] * 2^wx[r, j] * q[r, 32j + k]  (+ ms[r, j] * 2^mx[r, j] for Q4_1)
    q int64 (F16: the f16 value * 2^24, ws = 1, wx = -24)."""
    q: np.ndarray
    ws: np.ndarray
    wx: np.ndarray
    ms: np.ndarray | None
    mx: np.ndarray | None
    bad: np.ndarray            # [rows, K/32]: a scale that is inf or NaN


def weight_ints(raw: np.ndarray, wtype: int, k: int) -> WeightInts:
    """The rows of a weight (uint8 [rows, row_bytes]) of one of bankml's types as integers."""
    rows, nsub = len(raw), k // QK
    if wtype == F16:
        h = np.ascontiguousarray(raw).view(np.float16)[:, :k]
        sig, exp, bad = f16_parts(h)
        q = sig << (exp + 24)
        one = np.ones((rows, nsub), np.int64)
        return WeightInts(q, one, one * -24, None, None, bad.reshape(rows, nsub, QK).any(-1))
    wt = WEIGHT_TYPES[wtype]
    u = wt.unpack(raw, k)
    per = wt.block // QK                                   # activation blocks per weight block
    d = np.repeat(np.asarray(u.d, np.float32).astype(np.float16), per, axis=1)
    ws, wx, bad = f16_parts(d)
    ms = mx = None
    if wtype == Q4_1:
        ms, mx, mbad = f16_parts(np.asarray(u.m, np.float32).astype(np.float16))
        bad = bad | mbad
    if wtype not in (Q8_0, Q4_1, Q1_0, Q2_0):
        raise ValueError(f"portable profile: no integer form for weight type {wt.name}")
    return WeightInts(u.q.astype(np.int64), ws, wx, ms, mx, bad)


def terms(w: WeightInts, a: ActBlocks) -> tuple[np.ndarray, np.ndarray]:
    """The exact sub-block products as (integer, exponent) pairs: [T, rows, K/32, 1 or 2].

    a: activations [T, K]. The integer dots are computed with float BLAS: every partial sum is
    an integer below 2^53 (F16: |q| <= 2^40, codes <= 127, 32 terms), so they are exact."""
    T, K = a.q.shape
    rows, nsub = w.ws.shape
    ftype = np.float64 if np.abs(w.q).max(initial=0) > 255 else np.float32
    # contiguous operands: numpy's stacked matmul calls BLAS only for those
    qa = np.ascontiguousarray(a.q.reshape(T, nsub, QK).transpose(1, 0, 2), dtype=ftype)   # [nsub, T, 32]
    qw = np.ascontiguousarray(w.q.reshape(rows, nsub, QK).transpose(1, 0, 2), dtype=ftype)  # [nsub, rows, 32]
    dots = np.rint(np.matmul(qa, qw.transpose(0, 2, 1))).astype(np.int64).transpose(1, 2, 0)  # [T, rows, nsub]
    am, ae = a.m[:, None, :], a.e[:, None, :]
    p = [am * w.ws[None] * dots]
    x = [ae + w.wx[None]]
    if w.ms is not None:
        csum = a.q.reshape(T, nsub, QK).astype(np.int64).sum(-1)[:, None, :]  # Σ codes per block
        p.append(am * w.ms[None] * csum)
        x.append(ae + w.mx[None])
    return np.stack(p, -1), np.stack(x, -1)


def round_groups(p: np.ndarray, x: np.ndarray, bad: np.ndarray, per: int) -> np.ndarray:
    """Terms p·2^x [T, rows, blocks, terms] summed exactly over each run of `per` blocks and
    rounded once, NaN where `bad` [.., .., blocks] marks a block of the run, the runs added in
    order."""
    T, rows, nblk, _ = p.shape
    whole = nblk // per * per
    runs = []
    for lo, hi, k in ((0, whole, per), (whole, nblk, nblk - whole)):         # whole runs, then a shorter last
        if hi > lo:
            n = (hi - lo) // k
            r = round_exact(p[:, :, lo:hi].reshape(T, rows, n, -1), x[:, :, lo:hi].reshape(T, rows, n, -1))
            b = bad[:, :, lo:hi].reshape(*bad.shape[:2], n, k).any(-1)
            runs.append(np.where(b, F32(np.nan), r).astype(F32))
    r = np.concatenate(runs, -1)
    y = r[..., 0]
    for j in range(1, r.shape[-1]):
        y = add(y, r[..., j])
    return canon(y)


def group_dot(w: WeightInts, a: ActBlocks) -> np.ndarray:
    """y [T, rows]: each group of 256 elements exact and rounded once, groups added in order."""
    p, x = terms(w, a)
    return round_groups(p, x, a.bad[:, None, :] | w.bad[None, :, :], GROUP // QK)


def mul_mat(raw: np.ndarray, wtype: int, a: ActBlocks, rows_per_chunk: int | None = None) -> np.ndarray:
    """A weight (uint8 [rows, row_bytes]) times quantized activations [T, K] -> f32 [T, rows]."""
    T, K = a.q.shape
    if rows_per_chunk is None:                   # temporaries of about 2^21 terms
        rows_per_chunk = max(8, (1 << 21) // max(1, T * (K // QK)))
    out = np.empty((T, len(raw)), F32)
    for r0 in range(0, len(raw), rows_per_chunk):
        out[:, r0:r0 + rows_per_chunk] = group_dot(weight_ints(raw[r0:r0 + rows_per_chunk], wtype, K), a)
    return out


def get_rows(raw: np.ndarray, wtype: int, k: int) -> np.ndarray:
    """Weight rows as f32: each weight's exact value rounded once (Q4_1's d * q + min may
    need it; every other type is exact in f32), flushed."""
    w = weight_ints(raw, wtype, k)
    rows = len(raw)
    q = w.q.reshape(rows, -1, QK)
    p = [w.ws[..., None] * q]
    x = [np.broadcast_to(w.wx[..., None], q.shape)]
    if w.ms is not None:
        p.append(np.broadcast_to(w.ms[..., None], q.shape))
        x.append(np.broadcast_to(w.mx[..., None], q.shape))
    out = round_exact(np.stack(p, -1), np.stack(x, -1)).reshape(rows, k)
    return np.where(np.repeat(w.bad, QK, axis=1), F32(np.nan), out).astype(F32)
