"""The portable kernels' on-device check: a fixed set of cases runs on the device and on the numpy
spec (bankml/profiles/portable/), and every output must be the same bits.

    kern = PortableKernels(runtime.open_device(0))
    check_device(kern)          # raises runtime.DeviceRefused naming the first case that differs

    python -m bankml.backends.spirv.portable.check [device index]     # prints the verdict

Cases: every weight type's matvec (random rows; activation exponents over the whole f32 range,
the wide sums; F16 terms at the int64 limit), add/sub/mul at the underflow threshold and the
specials, exp/recip/rsqrt over spread bit patterns, RMSNorm and softmax of edge rows, and a GQA
attention with masked cells. About a second on lavapipe.
"""
from __future__ import annotations

import sys
from typing import Callable, NamedTuple

import numpy as np

from bankml.backends.spirv import runtime
from bankml.profiles.portable import arith, attention, funcs, quant
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES

F32 = np.float32


class Case(NamedTuple):
    name: str
    run: Callable          # kern -> f32 array (the device)
    want: Callable         # () -> f32 array (the spec)


def _rows(rng, wtype: int, rows: int, k: int, scale: float) -> np.ndarray:
    if wtype == F16:
        return (rng.standard_normal((rows, k)) * scale).astype(np.float16).view(np.uint8).reshape(rows, -1)
    wt = WEIGHT_TYPES[wtype]
    r = rng.integers(0, 256, (rows, k // wt.block, wt.block_bytes), dtype=np.uint8)
    nh = 2 if wtype == Q4_1 else 1
    r[:, :, :2 * nh] = (rng.standard_normal(r.shape[:2] + (nh,)) * scale).astype(np.float16).view(
        np.uint8).reshape(rows, -1, 2 * nh)
    return r.reshape(rows, -1)


def _wide_acts(rng, k: int) -> quant.ActBlocks:
    nb = k // 32
    m = rng.integers(8, 16, (1, nb)).astype(np.int64)
    e = rng.integers(-136, 119, (1, nb)).astype(np.int64)
    return quant.ActBlocks(rng.integers(-127, 128, (1, k)).astype(np.int8), m, e, np.zeros((1, nb), bool))


def _matvec(name, w, wtype, a) -> Case:
    return Case(name, lambda kern: kern.matvec(w, wtype, a), lambda: quant.mul_mat(w, wtype, a)[0])


def _edge_rows(rng, n: int) -> np.ndarray:
    x = rng.standard_normal((8, n)).astype(F32)
    x[1] = 0.0
    x[2, :4] = [1e-40, -1e-42, np.nan, 1.0]
    x[3, 5] = np.inf
    x[4] *= F32(1e19)
    x[5] *= F32(1e-20)
    x[6] = -np.inf
    x[7] *= F32(60)
    return x


def cases() -> list[Case]:
    rng = np.random.default_rng(2026)
    out = []
    for wtype in (F16, Q8_0, Q4_1, Q1_0, Q2_0):
        k = 512 if wtype == Q1_0 else 576
        tname = WEIGHT_TYPES[wtype].name
        w = _rows(rng, wtype, 128, k, 0.02)
        out.append(_matvec(f"matvec {tname} random", w, wtype,
                           quant.quantize_act(rng.standard_normal((1, k)).astype(F32))))
        out.append(_matvec(f"matvec {tname} wide sums", _rows(rng, wtype, 32, k, 1.0), wtype, _wide_acts(rng, k)))
    w = np.full((2, 256), 65504.0, np.float16)
    w[1, ::2] = -65504.0
    q = np.full((1, 256), 127, np.int8)
    a = quant.ActBlocks(q, np.full((1, 8), 15, np.int64), np.array([[0] + [4] * 7], np.int64), np.zeros((1, 8), bool))
    out.append(_matvec("matvec F16 at the int64 limit", w.view(np.uint8).reshape(2, -1), F16, a))
    # add/sub/mul at 2^-126 and below, and the specials
    n = 4096
    x = np.ldexp(1 + rng.integers(0, 2 ** 23, n) / 2 ** 23, rng.integers(-60, 60, n)).astype(F32)
    y = (F32(2.0 ** -126) / x).astype(F32).view(np.uint32) + rng.integers(-3, 4, n).astype(np.uint32)
    y = y.view(F32) * np.where(rng.random(n) < 0.5, F32(-1), F32(1))
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 2.0 ** -126, -(2.0 ** -126), 3e38], F32)
    sa, sb = np.meshgrid(sp, sp)
    a2, b2 = np.concatenate([x, sa.ravel()]).astype(F32), np.concatenate([y, sb.ravel()]).astype(F32)
    for op in ("add", "sub", "mul"):
        out.append(Case(f"f32 {op} near underflow", lambda kern, op=op: kern.binary(op, a2, b2),
                        lambda op=op: getattr(arith, op)(a2, b2)))
    bits = (np.arange(65536, dtype=np.uint64) * 65537 + 12345).astype(np.uint32).view(F32)
    for fn in ("exp", "recip", "rsqrt"):
        out.append(Case(f"{fn} over the f32 range", lambda kern, fn=fn: kern.unary(fn, bits),
                        lambda fn=fn: getattr(funcs, fn)(bits)))
    rows = _edge_rows(rng, 576)
    wn = rng.standard_normal(576).astype(F32)
    out.append(Case("rmsnorm edge rows", lambda kern: kern.rmsnorm(rows, wn, 1e-5),
                    lambda: funcs.rmsnorm(rows, wn, 1e-5)))
    out.append(Case("softmax edge rows", lambda kern: kern.softmax(rows), lambda: funcs.softmax(rows)))
    H, Hkv, D, n_kv = 9, 3, 64, 96
    qa = rng.standard_normal((H, D)).astype(F32) * F32(3)
    kc = attention.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    vc = attention.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    mask = np.where(np.arange(n_kv) < 70, F32(0), F32(-np.inf)).astype(F32)
    out.append(Case("attention GQA decode step", lambda kern: kern.attention(qa, kc, vc, mask, 0.125),
                    lambda: attention.attention(qa[None], kc, vc, mask[None], 0.125)[0]))
    return out


def check_device(kern) -> None:
    """Every case's bits on the device equal the spec's, or DeviceRefused with one line."""
    for case in cases():
        got = np.asarray(case.run(kern), F32).ravel()
        want = np.asarray(case.want(), F32).ravel()
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32)) if got.shape == want.shape else [0]
        if len(bad):
            raise runtime.DeviceRefused(
                f"Vulkan device {kern.d.info} failed the portable on-device check: {case.name}: "
                f"{len(bad)} of {want.size} values differ from the numpy spec (first at {bad[0]}); "
                "staying on the CPU")


def main(argv: list[str]) -> int:
    from bankml.backends.spirv.portable.kernels import PortableKernels
    dev = runtime.open_device(int(argv[0]) if argv else 0)
    try:
        check_device(PortableKernels(dev))
    except runtime.DeviceRefused as e:
        print(e)
        return 1
    print(f"Vulkan device {dev.info}: the portable kernels equal the numpy spec on {len(cases())} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
