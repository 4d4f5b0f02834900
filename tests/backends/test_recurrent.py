"""Qwen3.5's recurrent ops in the reference backend (bankml/backends/reference/recurrent.py, issue
27) against ggml-cpu's own ggml_ssm_conv and ggml_gated_delta_net of the oracle build (computed
through libggml at 1 and 2 threads), bit for bit: conv kernels of 4 (Qwen3.5's) and of other
widths (GCC's blocks of 8 and 4 and its FMA tail), one and several tokens and sequences, a state
of 32 and of 128 (Qwen3.5's) with v-heads reading k-heads h % H_k."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.recurrent import gated_delta_net, ssm_conv
from bankml.oracle.ggml import TYPE_F32, Context

pytestmark = pytest.mark.oracle


def _t(ctx: Context, a: np.ndarray) -> int:
    return ctx.tensor(TYPE_F32, tuple(reversed(a.shape)), np.ascontiguousarray(a, np.float32))


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("n_s,ch,d_conv,n_t", [(1, 320, 4, 1), (1, 320, 4, 7), (2, 96, 4, 3), (1, 40, 7, 2),
                                               (1, 24, 13, 5), (2, 16, 22, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_ssm_conv_equals_ggml(n_s, ch, d_conv, n_t, threads):
    rng = np.random.default_rng(d_conv * 100 + n_t)
    x = rng.standard_normal((n_s, ch, d_conv - 1 + n_t)).astype(np.float32)
    w = (rng.standard_normal((ch, d_conv)) / 2).astype(np.float32)
    x.reshape(-1)[:3] = [-0.0, 0.0, 1e-40]
    ctx = Context(64 << 20)
    got = ctx.compute(ctx.op("ggml_ssm_conv", _t(ctx, x), _t(ctx, w)), threads=threads, shape=(n_s, n_t, ch))
    assert np.array_equal(_bits(ssm_conv(x, w)), _bits(got))


@pytest.mark.parametrize("n_s,n_t,h_k,h_v,S", [(1, 1, 4, 8, 32), (1, 5, 4, 8, 32), (2, 3, 2, 2, 32),
                                               (1, 2, 2, 4, 128), (2, 1, 16, 16, 128)])
@pytest.mark.parametrize("threads", [1, 2])
def test_gated_delta_net_equals_ggml(n_s, n_t, h_k, h_v, S, threads):
    rng = np.random.default_rng(S + 10 * n_t + h_v)

    def unit(shape):                          # L2-normalised rows, as Qwen3.5 hands q and k over
        a = rng.standard_normal(shape).astype(np.float32)
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
    q, k = unit((n_s, n_t, h_k, S)), unit((n_s, n_t, h_k, S))
    v = rng.standard_normal((n_s, n_t, h_v, S)).astype(np.float32)
    g = -rng.uniform(0.01, 2.0, (n_s, n_t, h_v, 1)).astype(np.float32)
    beta = rng.uniform(0, 1, (n_s, n_t, h_v, 1)).astype(np.float32)
    state = (rng.standard_normal((n_s, h_v, S, S)) * 0.3).astype(np.float32)
    ctx = Context(256 << 20)
    t = ctx.op("ggml_gated_delta_net", _t(ctx, q), _t(ctx, k), _t(ctx, v), _t(ctx, g), _t(ctx, beta),
               _t(ctx, state), 1)
    flat = ctx.compute(t, threads=threads)
    n_out = n_s * n_t * h_v * S
    out, new = gated_delta_net(q, k, v, g[..., 0], beta[..., 0], state)
    assert np.array_equal(_bits(out).reshape(-1), _bits(flat[:n_out]))
    assert np.array_equal(_bits(new).reshape(-1), _bits(flat[n_out:n_out + new.size]))


# ---- the IR ops: the llvm kernels against the reference backend's step, state written in place ----

from llvmlite import ir  # noqa: E402

from bankml.backends.llvm.jit import call_kernel, compile_module  # noqa: E402
from bankml.backends.llvm.registry import define, kernel_name  # noqa: E402
from bankml.backends.reference.recurrent import gated_delta_net_step, ssm_conv_step  # noqa: E402
from bankml.ir.graph import Graph  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.ir.order import GATED_DELTA_NET, SSM_CONV  # noqa: E402
from bankml.ir.verify import RULES  # noqa: E402
from bankml.passes.pipeline import TYPES  # noqa: E402


def _run_llvm(g: Graph, n: Node, ins: list[np.ndarray], state_at: int, nth: int) -> tuple[np.ndarray, np.ndarray]:
    m = ir.Module()
    define(m, g, n).linkage = "external"
    eng = compile_module(m)
    ins = [np.array(x, copy=True) for x in ins]
    out = np.full(n.shape, np.nan, np.float32)
    for ith in range(nth):
        call_kernel(eng, kernel_name(n), out, ins, ith, nth)
    return out, ins[state_at]


@pytest.mark.parametrize("T,ch,d_conv", [(1, 320, 4), (7, 320, 4), (2, 24, 4), (3, 40, 13), (1, 16, 22)])
def test_ssm_conv_node_llvm_equals_reference(T, ch, d_conv):
    rng = np.random.default_rng(T * 31 + d_conv)
    x = rng.standard_normal((T, ch)).astype(np.float32)
    w = rng.standard_normal((ch, d_conv)).astype(np.float32)
    state = rng.standard_normal((ch, d_conv - 1)).astype(np.float32)
    g = Graph()
    g.add(Node(0, Op.INPUT, (), (T, ch), "f32"))
    g.add(Node(1, Op.WEIGHT, (), (ch, d_conv), "F32", "blk.0.ssm_conv1d.weight", None,
                {"tensor": "blk.0.ssm_conv1d.weight", "ggml_type": 0}))
    g.add(Node(2, Op.CACHE, (), (ch, d_conv - 1), "f32"))
    n = g.add(Node(3, Op.SSM_CONV, (0, 1, 2), (T, ch), "f32", "conv_output_raw-0", SSM_CONV))
    RULES[n.op](g, n, TYPES)                      # the verifier's shape rule holds
    want_state = state.copy()
    want = ssm_conv_step(x, w, want_state)
    cat = np.concatenate([state, x.T], axis=1)
    assert np.array_equal(want_state, cat[:, -(d_conv - 1):])
    for nth in (1, 2, 3):
        got, got_state = _run_llvm(g, n, [x, w, state], 2, nth)
        assert np.array_equal(_bits(got), _bits(want)), f"nth={nth}"
        assert np.array_equal(_bits(got_state), _bits(want_state)), f"nth={nth}"


@pytest.mark.parametrize("T,hk,hv,S", [(1, 4, 8, 32), (5, 4, 8, 32), (2, 2, 2, 128), (3, 16, 16, 128)])
def test_gated_delta_net_node_llvm_equals_reference(T, hk, hv, S):
    rng = np.random.default_rng(T + hv + S)
    unit = lambda a: (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)   # noqa: E731
    q, k = unit(rng.standard_normal((T, hk, S))), unit(rng.standard_normal((T, hk, S)))
    v = rng.standard_normal((T, hv, S)).astype(np.float32)
    gate = -rng.uniform(0.01, 2.0, (T, hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, hv)).astype(np.float32)
    state = (rng.standard_normal((hv, S, S)) * 0.3).astype(np.float32)
    g = Graph()
    for i, shape in enumerate([(T, hk, S), (T, hk, S), (T, hv, S), (T, hv), (T, hv)]):
        g.add(Node(i, Op.INPUT, (), shape, "f32"))
    g.add(Node(5, Op.CACHE, (), (hv, S, S), "f32"))
    n = g.add(Node(6, Op.GATED_DELTA_NET, (0, 1, 2, 3, 4, 5), (T, hv, S), "f32", "attn_output-0", GATED_DELTA_NET))
    RULES[n.op](g, n, TYPES)                      # the verifier's shape rule holds
    want_state = state.copy()
    want = gated_delta_net_step(q, k, v, gate, beta, want_state)
    for nth in (1, 2, 3):
        got, got_state = _run_llvm(g, n, [q, k, v, gate, beta, state], 5, nth)
        assert np.array_equal(_bits(got), _bits(want)), f"nth={nth}"
        assert np.array_equal(_bits(got_state), _bits(want_state)), f"nth={nth}"


# ---- whole graphs: the state caches a session holds, carried from one micro-batch to the next ----

def test_state_caches_carry_over_micro_batches_on_both_backends():
    """A prompt of 3 tokens then 2 decodes through SSM_CONV and GATED_DELTA_NET graphs whose
    states live in the caches dict (Session.caches: kv_cache.cache_array's f32 states), on the
    reference and llvm backends (2 threads): every output and the states after each step equal."""
    from bankml.backends.llvm.backend import run as llvm_run
    from bankml.backends.reference.run import Env, run as ref_run
    from bankml.runtime.session import new_caches
    rng = np.random.default_rng(5)
    ch, nc, hk, hv, S = 96, 4, 1, 2, 32
    w = rng.standard_normal((ch, nc)).astype(np.float32)

    def graph(T: int) -> Graph:
        g = Graph()
        g.add(Node(0, Op.INPUT, (), (T, ch), "f32", None, None, {"input": "x"}))
        g.add(Node(1, Op.WEIGHT, (), (ch, nc), "F32", "w", None, {"tensor": "w", "ggml_type": 0}))
        g.add(Node(2, Op.CACHE, (), (ch, nc - 1), "f32", None, None, {"layer": 0, "kind": "conv"}))
        g.add(Node(3, Op.SSM_CONV, (0, 1, 2), (T, ch), "f32", "conv_output_raw-0", SSM_CONV))
        for i, (lo, hi) in ((4, (0, S)), (5, (S, 2 * S))):            # q and k: columns of the conv output
            g.add(Node(i, Op.SLICE, (3,), (T, S), "f32", None, None, {"lo": lo, "hi": hi}))
            g.add(Node(i + 2, Op.RESHAPE, (i,), (T, hk, S), "f32"))
        g.add(Node(8, Op.INPUT, (), (T, hv, S), "f32", None, None, {"input": "v"}))
        for i, name in ((9, "g"), (10, "beta")):
            g.add(Node(i, Op.INPUT, (), (T, hv), "f32", None, None, {"input": name}))
        g.add(Node(11, Op.CACHE, (), (hv, S, S), "f32", None, None, {"layer": 0, "kind": "ssm"}))
        o = g.add(Node(12, Op.GATED_DELTA_NET, (6, 7, 8, 9, 10, 11), (T, hv, S), "f32", "attn_output-0",
                       GATED_DELTA_NET))
        g.outputs = {"conv": 3, "o": o.id}
        return g

    steps = [3, 1, 1]
    feeds = [{"x": rng.standard_normal((T, ch)).astype(np.float32),
              "g": -rng.uniform(0.01, 1, (T, hv)).astype(np.float32),
              "beta": rng.uniform(0, 1, (T, hv)).astype(np.float32),
              "v": rng.standard_normal((T, hv, S)).astype(np.float32)} for T in steps]
    ref_caches, llvm_caches = new_caches(graph(1)), new_caches(graph(1))
    assert {k: (a.shape, a.dtype) for k, a in ref_caches.items()} == {
        (0, "conv"): ((ch, nc - 1), np.float32), (0, "ssm"): ((hv, S, S), np.float32)}
    weights = {"w": w}.__getitem__
    for T, feed in zip(steps, feeds):
        want = ref_run(graph(T), Env(weights, ref_caches, feed))
        got = llvm_run(graph(T), weights, llvm_caches, feed, threads=2)
        for key in ("conv", "o"):
            assert np.array_equal(_bits(got[key]), _bits(want[key])), (T, key)
        for key in ref_caches:
            assert np.array_equal(_bits(llvm_caches[key]), _bits(ref_caches[key])), (T, key)
    assert np.abs(ref_caches[(0, "ssm")]).sum() > 0       # the states moved
