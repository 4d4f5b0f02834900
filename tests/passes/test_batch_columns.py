"""A batch of sequences' mul_mat (choose_matmul_kernel with g.meta["seqs"]): every column carries
the bits ggml gives that column alone, for every weight type and every column count 2..17, on
the llvm kernel and the reference lowering; and without the rule the bits would differ (F16's
tinyBLAS, Q4_K's gemm and tiled paths), so the test discriminates."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "backends" / "llvm"))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.backends.reference.lowerings import LOWERINGS  # noqa: E402
from bankml.backends.reference.matmul import quantize_activation  # noqa: E402
from bankml.backends.reference.run import Env  # noqa: E402
from bankml.gguf.reader import ggml_type_name  # noqa: E402
from bankml.ir.dims import Dim  # noqa: E402
from bankml.ir.graph import Graph  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.oracle import ggml as G  # noqa: E402
from bankml.passes.choose_matmul_kernel import choose_matmul_kernel, matmul_order  # noqa: E402
from bankml.quants import F16, Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, Q8_K, WEIGHT_TYPES  # noqa: E402
from bankml.quants import q8_k  # noqa: E402
from bankml.quants.activation import to_bytes  # noqa: E402

pytestmark = pytest.mark.oracle

K, T_MAX = 512, 17
# (type, rows): 40 rows repack Q4_0 and Q4_K (their gemm and gemv), 36 do not
CASES = [(F16, 36), (Q8_0, 36), (Q4_1, 36), (Q1_0, 36), (Q2_0, 36), (Q4_0, 40), (Q4_0, 36), (Q5_0, 36),
         (Q5_1, 36), (Q4_K, 40), (Q4_K, 36), (Q6_K, 36)]


def _id(c):
    return f"{WEIGHT_TYPES[c[0]].name}-N{c[1]}"


def _problem(t, n):
    rng = np.random.default_rng(7 * n + t)
    w = (rng.standard_normal((n, K)) * rng.uniform(0.01, 1, (n, 1))).astype(np.float32)
    x = (rng.standard_normal((T_MAX, K)) * rng.uniform(0.01, 20, (T_MAX, 1))).astype(np.float32)
    raw = w.astype(np.float16).view(np.uint8) if t == F16 else G.quantize_chunk(t, w)
    return raw, x


def _alone(t, raw, x):
    """ggml_mul_mat of each column by itself (the one-column path; repacked rows as llama.cpp loads them)."""
    n = raw.shape[0]
    if t in (Q4_0, Q4_K) and n % 8 == 0:
        return np.concatenate([G.mul_mat_repacked(t, raw, x[i:i + 1], 2) for i in range(len(x))])
    ctx = G.Context()
    gtype = G.TYPE_F16 if t == F16 else t
    w = ctx.tensor(gtype, (K, n), raw)
    return np.concatenate([ctx.compute(ctx.op("ggml_mul_mat", w, ctx.tensor(G.TYPE_F32, (K, 1), x[i])), 2, (1, n))
                           for i in range(len(x))])


def _graph(t, n, T) -> tuple[Graph, Node, Node]:
    """x -> quantize -> mul_mat, after choose_matmul_kernel in a batch of sequences."""
    wt = WEIGHT_TYPES[t]
    x = Node(0, Op.INPUT, (), (T, K), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, K), wt.name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (T, K), ggml_type_name(wt.act_type), params={"type": wt.act_type})
    mm = Node(3, Op.MUL_MAT, (1, 2), (T, n), "f32", name="mm")
    g = graph_of(x, w, q, mm)
    g.meta["seqs"] = True
    g = choose_matmul_kernel(g)
    return g, g[2], g[3]


def _act(t, x):
    act = WEIGHT_TYPES[t].act_type
    if act == Q8_K:
        return q8_k.to_bytes(q8_k.quantize_q8_k(x))
    a = quantize_activation(x, act)
    return a.view(np.uint8).reshape(x.shape[0], -1) if act == F16 else to_bytes(a)


def _same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_every_column_has_its_bits_alone_at_every_column_count(case):
    t, n = case
    raw, x = _problem(t, n)
    want = _alone(t, raw, x)
    g, q, mm = _graph(t, n, Dim("T", 2, T_MAX))
    assert mm.order is matmul_order(t, n, 1) and mm.params["per_column"]
    kernel = compile_kernel(g, mm)
    for m in range(2, T_MAX + 1):
        out = np.full((m, n), np.nan, np.float32)
        run_kernel(g, mm, out, [raw, _act(t, x[:m])], 1 + m % 3, {"T": m}, kernel)
        assert _same(out, want[:m]), f"llvm, {m} columns"
        gm, _, mmm = _graph(t, n, m)
        env = Env(lambda name: raw, {}, {})
        act = LOWERINGS.lookup(gm, gm[2])(env, gm, gm[2], x[:m])
        assert _same(LOWERINGS.lookup(gm, mmm)(env, gm, mmm, raw, act), want[:m]), f"reference, {m} columns"


@pytest.mark.parametrize("case", [(F16, 36), (Q4_K, 40), (Q4_K, 36), (Q6_K, 36)], ids=_id)
def test_without_the_rule_a_batch_changes_the_bits(case):
    """These types' many-column paths (tinyBLAS, gemm, tiled) give other bits than one column alone."""
    t, n = case
    raw, x = _problem(t, n)
    x = x[:8]
    g = graph_of(Node(0, Op.INPUT, (), (8, K), "f32", params={"input": "x"}),
                 Node(1, Op.WEIGHT, (), (n, K), WEIGHT_TYPES[t].name, params={"tensor": "w", "ggml_type": t}),
                 Node(2, Op.QUANTIZE, (0,), (8, K), ggml_type_name(WEIGHT_TYPES[t].act_type),
                      params={"type": WEIGHT_TYPES[t].act_type}),
                 Node(3, Op.MUL_MAT, (1, 2), (8, n), "f32", name="mm"))
    g = choose_matmul_kernel(g)
    out = np.full((8, n), np.nan, np.float32)
    run_kernel(g, g[3], out, [raw, _act(t, x)], 2)
    assert not _same(out, _alone(t, raw, x))
