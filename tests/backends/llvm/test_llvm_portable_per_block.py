"""ActScaling PerBlock on llvm (backends/llvm/portable/per_block.py): QUANTIZE in blocks of 32,
64, 128 and 256 gives quant.quantize_blocks' codes and scales, and MUL_MAT gives coded.dot_blocks'
bits for every block format, every column count, 1, 2 and 3 threads, with bad, zero and
denormal blocks, ties, a last group shorter than 256, and terms far apart (the two scales of
Q4_1, Q5_1 and Q4_K)."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.profiles.portable import coded, orders as po, quant  # noqa: E402
from bankml.quants import Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES  # noqa: E402
from tests.backends.llvm.test_llvm_portable_coded import weights  # noqa: E402
from tests.backends.llvm.test_llvm_portable_matmul import (T_DIM, THREADS, activations, bits,  # noqa: E402
                                                           edge_activations)

TYPES = [Q8_0, Q4_1, Q1_0, Q2_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K]


def pq8(a: quant.ActBlocks, block: int) -> np.ndarray:
    """The pq8 bytes of activation blocks of `block`: codes, e (int16), m, bad."""
    T, K = a.q.shape
    out = np.zeros((T, K // block, block + 4), np.uint8)
    out[:, :, :block] = a.q.reshape(T, -1, block).view(np.uint8)
    out[:, :, block:block + 2] = a.e.astype(np.int16).reshape(T, -1, 1).view(np.uint8)
    out[:, :, block + 2] = a.m
    out[:, :, block + 3] = a.bad
    return out.reshape(T, -1)


@functools.cache
def _kernels(t: int, k: int, n: int, block: int):
    """(graph, quantize node, its kernel, mul_mat node, its kernel)."""
    x = Node(0, Op.INPUT, (), (T_DIM, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), WEIGHT_TYPES[t].name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (T_DIM, k), po.ACT_TYPE, order=po.QUANTIZE_BLOCKS,
             params={"type": po.ACT_TYPE, "block": block})
    mm = Node(3, Op.MUL_MAT, (1, 2), (T_DIM, n), "f32", name="mm", order=po.MUL_MAT_BLOCKS)
    g = graph_of(x, w, q, mm)
    g.meta["profile"] = "portable"
    g.meta["act_scaling"] = "PerBlock"
    return g, q, compile_kernel(g, q), mm, compile_kernel(g, mm) if block == WEIGHT_TYPES[t].block else None


def run_quantize(x: np.ndarray, block: int, nth: int) -> np.ndarray:
    t = {32: Q8_0, 64: Q2_0, 128: Q1_0}.get(block, Q8_0)
    g, q, kq, _, _ = _kernels(t, x.shape[1], 8, block)
    out = np.full((x.shape[0], x.shape[1] // block * (block + 4)), 0xAB, np.uint8)
    return run_kernel(g, q, out, [x], nth, {"T": x.shape[0]}, kernel=kq)


def run_mul_mat(raw: np.ndarray, t: int, act: np.ndarray, k: int, nth: int) -> np.ndarray:
    g, _, _, mm, kmm = _kernels(t, k, len(raw), WEIGHT_TYPES[t].block)
    out = np.full((act.shape[0], len(raw)), np.nan, np.float32)
    return run_kernel(g, mm, out, [raw, act], nth, {"T": act.shape[0]}, kernel=kmm)


@pytest.mark.parametrize("block", [32, 64, 128, 256])
def test_quantize_blocks_bits_equal_spec(block):
    """Codes, m (128..255) and e per block: edges (zeros, denormals, inf, NaN, huge, ties) and
    random rows."""
    rng = np.random.default_rng(block)
    k = 512
    x = np.concatenate([edge_activations(k, rng), activations(9, k, rng)])
    x[4, :block] = (np.arange(block) % 64 - 31.5).astype(np.float32) * np.float32(2.0 ** -7)   # ties
    want = pq8(quant.quantize_blocks(x, block), block)
    for nth in THREADS:
        assert np.array_equal(run_quantize(x, block, nth), want), f"block={block} nth={nth}"


# 640: a last group of 128
CASES = [(t, k) for t in TYPES for k in (256, 768, 640) if k % WEIGHT_TYPES[t].block == 0]


@pytest.mark.parametrize("t,k", CASES, ids=[f"{WEIGHT_TYPES[t].name}-K{k}" for t, k in CASES])
def test_mul_mat_blocks_bits_equal_spec(t, k):
    rng = np.random.default_rng(t * 1000 + k)
    raw = weights(t, 29, k, rng, far=t in (Q4_1, Q5_1, Q4_K))
    x = np.concatenate([activations(6, k, rng), edge_activations(k, rng)[[0, 1, 3, 5]]])
    block = WEIGHT_TYPES[t].block
    a = quant.quantize_blocks(x, block)
    for cols in (1, 3, len(x)):
        want = coded.dot_blocks(raw, t, quant.ActBlocks(a.q[:cols], a.m[:cols], a.e[:cols], a.bad[:cols]))
        for nth in THREADS:
            got = run_mul_mat(raw, t, pq8(a, block)[:cols], k, nth)
            assert np.array_equal(bits(got), bits(want)), f"{WEIGHT_TYPES[t].name} T={cols} nth={nth}"


@pytest.mark.parametrize("t", [Q4_1, Q5_1, Q4_K], ids=lambda t: WEIGHT_TYPES[t].name)
def test_two_scales_far_apart_round_once(t):
    """Blocks whose two scales are up to 2^30 apart (the second term's bits far below the first's,
    or above them; past 58 aligned bits the lane takes round_terms): the two terms summed
    exactly and rounded once, as the spec; 16 rows (two vectors of eight) and 19 (a tail)."""
    rng = np.random.default_rng(5)
    k = 256
    for n in (16, 19):
        raw = weights(t, n, k, rng)
        blocks = raw.reshape(n, -1, WEIGHT_TYPES[t].block_bytes)
        d = rng.uniform(2.0 ** 10, 2.0 ** 11, blocks.shape[:2]) * rng.choice([-1, 1], blocks.shape[:2])
        m = d * np.where(rng.integers(0, 2, d.shape), 2.0 ** -30, 2.0 ** -2)
        swap = rng.integers(0, 2, d.shape).astype(bool)                  # which of the two is the large one
        d, m = np.where(swap, m, d), np.where(swap, d, m)
        blocks[:, :, 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
        blocks[:, :, 2:4] = m.astype(np.float16)[..., None].view(np.uint8)
        x = activations(5, k, rng)
        a = quant.quantize_blocks(x, WEIGHT_TYPES[t].block)
        want = coded.dot_blocks(raw, t, a)
        for nth in THREADS:
            got = run_mul_mat(raw, t, pq8(a, WEIGHT_TYPES[t].block), k, nth)
            assert np.array_equal(bits(got), bits(want)), (WEIGHT_TYPES[t].name, n, nth)
