"""The quantized K/V cache's ops against ggml's, bit for bit, then the llvm kernels against the reference:
quantize_row_q4_0 (the q4_0 cache write), the Hadamard rotation (ggml_mul_mat with the Hadamard hint,
which ggml-cpu runs as ggml_compute_forward_fwht) and flash_attn_ext's one_chunk kernel over q8_0/q4_0
K and V (with f16 ones beside them), on the cache layout llama.cpp uses (cells of n_head_kv rows)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm import compile as _graph  # noqa: F401  (registers every kernel)
from bankml.backends.llvm.jit import call_kernel, compile_module
from bankml.backends.llvm.registry import define, kernel_name
from bankml.backends.reference.attention_quant import flash_attn_quant, fwht, quantize_rows
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FWHT, SET_ROWS_Q4_0, SET_ROWS_Q8_0
from bankml.passes.choose_attention_kernel import attention_order_quant
from bankml.quants import q4_0

pytestmark = pytest.mark.oracle

GGML_TYPE = {"f16": 1, "q8_0": 8, "q4_0": 2}
MODELS = {"smollm2": (9, 3, 64), "qwen3": (4, 2, 128)}          # n_head, n_head_kv, head_dim


def _same(got, want):
    assert got.shape == want.shape
    bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32)) if got.dtype == np.float32 else \
        np.nonzero(got != want)
    assert bad[0].size == 0, f"{bad[0].size} values differ, first at {[b[:3] for b in bad]}"


def _rows(seed, rows, n):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * rng.choice([1e-3, 1.0, 30.0], (rows, 1))).astype(np.float32)
    x[0] = 0                                                     # an all-zero block: d = 0
    x[1, :32] = np.linspace(-1, 1, 32, dtype=np.float32)         # |max| tie: -1 comes first
    x[2, :32] = 0.5
    x[2, 5] = -4.0                                               # x*id + 8.5 on exact integers
    return x


def test_q4_0_cache_rows_equal_ggml_quantize_row_q4_0():
    from bankml.oracle.ggml import from_float
    x = _rows(1, 64, 128)
    want = np.stack([np.frombuffer(from_float(GGML_TYPE["q4_0"], r), np.uint8) for r in x])
    _same(q4_0.quantize(x), want)


@pytest.mark.parametrize("n", [64, 128])
def test_reference_fwht_equals_ggml_hadamard_mul_mat(n):
    from bankml.oracle.ggml import TYPE_F32, Context, lib
    x = _rows(n, 27, n) * np.float32(7)
    ctx = Context()
    rot = ctx.tensor(TYPE_F32, (n, n), np.zeros((n, n), np.float32))   # ggml-cpu reads only its size
    t = ctx.tensor(TYPE_F32, (n, len(x)), x)
    y = ctx.op("ggml_mul_mat", rot, t)
    fn = lib().ggml_mul_mat_set_hint
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int], None
    fn(y, 1)                                                     # GGML_HINT_SRC0_IS_HADAMARD
    _same(fwht(x, n), ctx.compute(y, 2, x.shape))


def _compile(g, n):
    """n's kernel alone in a module, callable from outside."""
    mod = ir.Module()
    define(mod, g, n).linkage = "external"
    return compile_module(mod)


def _cache(kind_type, rng, n_kv, used, hkv, d, scale):
    vals = np.zeros((n_kv, hkv * d), np.float32)
    vals[:used] = rng.standard_normal((used, hkv * d)) * scale
    if kind_type == "f16":
        return vals.astype(np.float16).reshape(n_kv, hkv, d)
    return quantize_rows(vals, kind_type)


