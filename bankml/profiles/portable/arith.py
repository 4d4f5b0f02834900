"""The portable profile's f32 steps (docs/PORTABLE.md, "The arithmetic").

- Every value is IEEE binary32; each +, -, * rounds to nearest even on its own (no FMA,
  no division, no sqrt, no libm anywhere in the profile).
- Denormals flush to zero keeping their sign: operands before a step (DAZ) and results after
  it (FTZ). A result is denormal when its correctly rounded value (gradual underflow) is
  nonzero and below 2^-126; an exact scaling by a power of two (`scale2`) flushes when the
  exact result is below 2^-126.
- One NaN: every NaN is 0x7FC00000 (quiet, positive, no payload).
- A sum of n values runs in LANES lanes: element i goes to lane i mod LANES, each lane adds
  its elements in index order starting from -0.0 (so missing elements, read as -0.0, change
  nothing), then the lanes fold by a balanced pairwise tree: (l0+l1), (l2+l3), ..., then
  pairs of those.
- `round_exact` is the exact value of a sum of integers times powers of two, rounded to f32
  once (nearest even, unbounded exponent), then flushed or overflowed: the group sums of the
  mat-mul and the attention scores are this.
"""
from __future__ import annotations

import enum

import numpy as np

F32, U32 = np.float32, np.uint32
LANES = 8
SUM_WINDOW = 64       # binary places an exact sum keeps below its largest term's least place (docs/PORTABLE.md)
QNAN = U32(0x7FC00000)
_SIGN, _EXP = U32(0x80000000), U32(0x7F800000)


def canon(x) -> np.ndarray:
    """x as the profile holds it: denormals to signed zero, every NaN the one quiet NaN."""
    x = np.array(x, F32, copy=True)
    b = x.view(U32)
    tiny = (b & _EXP) == 0
    b[tiny] &= _SIGN
    b[np.isnan(x)] = QNAN
    return x


class FpUnit(enum.Enum):
    """The multiplier an f32 product is computed by. Its add is the engine's either way: the card's
    block adds as fadd does.

    The document names the enum and no variant; these are the two places bankml multiplies
    (docs/PORTABLE.md, "FpUnit and Words"), and both give `mul`'s bits (the document's fmul):
    the vector units by IEEE multiplies with the flushes here and in the llvm kernels, the card
    by OpFMul under NoContraction with its denormals and NaNs repaired by integer bit tests."""
    VECTOR = "vector"       # numpy here, the llvm kernels' vmulps
    CARD = "card"           # the SPIR-V kernels' OpFMul


NAN = QNAN.view(F32)   # the one NaN the engine produces: quiet, no payload, no sign


def ftz(x) -> np.ndarray:
    """x with a denormal flushed to a zero of its sign. (canon also makes every NaN the one NaN.)"""
    x = np.array(x, F32, copy=True)
    b = x.view(U32)
    b[(b & _EXP) == 0] &= _SIGN
    return x


def rne(x) -> np.ndarray:
    """x rounded to the nearest whole number, ties to even, as an integer (int64)."""
    return np.rint(np.asarray(x, np.float64)).astype(np.int64)


def f32_to_f16(x) -> np.ndarray:
    """x rounded to binary16, to nearest with ties to even, subnormals kept, past the top infinite
    (numpy's cast is IEEE's conversion)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, F32).astype(np.float16)


def add(a, b) -> np.ndarray:
    with np.errstate(all="ignore"):
        return canon(np.add(canon(a), canon(b), dtype=F32))


def sub(a, b) -> np.ndarray:
    with np.errstate(all="ignore"):
        return canon(np.subtract(canon(a), canon(b), dtype=F32))


def mul(a, b) -> np.ndarray:
    with np.errstate(all="ignore"):
        return canon(np.multiply(canon(a), canon(b), dtype=F32))


def div(a, b) -> np.ndarray:
    """a / b as the document's f32 arithmetic divides (IEEE, nearest even, operands and result
    flushed): only rmsnorm's Σx²/n divides."""
    with np.errstate(all="ignore"):
        return canon(np.divide(canon(a), canon(b), dtype=F32))


def fold_sum(x, axis: int = -1) -> np.ndarray:
    """Σx over an axis: LANES lanes (element i in lane i mod LANES, index order, from -0.0),
    then the balanced tree over the lanes."""
    x = np.moveaxis(canon(x), axis, -1)
    n = x.shape[-1]
    pad = -n % LANES
    if pad:
        x = np.concatenate([x, np.full(x.shape[:-1] + (pad,), -0.0, F32)], axis=-1)
    chunks = x.reshape(*x.shape[:-1], -1, LANES)
    acc = np.full(x.shape[:-1] + (LANES,), -0.0, F32)
    for i in range(chunks.shape[-2]):
        acc = add(acc, chunks[..., i, :])
    return tree(acc)


def fdot(a, b) -> np.ndarray:
    """Σ a_i·b_i in LANES lanes, then the tree: each product rounded, then fold_sum."""
    return fold_sum(mul(a, b))


