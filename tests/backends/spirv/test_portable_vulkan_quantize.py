"""The portable activation quantizers and int8 cache rows as SPIR-V kernels on Vulkan (lavapipe in
CI) equal the numpy spec bit for bit (portable/quantize.py): quant.quantize_act and
quant.quantize_blocks (blocks of 32 to 256) on random rows at exponents across the f32 range,
exact ties (k + 1/2)·m·2^e for every m, absmax exactly 127·m·2^e (and one ulp past it), blocks of
zeros and of denormals, NaN and inf (bad blocks), values near f32's largest and least normal;
attention.cache_row on rows whose f16 scale overflows to inf, rounds into the f16 subnormals or
to zero (around every f16 rounding edge), with NaN and inf, and with exact ties of x·inv; on the
device and as the worst denormal-flushing device (`flushing`)."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.spirv import builder as B
from bankml.backends.spirv.portable import quantize as Q
from bankml.profiles.portable import attention as A
from bankml.profiles.portable import quant
from tests.backends.spirv.test_portable_vulkan import kern  # noqa: F401 (kern: the device fixture)

F32 = np.float32


@pytest.mark.parametrize("emit", [Q.emit_quantize, Q.emit_cache_row])
@pytest.mark.parametrize("flushing", [False, True])
def test_modules_pass_spirv_val(emit, flushing):
    B.validate(list(emit(flushing)))


def _same_blocks(got: quant.ActBlocks, want: quant.ActBlocks) -> None:
    for name, g, w in zip(quant.ActBlocks._fields, got, want):
        assert g.shape == w.shape, name
        bad = np.argwhere(np.asarray(g) != np.asarray(w))
        assert bad.size == 0, f"{name}: {len(bad)} differ, first at {bad[:3].tolist()}: " \
                              f"{np.asarray(g)[tuple(bad[0])]} vs {np.asarray(w)[tuple(bad[0])]}"


def _specials(rng, rows: int, k: int) -> np.ndarray:
    """Rows of blocks of 32 at random scales (2^-140 to 2^126) with NaN, +-inf, denormals, zeros,
    f32's largest and least normal scattered in, and whole blocks of zeros or denormals."""
    nb = k // 32
    x = rng.standard_normal((rows, nb, 32)) * np.exp2(rng.integers(-140, 124, (rows, nb, 1)))
    x = x.astype(F32)
    b = x.view(np.uint32)
    pick = rng.integers(0, 400, b.shape)
    b[pick == 0] = 0x7FC00000
    b[pick == 1] = 0x7F800000
    b[pick == 2] = 0xFF800000
    b[pick == 3] = rng.integers(1, 0x800000, (pick == 3).sum()) | (rng.integers(0, 2, (pick == 3).sum()) << 31)
    b[pick == 4] = 0x80000000
    b[pick == 5] = 0x7F7FFFFF
    b[pick == 6] = 0x00800000
    blk = rng.integers(0, 12, (rows, nb))
    x[blk == 0] = 0
    nd = (blk == 1).sum()
    x[blk == 1] = rng.integers(1, 0x800000, (nd, 32)).astype(np.uint32).view(F32)
    with np.errstate(over="ignore"):
        x[blk == 2] *= F32(2.0 ** 100)                      # some overflow to inf
    return x.reshape(rows, k)


def _tie_rows(bits: int, block: int, rng) -> np.ndarray:
    """For every m of 2^(bits-1)..2^bits-1 and a few exponents: a block whose absmax is exactly
    127·m·2^e (so its scale is m·2^e), the rest exact ties (k + 1/2)·m·2^e and integers k·m·2^e
    (at 2^-130 the small ones denormal, read as 0); and a block whose absmax is one ulp past
    (scale m+1, or the next exponent)."""
    rows = []
    for m in range(1 << (bits - 1), 1 << bits):
        for e in (-130, -120, -40, -7, 0, 3, 60, 110):
            scale = np.ldexp(float(m), e)
            k = rng.integers(-127, 127, block)
            v = np.where(rng.integers(0, 2, block) == 1, k + 0.5, k) * scale
            v[rng.integers(0, block)] = 127 * scale * rng.choice([-1, 1])
            v = v.astype(F32)
            rows.append(v)
            w = v.copy()
            w[np.argmax(np.abs(w))] = np.nextafter(F32(127 * scale), F32(np.inf))
            rows.append(w)
    return np.stack(rows)


def test_quantize_act_random_and_specials(kern):
    rng = np.random.default_rng(1)
    x = _specials(rng, 24, 512)
    want = quant.quantize_act(x)
    assert want.bad.any() and (want.m == 0).any() and (want.m != 0).any()
    _same_blocks(Q.quantize_act(kern, x), want)
    y = (rng.standard_normal((3, 5, 256)) * 4).astype(F32)          # leading axes kept
    _same_blocks(Q.quantize_act(kern, y), quant.quantize_act(y))


@pytest.mark.parametrize("block", Q.BLOCKS)
def test_quantize_blocks_random_and_specials(kern, block):
    rng = np.random.default_rng(block)
    x = _specials(rng, 8, 1024)
    _same_blocks(Q.quantize_blocks(kern, x, block), quant.quantize_blocks(x, block))