def _case(seed, m, n_past, model, kt, vt):
    n_head, hkv, d = MODELS[model]
    rng = np.random.default_rng(seed)
    used = n_past + m
    n_kv = max(256, -(-used // 256) * 256)
    q = (rng.standard_normal((m, n_head, d)) * 2.5).astype(np.float32)
    k, v = _cache(kt, rng, n_kv, used, hkv, d, 2.5), _cache(vt, rng, n_kv, used, hkv, d, 1.0)
    pos = n_past + np.arange(m)
    cell = np.arange(n_kv)
    mask = np.where((cell[None, :] < used) & (cell[None, :] <= pos[:, None]), 0.0, -np.inf).astype(np.float16)
    return q, k, v, mask, float(np.float32(1 / np.sqrt(d)))


def _ggml_fa(q, k, v, kt, vt, hkv, mask, scale, threads):
    from bankml.oracle.ggml import TYPE_F16, TYPE_F32, Context
    m, n_head, d = q.shape
    n_kv = mask.shape[1]
    ctx = Context()
    tq = ctx.tensor(TYPE_F32, (d, m, n_head), np.ascontiguousarray(q.transpose(1, 0, 2)))
    # the cache as llama.cpp holds it: cells of n_head_kv rows, viewed [d, n_kv, n_head_kv]
    tk = ctx.op("ggml_permute", ctx.tensor(GGML_TYPE[kt], (d, hkv, n_kv), np.ascontiguousarray(k)), 0, 2, 1, 3)
    tv = ctx.op("ggml_permute", ctx.tensor(GGML_TYPE[vt], (d, hkv, n_kv), np.ascontiguousarray(v)), 0, 2, 1, 3)
    tm = ctx.tensor(TYPE_F16, (n_kv, m), np.ascontiguousarray(mask))
    y = ctx.op("ggml_flash_attn_ext", tq, tk, tv, tm, float(scale), 0.0, 0.0)
    return ctx.compute(y, threads, (m, n_head, d))


FA_CASES = [("smollm2", "q8_0", "q8_0", 1, 300), ("smollm2", "q4_0", "q4_0", 7, 100),
            ("smollm2", "q8_0", "f16", 64, 0), ("qwen3", "q8_0", "q8_0", 1, 600), ("qwen3", "q4_0", "q4_0", 65, 0),
            ("qwen3", "q8_0", "f16", 3, 250), ("qwen3", "f16", "q8_0", 1, 520), ("smollm2", "f16", "q4_0", 9, 40),
            ("qwen3", "q4_0", "q8_0", 2, 10)]


@pytest.mark.parametrize("model,kt,vt,m,n_past", FA_CASES)
def test_flash_attn_over_a_quantized_cache(model, kt, vt, m, n_past):
    """Reference against ggml_flash_attn_ext (2 threads), then the llvm kernel against the reference
    for 1, 2 and 3 threads of ours."""
    _, hkv, d = MODELS[model]
    q, k, v, mask, scale = _case(m * 31 + n_past, m, n_past, model, kt, vt)
    order = attention_order_quant(kt, vt)
    want = flash_attn_quant(q, k, v, kt, vt, hkv, mask, scale, order)
    _same(want, _ggml_fa(q, k, v, kt, vt, hkv, mask, scale, 2))

    g = Graph()
    g.add(Node(0, Op.INPUT, (), q.shape, "f32"))
    g.add(Node(1, Op.CACHE, (), (mask.shape[1], hkv, d), kt))
    g.add(Node(2, Op.CACHE, (), (mask.shape[1], hkv, d), vt))
    g.add(Node(3, Op.INPUT, (), mask.shape, "f16"))
    n = g.add(Node(4, Op.FLASH_ATTN, (0, 1, 2, 3), q.shape, "f32", None, order, {"scale": scale}))
    eng = _compile(g, n)
    for nth in (1, 2, 3):
        out = np.full(want.shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [q, np.ascontiguousarray(k), np.ascontiguousarray(v), mask], ith, nth)
        _same(out, want)


@pytest.mark.parametrize("n,heads", [(64, 9), (128, 4), (64, 2)])
def test_llvm_hadamard_equals_reference(n, heads):
    x = (np.random.default_rng(n + heads).standard_normal((5, heads, 128)) * 3).astype(np.float32)
    g = Graph()
    g.add(Node(0, Op.INPUT, (), x.shape, "f32"))
    h = g.add(Node(1, Op.HADAMARD, (0,), x.shape, "f32", "node_10", FWHT, {"n": n}))
    eng = _compile(g, h)
    for nth in (1, 3):
        out = np.full(x.shape, np.nan, np.float32)
        for ith in range(nth):
            call_kernel(eng, kernel_name(h), out, [x], ith, nth)
        _same(out, fwht(x, n))


@pytest.mark.parametrize("cache_type", ["q8_0", "q4_0"])
def test_llvm_quantized_set_rows_equals_reference(cache_type):
    hkv, d, kv_size, T = 2, 128, 16, 5
    x = _rows(3, T, hkv * d).reshape(T, hkv, d)
    pos = np.array([3, 4, 5, 6, 9], np.int32)
    rb = quantize_rows(x[:1], cache_type).shape[1]
    want = np.zeros((kv_size, rb), np.uint8)
    want[pos] = quantize_rows(x, cache_type)
    g = Graph()
    g.add(Node(0, Op.CACHE, (), (kv_size, hkv, d), cache_type))
    g.add(Node(1, Op.INPUT, (), x.shape, "f32"))
    g.add(Node(2, Op.INPUT, (), pos.shape, "i32"))
    order = SET_ROWS_Q8_0 if cache_type == "q8_0" else SET_ROWS_Q4_0
    n = g.add(Node(3, Op.SET_ROWS, (0, 1, 2), (kv_size, hkv, d), cache_type, "cache_k_l0 (view)", order, {}))
    eng = _compile(g, n)
    for nth in (1, 2):
        cache = np.zeros((kv_size, rb), np.uint8)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), cache, [cache, x, pos], ith, nth)
        _same(cache, want)
