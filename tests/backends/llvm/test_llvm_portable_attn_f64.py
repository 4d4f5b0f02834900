"""The portable FLASH_ATTN's f64 scores (kernels_portable_attention._scores8): eight cells at a time, a
score summed in f64 only where that is provably exact, else the exact i64 / i512 path
(_exact_score). Each case equals the numpy spec's bits (attention.attention) for 1, 2 and 3
threads, and a kernel whose exact path gives NaN instead shows which (query row, head) pairs
had a cell take it (a NaN score makes the row NaN): q block exponent spreads at the f64 limit
and one past it, scores just below and above 2^-126, near overflow, exact zeros with negative
K scales, bad and denormal K scales."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.llvm.portable import attention as kp
from bankml.backends.llvm.portable import f64 as pf
from bankml.profiles.portable import quant
from tests.backends.llvm import test_llvm_portable_ops as ops

SCALE = np.float32(0.125)


def f64_limit(d: int) -> int:
    return pf.limit(kp.TERM_BITS, d // 32)


def case(model: str, m: int, seed: int):
    """q, k, v, mask of m query rows over 256 cells, 100 of them used (the rest masked)."""
    q, k, v, mask, _ = ops._attn_case(seed, m, 100 - m, model)
    return q, k, v, mask


def expect_exact(q, k, mask) -> np.ndarray:
    """[M, H] True where some cell of that (row, head) must take the exact path: the q blocks'
    exponent spread past the f64 limit, or a score (exact in f64 here) nonzero below 2^-126 or
    at least 2^127. Cells that the kernel skips as masked (masked, scores bounded) count not."""
    M, H, D = q.shape
    hkv = k.shape[1]
    a = quant.quantize_act(q)
    nz = a.m != 0
    emin = np.where(nz.any(-1), np.where(nz, a.e, 1 << 20).min(-1), 0)
    spread = np.where(nz.any(-1), np.where(nz, a.e, -(1 << 20)).max(-1) - emin, 0)
    ks, kx, _ = quant.f16_parts(k["d"])
    out = np.zeros((M, H), bool)
    scale_e = int(np.frexp(SCALE)[1]) - 1
    for r in range(M):
        for h in range(H):
            if spread[r, h] > f64_limit(D):
                out[r, h] = True
                continue
            hk = h // (H // hkv)
            qs = a.m[r, h] * np.exp2(a.e[r, h].astype(np.float64))                     # [nsub]
            dots = (a.q[r, h].reshape(-1, 32).astype(np.int64)[None] *
                    k["qs"][:, hk].reshape(len(k), -1, 32).astype(np.int64)).sum(-1)     # [n_kv, nsub]
            s = (dots * qs).sum(-1) * (ks[:, hk] * np.exp2(kx[:, hk].astype(np.float64)))
            bounded = emin[r, h] + spread[r, h] < 128 - 43 - scale_e - 1
            live = ~(bounded & (mask[r] == -np.inf))
            a_ = np.abs(s[live])
            out[r, h] = bool((((a_ < 2.0 ** -126) & (a_ != 0)) | (a_ >= 2.0 ** 127)).any())
    return out


def check(q, k, v, mask, monkeypatch, want_exact=None):
    """The spec's bits; then, with the exact path marked, NaN rows exactly where expect_exact says."""
    ops._attn_check(q, k, v, mask, SCALE)
    exact = expect_exact(q, k, mask) if want_exact is None else want_exact
    M, H, D = q.shape
    with monkeypatch.context() as mp:
        mp.setattr(kp, "_exact_score", lambda b, *args: kp.f32(float("nan")))
        for nth, out in ops._run_all_nth(*attn_graph(q, k), [q, k, v, mask]):
            got = np.isnan(out).all(-1)
            assert np.array_equal(got, exact), f"nth={nth}: exact path at {np.argwhere(got)}, want {np.argwhere(exact)}"
    return exact