@pytest.mark.parametrize("bits,block", [(quant.SUB_BITS, 32), (quant.WIDE_BITS, 32), (quant.WIDE_BITS, 256)])
def test_quantize_ties_and_exact_absmax(kern, bits, block):
    rng = np.random.default_rng(bits * 1000 + block)
    x = _tie_rows(bits, block, rng)
    if bits == quant.SUB_BITS:
        got, want = Q.quantize_act(kern, x), quant.quantize_act(x)
    else:
        got, want = Q.quantize_blocks(kern, x, block), quant.quantize_blocks(x, block)
    ms = want.m.reshape(-1)[0::2]
    assert set(ms.tolist()) == set(range(1 << (bits - 1), 1 << bits))          # the exact scale is least
    y = np.ldexp(x.astype(np.float64), -want.e.repeat(block, -1)) / want.m.repeat(block, -1)
    assert (np.abs(y - np.floor(y)) == 0.5).sum() > x.size // 8                 # ties really met
    _same_blocks(got, want)


def test_quantize_extremes(kern):
    big = np.array([np.finfo(F32).max, -np.finfo(F32).max, F32(2.0 ** 127), F32(1.5)] * 8, F32)
    tiny = np.array([2.0 ** -126, -(2.0 ** -126) * 1.5, 2.0 ** -125, 3e-39] * 8, F32)
    x = np.stack([np.concatenate([big, tiny, np.zeros(32, F32), np.full(32, 1e-45, F32)])] * 2)
    x[1, 70] = -np.inf
    _same_blocks(Q.quantize_act(kern, x), quant.quantize_act(x))
    for block in (32, 128):
        _same_blocks(Q.quantize_blocks(kern, x, block), quant.quantize_blocks(x, block))


def _same_rows(got, want) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.reshape(-1), want.reshape(-1)
    bad = [r for r in range(len(g)) if g[r].tobytes() != w[r].tobytes()]
    assert not bad, f"{len(bad)} rows differ, first {bad[0]}: {g[bad[0]]} vs {w[bad[0]]}"
    assert got.tobytes() == want.tobytes()


def _edge_rows(rng, D: int) -> np.ndarray:
    """Rows whose amax·INV_127 lies a few ulps around the f16 rounding edges: the overflow to inf
    (65504 and 65520), the least normal 2^-14, the subnormals' least 2^-24 and half of it,
    midpoints between f16 values (normal and subnormal), and random amax of every size."""
    edges = [65504.0, 65520.0, 65536.0, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 2.0 ** -24, 2.0 ** -25,
             1.5 * 2.0 ** -24, 3 * 2.0 ** -25, 2.5 * 2.0 ** -24, 1.0 + 2.0 ** -11, 1000.0 + 0.25, 0.1]
    amax = []
    for t in edges:
        c = F32(t * 127)
        b = int(c.view(np.uint32))
        amax += [np.uint32(b + d).view(F32) for d in range(-6, 7)]
    amax += list(np.exp2(rng.uniform(-40, 30, 40)).astype(F32))
    x = (rng.uniform(-1, 1, (len(amax), D)) * np.array(amax, F32)[:, None]).astype(F32)
    x[np.arange(len(amax)), rng.integers(0, D, len(amax))] = np.array(amax, F32) * rng.choice([-1, 1], len(amax))
    return x


@pytest.mark.parametrize("D", [64, 128, 3, 130])
def test_cache_row_scale_edges(kern, D):
    rng = np.random.default_rng(D)
    x = _edge_rows(rng, D)
    want = A.cache_row(x)
    d = want["d"]
    assert np.isinf(d).any() and (d == 0).any() and ((d > 0) & (d < 2.0 ** -14)).any()
    _same_rows(Q.cache_rows(kern, x), want)


def test_cache_row_specials_and_ties(kern):
    rng = np.random.default_rng(7)
    D = 64
    x = (rng.standard_normal((12, D)) * 5).astype(F32)
    x[0, 3] = np.nan
    x[1, :] = np.nan                                      # amax 0: scale 0, every code 0
    x[2, 7] = np.inf                                      # scale inf: inv 0, codes 0 (inf·0 NaN -> 0)
    x[3, 9] = -np.inf
    x[4, :] = 0
    x[5, :] = np.uint32(rng.integers(1, 0x800000, D)).view(F32)       # denormals read as 0
    x[6, ::2] = np.uint32(rng.integers(1, 0x800000, D // 2)).view(F32)
    x[7, 1] = np.finfo(F32).max
    for r, j in zip(range(8, 12), (4, 0, 10, 20)):       # s = 2^-j exactly: inv 2^j, x·inv ties
        k = rng.integers(-127, 127, D)
        x[r] = (np.where(rng.integers(0, 2, D) == 1, k + 0.5, k) * 2.0 ** -j).astype(F32)
        x[r, 0] = F32(127 * 2.0 ** -j)
    want = A.cache_row(x)
    assert np.all(want["d"][8:12] == np.float16([2.0 ** -4, 1.0, 2.0 ** -10, 2.0 ** -20]))
    assert (np.abs(want["qs"][8:12] - x[8:12] * np.exp2([[4], [0], [10], [20]])) == 0.5).sum() > D
    _same_rows(Q.cache_rows(kern, x), want)
    y = rng.standard_normal((2, 3, 32)).astype(F32)        # leading axes kept
    _same_rows(Q.cache_rows(kern, y), A.cache_row(y))
