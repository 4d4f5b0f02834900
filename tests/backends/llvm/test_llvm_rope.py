"""llvm ROPE kernel (cache computed in the kernel with glibc powf/logf/sincosf) against the
reference backend, bit for bit, for every thread split."""
from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm import ggml  # noqa: F401  (registers every kernel)
from bankml.backends.llvm.jit import call_kernel, compile_module
from bankml.backends.llvm.registry import define, kernel_name
from bankml.backends.reference import rope
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import ROPE

PLAIN = dict(n_ctx_orig=8192, freq_base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
             beta_fast=32.0, beta_slow=1.0)
CASES = {
    "smollm2-norm-64": ("norm", 9, 64, {**PLAIN, "freq_base": 100000.0}),
    "qwen3-neox-128": ("neox", 4, 128, {**PLAIN, "freq_base": 1000000.0, "n_ctx_orig": 32768}),
    "neox-64": ("neox", 3, 64, PLAIN),
    "norm-128": ("norm", 2, 128, PLAIN),
    "yarn-neox-128": ("neox", 4, 128, {**PLAIN, "ext_factor": 1.0, "freq_scale": 0.25, "n_ctx_orig": 4096}),
    "yarn-norm-64": ("norm", 3, 64, {**PLAIN, "ext_factor": 1.0, "freq_scale": 0.5, "attn_factor": 1.1}),
    "partial-norm-odd-pairs": ("norm", 2, 64, {**PLAIN, "n_dims": 30}),
    "partial-neox": ("neox", 2, 64, {**PLAIN, "n_dims": 32}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rope_bits_equal_reference_for_any_nth(case):
    mode, n_head, head_dim, params = CASES[case]
    p = {"n_dims": head_dim, **params, "mode": mode}
    rng = np.random.default_rng(len(case))
    pos = np.concatenate([[0, 1, 2, 5000], rng.integers(0, 5001, 36)]).astype(np.int32)
    T = pos.size
    g = Graph()
    g.add(Node(0, Op.INPUT, (), (T, n_head, head_dim), "f32"))
    g.add(Node(1, Op.INPUT, (), (T,), "i32"))
    n = g.add(Node(2, Op.ROPE, (0, 1), (T, n_head, head_dim), "f32", "Qcur-0", ROPE, p))
    m = ir.Module()
    define(m, g, n)
    eng = compile_module(m)

    x = (rng.standard_normal((T, n_head, head_dim)) * 3).astype(np.float32)
    cos, sin = rope.rope_cache(pos, p["n_dims"], p["freq_base"], p["freq_scale"], p["ext_factor"],
                               p["attn_factor"], p["beta_fast"], p["beta_slow"], p["n_ctx_orig"])
    want = rope.rope(x, cos, sin, mode)
    for nth in (1, 2, 3):
        out = np.full_like(x, np.nan)
        for ith in range(nth):
            call_kernel(eng, kernel_name(n), out, [x, pos], ith, nth)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), f"nth={nth}"