def tree(lanes: np.ndarray) -> np.ndarray:
    """The balanced pairwise fold of the last axis (a power of two): adjacent pairs first."""
    while lanes.shape[-1] > 1:
        lanes = add(lanes[..., 0::2], lanes[..., 1::2])
    return lanes[..., 0]


def fields(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign bit, biased exponent, 23-bit fraction) of f32 values, as int64."""
    b = np.asarray(x, F32).view(U32).astype(np.int64)
    return b >> 31, (b >> 23) & 0xFF, b & 0x7FFFFF


def scale2(y, k) -> np.ndarray:
    """y * 2^k exactly, for finite normal y (or zero): +-inf when it overflows, signed zero
    when the exact result is below 2^-126."""
    y = np.asarray(y, F32)
    k = np.asarray(k, np.int64)
    _, e, _ = fields(y)
    e2 = e + k
    with np.errstate(all="ignore"):
        out = np.ldexp(y, np.clip(k, -300, 300).astype(np.int32)).astype(F32)
    out = np.where((e2 < 1) & (e != 0), np.copysign(F32(0), y), out)
    out = np.where((e2 > 254) & (e != 0), np.copysign(F32(np.inf), y), out)
    return canon(out)


def int_to_f32(n, k) -> np.ndarray:
    """n * 2^k (n int64 with |n| < 2^63) rounded once to f32: int64 -> f32 is one correctly
    rounded conversion (cvtsi2ss; tests/profiles/test_portable_arith.py pins it), the power of
    two exact, then overflow or flush."""
    n = np.asarray(n, np.int64)
    return scale2(n.astype(F32), k)


def bitlen(n) -> np.ndarray:
    """An upper bound (exact or one more) of the bit length of |n| (int64)."""
    a = np.abs(np.asarray(n, np.int64)).astype(np.float64)
    return np.frexp(a)[1].astype(np.int64)


def round_exact(p, x) -> np.ndarray:
    """exact_sum: Σ v·2^e over terms, rounded once to f32: exact while every term lies within
    SUM_WINDOW places of the largest term's least place, a term past the window floored at it,
    however far past; no terms is +0. (p int64 [..., k], x integer [..., k]; a zero p is no term.)

    The largest term is the one of greatest |p|·2^x, of those equal the one of greatest x.
    Terms are aligned to the least exponent of the nonzero ones and added as one integer:
    int64 when every shifted term has at most 58 bits (at most 32 terms: a spread of at most
    58 places, inside the window), otherwise Python's integers after `windowed`. An exact zero
    is +0.
    """
    p = np.asarray(p, np.int64)
    x = np.asarray(x, np.int64)
    if p.shape[-1] > 32:
        raise ValueError("round_exact adds at most 32 terms at once")
    if p.size:                                   # the common case, checked for the whole array at once
        xmin = np.min(x, axis=-1)
        spread = int(np.max(x - xmin[..., None]))
        if int(bitlen(np.abs(p).max())) + spread <= 58:
            return int_to_f32(np.sum(p << (x - xmin[..., None]), axis=-1), xmin)
    if p.ndim == 1:                              # one sum: as a row of one
        return round_exact(p[None], x[None])[0]
    nz = p != 0
    big = np.int64(1 << 40)
    xmin = np.min(np.where(nz, x, big), axis=-1)
    xmin = np.where(xmin == big, 0, xmin)
    sh = np.where(nz, x - xmin[..., None], 0)
    fits = np.all((bitlen(p) + sh <= 58) | ~nz, axis=-1)
    shifted = np.where(nz & fits[..., None], p << np.where(fits[..., None], sh, 0), 0)
    out = int_to_f32(shifted.sum(axis=-1), xmin)
    for idx in zip(*np.nonzero(~fits)):
        out[idx] = _big_to_f32(*windowed(p[idx].tolist(), x[idx].tolist()))
    return out


def windowed(p: list[int], x: list[int]) -> tuple[int, int]:
    """(n, k) with n·2^k the terms' sum under SUM_WINDOW: the largest term's least place L
    (greatest |p|·2^x, then greatest x), each term below B = L - SUM_WINDOW floored at B
    (toward -inf: a negative term however far below is -2^B), the rest exact. Order-free."""
    terms = [(pi, xi) for pi, xi in zip(p, x) if pi != 0]
    if not terms:
        return 0, 0
    xmin = min(xi for _, xi in terms)
    size = [abs(pi) << (xi - xmin) for pi, xi in terms]                # |term| / 2^xmin
    top = max(size)
    low = max(xi for (_, xi), si in zip(terms, size) if si == top)
    k = max(low - SUM_WINDOW, xmin)
    return sum(pi << (xi - k) if xi >= k else pi >> (k - xi) for pi, xi in terms), k


def _big_to_f32(n: int, k: int) -> np.float32:
    """A Python integer n times 2^k rounded once to f32 (nearest even), then flushed."""
    if n == 0:
        return F32(0)
    sign, a = (n < 0), abs(n)
    drop = max(a.bit_length() - 24, 0)
    q, r = a >> drop, a & ((1 << drop) - 1)
    half = 1 << (drop - 1) if drop else 0
    if drop and (r > half or (r == half and q & 1)):
        q += 1
    v = scale2(F32(q), k + drop)
    return F32(-v if sign else v)
