"""llvm FLASH_ATTN kernels (one_chunk, split-KV, tiled) against the reference backend, bit for bit,
for every thread split of ours (nth 1, 2, 3). Data as llama.cpp makes it: f16 cache rows, n_kv
padded to 256 with empty (-inf) cells, token i at position n_past+i sees cell j <= n_past+i."""
from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm import ggml  # noqa: F401  (registers every kernel)
from bankml.backends.llvm.jit import call_kernel, compile_module
from bankml.backends.llvm.registry import define, kernel_name
from bankml.backends.reference.attention import flash_attn
from bankml.errors import LoweringError
from bankml.ir.dims import Dim
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FA_REFERENCE, FA_SPLIT, FA_TILED, ROPE

MODELS = {"smollm2": (9, 3, 64), "qwen3": (4, 2, 128)}          # n_head, n_head_kv, head_dim


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
    return q, k, v, mask, float(np.float32(1.0 / np.sqrt(d)))


def _graph(q, k, v, mask, scale, order, n_threads=None):
    g = Graph()
    g.add(Node(0, Op.INPUT, (), q.shape, "f32"))
    g.add(Node(1, Op.CACHE, (), k.shape, "f16"))
    g.add(Node(2, Op.CACHE, (), v.shape, "f16"))
    g.add(Node(3, Op.INPUT, (), mask.shape, "f16"))
    params = {"scale": scale} if n_threads is None else {"scale": scale, "n_threads": n_threads}
    return g, g.add(Node(4, Op.FLASH_ATTN, (0, 1, 2, 3), q.shape, "f32", None, order, params))


def _check(g, n, q, k, v, mask, want, sizes=None):
    m = ir.Module()
    define(m, g, n)
    eng = compile_module(m)
    for nth in (1, 2, 3):
        out = np.full(want.shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [q, k, v, mask], ith, nth, sizes,
                        llama_threads=n.params.get("n_threads", 1))
        bad = np.nonzero(out.view(np.uint32) != want.view(np.uint32))
        assert bad[0].size == 0, f"nth={nth}: {bad[0].size} values differ, first at {[x[:3] for x in bad]}"


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("m,n_past", [(1, 0), (1, 200), (7, 0), (7, 120), (63, 0), (63, 193)], ids=str)
def test_one_chunk_bits_equal_reference(model, m, n_past):
    q, k, v, mask, scale = _case(m * 1000 + n_past, m, n_past, model)
    g, n = _graph(q, k, v, mask, scale, FA_REFERENCE)
    _check(g, n, q, k, v, mask, flash_attn(q, k, v, mask, scale, FA_REFERENCE))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("n_kv,used", [(512, 300), (512, 512), (768, 700), (1280, 1100), (1280, 1025)], ids=str)
@pytest.mark.parametrize("n_threads", [2, 3])
def test_split_kv_bits_equal_reference(model, n_kv, used, n_threads):
    q, k, v, mask, scale = _case(n_kv + used, 1, used - 1, model, n_kv)
    g, n = _graph(q, k, v, mask, scale, FA_SPLIT, n_threads)
    _check(g, n, q, k, v, mask, flash_attn(q, k, v, mask, scale, FA_SPLIT, n_threads))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("m,n_past,n_threads,n_kv", [(64, 0, 1, None), (65, 0, 2, None), (200, 37, 3, None),
                                                     (512, 0, 4, None), (130, 300, 2, None),
                                                     (100, 150, 2, 300), (70, 0, 3, 72),
                                                     (5, 0, 1, None), (6, 30, 1, None), (12, 250, 2, None),
                                                     (67, 190, 1, 264)], ids=str)
def test_tiled_bits_equal_reference(model, m, n_past, n_threads, n_kv):
    q, k, v, mask, scale = _case(m + n_past, m, n_past, model, n_kv)
    g, n = _graph(q, k, v, mask, scale, FA_TILED, n_threads)
    _check(g, n, q, k, v, mask, flash_attn(q, k, v, mask, scale, FA_TILED, n_threads))


def test_tiled_without_n_threads_param_cuts_tiles_for_one_thread():
    q, k, v, mask, scale = _case(5, 96, 10, "smollm2")
    g, n = _graph(q, k, v, mask, scale, FA_TILED)
    _check(g, n, q, k, v, mask, flash_attn(q, k, v, mask, scale, FA_TILED, 1))


def test_cache_larger_than_n_kv_reads_only_first_cells():
    """The runner hands the whole cache [kv_size, ...]; the kernel reads the first n_kv cells."""
    q, k, v, mask, scale = _case(3, 7, 40, "qwen3")
    g, n = _graph(q, k, v, mask, scale, FA_REFERENCE)
    big_k = np.concatenate([k, np.full((256,) + k.shape[1:], np.nan, np.float16)])
    big_v = np.concatenate([v, np.full((256,) + v.shape[1:], np.nan, np.float16)])
    _check(g, n, q, big_k, big_v, mask, flash_attn(q, k, v, mask, scale, FA_REFERENCE))


