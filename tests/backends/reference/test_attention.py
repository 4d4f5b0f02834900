"""reference flash_attn (one_chunk, tiled, split-KV) against ggml_flash_attn_ext, bit for bit.

Data as llama.cpp makes it: K/V are f16 cache rows, n_kv is padded to a multiple of 256 with
empty (-inf) cells, and token i at position n_past+i sees cell j when j <= n_past+i.
ggml picks its kernel from the shapes (M >= 64 tiled, M == 1 with n_kv >= 512 split, else
one_chunk); each test uses shapes that make ggml run the kernel it names.
"""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.attention import flash_attn
from bankml.errors import LoweringError
from bankml.ir.order import FA_REFERENCE, FA_SPLIT, FA_TILED

MODELS = {"smollm2": (9, 3, 64), "qwen3": (16, 8, 128)}          # n_head, n_head_kv, head_dim


def _case(seed: int, m: int, n_past: int, model: str, n_kv: int | None = None):
    n_head, n_head_kv, d = MODELS[model]
    rng = np.random.default_rng(seed)
    used = n_past + m
    n_kv = n_kv or max(256, -(-used // 256) * 256)
    q = (rng.standard_normal((m, n_head, d)) * 2.5).astype(np.float32)
    k = np.zeros((n_kv, n_head_kv, d), np.float16)
    v = np.zeros((n_kv, n_head_kv, d), np.float16)
    k[:used] = rng.standard_normal((used, n_head_kv, d)) * 2.5
    v[:used] = rng.standard_normal((used, n_head_kv, d))
    pos = n_past + np.arange(m)
    cell = np.arange(n_kv)
    visible = (cell[None, :] < used) & (cell[None, :] <= pos[:, None])
    mask = np.where(visible, 0.0, -np.inf).astype(np.float16)
    return q, k, v, mask, np.float32(1.0 / np.sqrt(d))


def _ggml(q, k, v, mask, scale, threads):
    from bankml.oracle.ggml import TYPE_F16, TYPE_F32, Context

    m, n_head, d = q.shape
    n_kv, n_head_kv, dv = v.shape
    ctx = Context()
    tq = ctx.tensor(TYPE_F32, (d, m, n_head), np.ascontiguousarray(q.transpose(1, 0, 2)))
    tk = ctx.tensor(TYPE_F16, (d, n_kv, n_head_kv), np.ascontiguousarray(k.transpose(1, 0, 2)))
    tv = ctx.tensor(TYPE_F16, (dv, n_kv, n_head_kv), np.ascontiguousarray(v.transpose(1, 0, 2)))
    tm = ctx.tensor(TYPE_F16, (n_kv, m), np.ascontiguousarray(mask))
    y = ctx.op("ggml_flash_attn_ext", tq, tk, tv, tm, float(scale), 0.0, 0.0)
    return ctx.compute(y, threads, (m, n_head, dv))


def _assert_same_bits(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad[0].size == 0, f"{bad[0].size} values differ, first at {[b[:3] for b in bad]}: " \
                             f"{got[bad][:3]} vs {want[bad][:3]}"


@pytest.mark.oracle
@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
@pytest.mark.parametrize("m,n_past", [(1, 0), (1, 100), (1, 255), (7, 0), (7, 120), (63, 0), (63, 193)],
                         ids=lambda v: str(v))
def test_one_chunk_bits_equal_ggml(model, m, n_past):
    q, k, v, mask, scale = _case(m * 1000 + n_past, m, n_past, model)
    want = _ggml(q, k, v, mask, scale, threads=2)
    _assert_same_bits(flash_attn(q, k, v, mask, scale, FA_REFERENCE), want)


@pytest.mark.oracle
@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
@pytest.mark.parametrize("m,n_past,threads", [(64, 0, 1), (65, 0, 2), (200, 37, 3), (512, 0, 4), (130, 300, 2)],
                         ids=lambda v: str(v))
def test_tiled_bits_equal_ggml(model, m, n_past, threads):
    q, k, v, mask, scale = _case(m + n_past, m, n_past, model)
    want = _ggml(q, k, v, mask, scale, threads)
    _assert_same_bits(flash_attn(q, k, v, mask, scale, FA_TILED, n_threads=threads), want)


@pytest.mark.oracle
@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
@pytest.mark.parametrize("n_kv,used", [(512, 300), (512, 512), (768, 700), (1280, 1100), (1280, 1025)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_split_kv_bits_equal_ggml(model, n_kv, used, threads):
    q, k, v, mask, scale = _case(n_kv + used + threads, 1, used - 1, model, n_kv=n_kv)
    want = _ggml(q, k, v, mask, scale, threads)
    _assert_same_bits(flash_attn(q, k, v, mask, scale, FA_SPLIT, n_threads=threads), want)


@pytest.mark.oracle
def test_split_kv_depends_on_threads_like_ggml():
    q, k, v, mask, scale = _case(11, 1, 1000, "smollm2", n_kv=1280)
    a = flash_attn(q, k, v, mask, scale, FA_SPLIT, n_threads=2)
    b = flash_attn(q, k, v, mask, scale, FA_SPLIT, n_threads=3)
    assert not np.array_equal(a.view(np.uint32), b.view(np.uint32))
    _assert_same_bits(b, _ggml(q, k, v, mask, scale, 3))


def test_split_kv_with_one_thread_is_one_chunk():
    q, k, v, mask, scale = _case(5, 1, 600, "smollm2", n_kv=768)
    _assert_same_bits(flash_attn(q, k, v, mask, scale, FA_SPLIT, n_threads=1),
                      flash_attn(q, k, v, mask, scale, FA_REFERENCE))


def test_fully_masked_row_is_zero():
    q, k, v, mask, scale = _case(3, 3, 10, "smollm2")
    mask[1] = -np.inf
    for order in (FA_REFERENCE, FA_TILED):
        out = flash_attn(q, k, v, mask, scale, order)
        assert np.all(out[1] == 0) and np.any(out[0] != 0)


def test_refuses_split_for_several_rows():
    q, k, v, mask, scale = _case(3, 2, 10, "smollm2")
    with pytest.raises(LoweringError):
        flash_attn(q, k, v, mask, scale, FA_SPLIT, n_threads=2)