def attn_graph(q, k):
    M, H, D = q.shape
    n_kv, hkv = k.shape
    cache = lambda i, kind: ops.Node(i, ops.Op.CACHE, (), (n_kv, hkv, D), ops.po.CACHE_TYPE, None, None,  # noqa: E731
                                     {"layer": 0, "kind": kind})
    g = ops._pgraph(ops._inp(0, (M, H, D)), cache(1, "k"), cache(2, "v"), ops._inp(3, (M, n_kv), "f16"))
    n = g.add(ops.Node(4, ops.Op.FLASH_ATTN, (0, 1, 2, 3), (M, H, D), "f32", None, ops.po.FLASH_ATTN,
                       {"scale": float(SCALE)}))
    return g, n, (M, H, D), np.float32


def blocks_apart(q, spreads):
    """Row r's q blocks with absmax exactly 2^0 (block 0) and 2^-spreads[r] (the others): block
    scales 9 * 2^-10 and 9 * 2^(-10 - s), an exponent spread of exactly s."""
    M, H, D = q.shape
    qb = q.reshape(M, H, D // 32, 32).astype(np.float64)
    qb = qb / np.abs(qb).max(-1, keepdims=True)
    for r, s in enumerate(spreads):
        qb[r, :, 1:] *= 2.0 ** -s
    return qb.astype(np.float32).reshape(M, H, D)


@pytest.mark.parametrize("model", list(ops.MODELS))
def test_spread_at_and_past_the_f64_limit(model, monkeypatch):
    q, k, v, mask = case(model, 5, 1)
    lim = f64_limit(q.shape[2])
    q = blocks_apart(q, [lim - 1, lim, lim + 1, 27, 60])          # 27: the i64 path; 60: the i512 path
    exact = check(q, k, v, mask, monkeypatch)
    assert not exact[:2].any() and exact[2:].all()


def test_scores_near_2_to_the_minus_126(monkeypatch):
    """Tiny q against small K scales: scores just below 2^-126 (exact path: the spec flushes
    after rounding) and just above (f64)."""
    q, k, v, mask = case("smollm2", 6, 2)
    q = (q * np.exp2(-np.array([112, 114, 116, 118, 119, 120], np.float64))[:, None, None]).astype(np.float32)
    k["d"] = (k["d"].astype(np.float32) * np.float32(2.0 ** -6)).astype(np.float16)   # some denormal f16 scales
    exact = check(q, k, v, mask, monkeypatch)
    assert exact.any() and not exact.all()


def test_scores_near_overflow(monkeypatch):
    q, k, v, mask = case("smollm2", 3, 3)
    q[0] *= np.float32(2.0 ** 110)                                 # scores past 2^127: the exact path, inf
    q[1] *= np.float32(2.0 ** 90)
    k["d"] = np.where(np.abs(k["d"].astype(np.float32)) > 0, np.float16(2.0 ** 14), k["d"])
    exact = check(q, k, v, mask, monkeypatch)
    assert exact[0].all() and not exact[2].any()


def test_exact_zero_scores_with_negative_scales(monkeypatch):
    """A score that is an exact zero is +0 (the f64 product with a negative K scale is -0):
    visible through a mask of -0.0 (-0 + -0 is -0, +0 + -0 is +0)."""
    q, k, v, mask = case("smollm2", 4, 4)
    k["d"][::2] = -k["d"][::2]                                    # negative K scales
    k["qs"][:40:3] = 0                                            # zero codes: every dot 0
    q[0] = 0.0                                                    # a zero q row: every score 0
    q[1, :, 32:] = 0.0
    mask[mask == 0] = np.float16(-0.0)
    exact = check(q, k, v, mask, monkeypatch)
    assert not exact.any()


def test_bad_and_denormal_k_scales(monkeypatch):
    q, k, v, mask = case("qwen3", 4, 5)
    k["d"][3, 0] = np.float16(np.inf)                              # a used cell: that K head's rows NaN
    k["d"][200, 1] = np.float16(np.nan)                            # a masked cell: NaN as well
    k["d"][7, 1] = np.float16(-6e-8)                               # denormal f16 scales
    k["d"][8, 0] = np.float16(6.1e-5)
    want = ops._attn_check(q, k, v, mask, SCALE)
    with monkeypatch.context() as mp:                              # no cell took the exact path
        mp.setattr(kp, "_exact_score", lambda b, *args: kp.f32(1e30))
        for nth, out in ops._run_all_nth(*attn_graph(q, k), [q, k, v, mask]):
            ops._same(out, want, f"nth={nth}")