@pytest.mark.parametrize("n_tokens,n_kv", [(7, 256), (1, 512), (70, 256)], ids=str)
def test_model_graph_attention_node(n_tokens, n_kv):
    """The flash_attn node of a real Qwen3 graph (inputs rope and set_rows nodes) compiles and matches."""
    import bankml
    from bankml.testing import models

    g = bankml.load(models.path("qwen3-small-q1_0")).graph(n_tokens, n_kv, 1)
    n = next(x for x in g if x.op is Op.FLASH_ATTN)
    qn, kn = g[n.inputs[0]], g[n.inputs[1]]
    rng = np.random.default_rng(n_tokens)
    used = n_kv - 10
    q = (rng.standard_normal(qn.shape) * 2.5).astype(np.float32)
    k = np.zeros(kn.shape, np.float16)
    v = np.zeros(kn.shape, np.float16)
    k[:used] = rng.standard_normal((used,) + kn.shape[1:]) * 2.5
    v[:used] = rng.standard_normal((used,) + kn.shape[1:])
    pos = used - n_tokens + np.arange(n_tokens)
    mask = np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float16)
    want = flash_attn(q, k, v, mask, n.params["scale"], n.order, n.params.get("n_threads", 1))
    _check(g, n, q, k, v, mask, want)


def test_flash_attn_refuses_other_order():
    q, k, v, mask, scale = _case(1, 2, 0, "smollm2")
    g, n = _graph(q, k, v, mask, scale, ROPE)
    with pytest.raises(LoweringError):
        define(ir.Module(), g, n)


GENERIC = [(FA_REFERENCE, Dim("T", 2, 63), Dim("KV", 256, 1024), [(2, 0), (7, 250), (63, 193), (33, 700)]),
           (FA_TILED, Dim("T", 64, 512), Dim("KV", 256, 1024), [(64, 0), (65, 191), (200, 37), (130, 600)]),
           (FA_SPLIT, 1, Dim("KV", 512, 2048), [(1, 300), (1, 700), (1, 1100), (1, 2047)])]


@pytest.mark.parametrize("llama_threads", [2, 3])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("order,T,KV,sizes", GENERIC, ids=["one_chunk", "tiled", "split"])
def test_generic_kernel_bits_equal_reference_at_every_size(order, T, KV, sizes, model, llama_threads):
    """One kernel for rows and cells known at run time: the tiled Q cut and the split-KV chunks
    computed from T, KV and llama_threads as ggml computes them."""
    n_head, n_head_kv, d = MODELS[model]
    g = Graph()
    g.add(Node(0, Op.INPUT, (), (T, n_head, d), "f32"))
    g.add(Node(1, Op.CACHE, (), (KV, n_head_kv, d), "f16"))
    g.add(Node(2, Op.CACHE, (), (KV, n_head_kv, d), "f16"))
    g.add(Node(3, Op.INPUT, (), (T, KV), "f16"))
    n = g.add(Node(4, Op.FLASH_ATTN, (0, 1, 2, 3), (T, n_head, d), "f32", None, order,
                   {"scale": float(np.float32(1.0 / np.sqrt(d))), "n_threads": llama_threads}))
    m_ = ir.Module()
    define(m_, g, n)
    eng = compile_module(m_)
    for m, n_past in sizes:
        q, k, v, mask, scale = _case(m + n_past, m, n_past, model)
        want = flash_attn(q, k, v, mask, scale, order, llama_threads)
        for nth in (1, 3):
            out = np.full(want.shape, np.nan, np.float32)
            for ith in range(nth):
                call_kernel(eng, kernel_name(n), out, [q, k, v, mask], ith, nth, {"T": m, "KV": mask.shape[1]},
                            llama_threads)
            assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), f"T={m} past={n_past} nth={nth}"


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("q_scale", [1.0, 12.0, 60.0])
def test_tiled_scores_far_below_the_max_bits_equal_reference(model, q_scale):
    """Unmasked tiles whose scores lie 87 and more below the row's max: ggml_v_expf leaves its fast
    path in those lanes (|n| > 126), which the tiled kernel runs only when some lane needs it."""
    q, k, v, mask, scale = _case(11, 70, 200, model)
    q = (q * np.float32(q_scale)).astype(np.float32)
    g, n = _graph(q, k, v, mask, scale, FA_TILED, 2)
    want = flash_attn(q, k, v, mask, scale, FA_TILED, 2)
    _check(g, n, q, k, v, mask, want)
