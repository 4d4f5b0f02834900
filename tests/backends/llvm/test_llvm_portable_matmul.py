"""The portable profile's llvm QUANTIZE, MUL_MAT and GET_ROWS give the numpy spec's bits
(bankml/profiles/portable/quant.py) for every weight type, column count and thread count,
on random and real-model weights and on the edges: bad blocks, inf/NaN scales, denormals,
code ties, groups whose terms span hundreds of binades (the i512 path), exact cancellation,
overflow and flush."""
from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

sys.path.insert(0, str(Path(__file__).parent))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.backends.llvm import jit  # noqa: E402
from bankml.backends.llvm.emit.core import f32, for_range, i32, i64, new_function, void  # noqa: E402
from bankml.backends.llvm.portable.exact import define_round_wide, round_i64, round_terms  # noqa: E402
from bankml.gguf import read_gguf  # noqa: E402
from bankml.ir.dims import Dim  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.profiles.portable import orders as po, quant  # noqa: E402
from bankml.profiles.portable.arith import int_to_f32, round_exact  # noqa: E402
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES  # noqa: E402
from bankml.testing import models  # noqa: E402

TYPES = [F16, Q8_0, Q4_1, Q1_0, Q2_0]
NAMES = [WEIGHT_TYPES[t].name for t in TYPES]
T_DIM = Dim("T", 1, 40)
COLUMNS = (1, 3, 8, 33)
THREADS = (1, 2, 3)
N_ROWS = 37


def pq8(a: quant.ActBlocks) -> np.ndarray:
    """The pq8 bytes (backends/llvm/portable/matmul.py) of the spec's activation blocks."""
    T, K = a.q.shape
    out = np.zeros((T, K // 32, 36), np.uint8)
    out[:, :, :32] = a.q.reshape(T, -1, 32).view(np.uint8)
    out[:, :, 32:34] = a.e.astype(np.int16).reshape(T, -1, 1).view(np.uint8)
    out[:, :, 34] = a.m
    out[:, :, 35] = a.bad
    return out.reshape(T, -1)


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _graph(t: int, k: int, cols, n: int = N_ROWS):
    x = Node(0, Op.INPUT, (), (cols, k), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (n, k), WEIGHT_TYPES[t].name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (cols, k), po.ACT_TYPE, order=po.QUANTIZE, params={"type": po.ACT_TYPE})
    mm = Node(3, Op.MUL_MAT, (1, 2), (cols, n), "f32", name="mm", order=po.MUL_MAT)
    ids = Node(4, Op.INPUT, (), (cols,), "i32", params={"input": "ids"})
    gr = Node(5, Op.GET_ROWS, (1, 4), (cols, k), "f32", name="rows", order=po.GET_ROWS)
    g = graph_of(x, w, q, mm, ids, gr)
    g.meta["profile"] = "portable"
    return g, q, mm, gr


@functools.cache
def _kernel(kind: str, t: int, k: int, cols, n: int = N_ROWS):
    """(graph, node, compiled kernel) of one of the graph's nodes: "q", "mm" or "rows"."""
    g, *nodes = _graph(t, k, cols, n)
    node = dict(zip(("q", "mm", "rows"), nodes))[kind]
    return g, node, compile_kernel(g, node)


def run_quantize(x: np.ndarray, nth: int, cols=T_DIM) -> np.ndarray:
    g, q, kq = _kernel("q", F16, x.shape[1], cols)
    out = np.full((x.shape[0], x.shape[1] // 32 * 36), 0xAB, np.uint8)
    return run_kernel(g, q, out, [x], nth, {"T": x.shape[0]}, kernel=kq)


def run_mul_mat(raw: np.ndarray, t: int, act: np.ndarray, nth: int, cols=T_DIM) -> np.ndarray:
    g, mm, kmm = _kernel("mm", t, act.shape[1] // 36 * 32, cols, len(raw))
    out = np.full((act.shape[0], len(raw)), np.nan, np.float32)
    return run_kernel(g, mm, out, [raw, act], nth, {"T": act.shape[0]}, kernel=kmm)


def run_get_rows(raw: np.ndarray, t: int, k: int, ids: np.ndarray, nth: int) -> np.ndarray:
    g, gr, kgr = _kernel("rows", t, k, T_DIM, len(raw))
    out = np.zeros((len(ids), k), np.float32)
    return run_kernel(g, gr, out, [raw, ids], nth, {"T": len(ids)}, kernel=kgr)


def check_mul_mat(raw: np.ndarray, t: int, x: np.ndarray, threads=THREADS, cols=T_DIM) -> None:
    a = quant.quantize_act(x)
    want = quant.mul_mat(raw, t, a)
    for nth in threads:
        got = run_mul_mat(raw, t, pq8(a), nth, cols)
        assert np.array_equal(bits(got), bits(want)), f"{WEIGHT_TYPES[t].name} K={x.shape[1]} T={len(x)} nth={nth}"


def weights(t: int, n: int, k: int, rng, d=None, mins=None) -> np.ndarray:
    """Random weight bytes of type t; d / mins: the f16 scales [n, k/block] to put in."""
    if t == F16:
        return (rng.standard_normal((n, k)) * 0.05).astype(np.float16).view(np.uint8)
    wt = WEIGHT_TYPES[t]
    raw = rng.integers(0, 256, (n, wt.row_bytes(k)), dtype=np.uint8)
    nb = k // wt.block
    blocks = raw.reshape(n, nb, wt.block_bytes)
    if d is None:
        d = rng.uniform(0.001, 0.1, (n, nb)) * rng.choice([-1, 1], (n, nb))
    blocks[:, :, 0:2] = np.asarray(d, np.float16).view(np.uint8).reshape(n, nb, 2)
    if t == Q4_1:
        mins = rng.uniform(-0.1, 0.1, (n, nb)) if mins is None else mins
        blocks[:, :, 2:4] = np.asarray(mins, np.float16).view(np.uint8).reshape(n, nb, 2)
    return raw


def activations(cols: int, k: int, rng) -> np.ndarray:
    x = (rng.standard_normal((cols, k)) * rng.uniform(0.01, 20, (cols, 1))).astype(np.float32)
    x[0, 32:64] = 0                                           # an all-zero block
    if cols > 2:
        x[2, 5] = np.nan                                      # a bad block in one column
        x[1, :32] = np.float32(1e-39) * rng.standard_normal(32).astype(np.float32)   # denormals
    return x


def ks(t: int) -> list[int]:
    return [k for k in (64, 576, 2048) if k % WEIGHT_TYPES[t].block == 0]


CASES = [(t, k) for t in TYPES for k in ks(t)]
IDS = [f"{WEIGHT_TYPES[t].name}-K{k}" for t, k in CASES]


# ---- QUANTIZE --------------------------------------------------------------------------------

def edge_activations(k: int, rng) -> np.ndarray:
    x = (rng.standard_normal((8, k)) * np.float32(3)).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = np.float32(1e-40)                             # denormals only: an all-zero block
    x[1, 32:64] = np.float32(-1e-41)
    x[2, 3], x[2, 40] = np.inf, -np.inf
    x[3, 7] = np.nan
    x[4, :32] = np.arange(32, dtype=np.float32) * 0.5 - 8     # ties at scale 1 (m = 8, e = -3: x/1 ...)
    x[5, :32] = np.float32(3e38) * np.sign(rng.standard_normal(32)).astype(np.float32)
    x[5, 32:64] = np.float32(1.2e-38)
    m = np.arange(8, 16, dtype=np.float32)
    x[6, :32] = np.repeat(m, 4) * (np.arange(32) % 4 - 1.5).astype(np.float32)    # ties at many scales
    x[7, :32] = np.float32(127 * 8) * np.float32(2.0 ** -20)  # absmax exactly 127 * m * 2^e
    return x


@pytest.mark.parametrize("k", [64, 576, 2048])
def test_quantize_bits_equal_spec(k):
    rng = np.random.default_rng(k)
    x = np.concatenate([edge_activations(k, rng), activations(25, k, rng)])
    for cols in COLUMNS:
        want = pq8(quant.quantize_act(x[:cols]))
        for nth in THREADS:
            assert np.array_equal(run_quantize(x[:cols], nth), want), f"T={cols} nth={nth}"


def test_quantize_ties_round_to_even():
    """Every code tie: x = (c + 1/2) * m * 2^-6 for c in -127..126, each block's scale held at
    m * 2^-6 by a first element 127 * m * 2^-6, for every m."""
    c = np.resize(np.arange(-127, 127) + 0.5, 31 * 9)
    rows = []
    for m in range(8, 16):
        v = np.insert(c.reshape(9, 31), 0, 127.0, axis=1).reshape(-1)
        rows.append(v * m * 2.0 ** -6)
    x = np.array(rows, np.float32)
    assert np.array_equal(run_quantize(x, 1, cols=T_DIM), pq8(quant.quantize_act(x)))


# ---- MUL_MAT ---------------------------------------------------------------------------------

@pytest.mark.parametrize("t,k", CASES, ids=IDS)
def test_mul_mat_bits_equal_spec(t, k):
    rng = np.random.default_rng(t * 7 + k)
    raw = weights(t, N_ROWS, k, rng)
    x = activations(max(COLUMNS), k, rng)
    for cols in COLUMNS:
        check_mul_mat(raw, t, x[:cols])


@pytest.mark.parametrize("t,k", CASES, ids=IDS)
def test_decode_mul_mat_bits_equal_spec(t, k):
    """The T = 1 kernel (one column known at compile time)."""
    rng = np.random.default_rng(t * 11 + k)
    check_mul_mat(weights(t, N_ROWS, k, rng), t, activations(1, k, rng), cols=1)


@pytest.mark.parametrize("t", [Q1_0, Q4_1], ids=["Q1_0", "Q4_1"])
def test_mul_mat_across_row_chunks(t):
    """More rows than one L2 chunk (ggml.matmul.tiling.CHUNK_BYTES of weights), split over threads."""
    rng = np.random.default_rng(300 + t)
    k = 2048
    raw = weights(t, 700 if t == Q1_0 else 300, k, rng)
    check_mul_mat(raw, t, activations(5, k, rng), threads=(1, 2))


REAL = [("smollm2-q4_1", "blk.0.ffn_up.weight"), ("smollm2-q4_1", "blk.3.ffn_down.weight"),
        ("smollm2-q8_0", "blk.0.attn_q.weight"), ("smollm2-f16", "blk.1.ffn_gate.weight"),
        ("smollm2-q2_0", "blk.0.attn_output.weight"), ("qwen3-small-q1_0", "blk.0.ffn_down.weight"),
        ("qwen3-small-q2_0", "blk.1.attn_q.weight"), ("qwen3-small-f16", "blk.0.attn_v.weight")]


@pytest.mark.parametrize("model,tensor", REAL, ids=[f"{m}:{t}" for m, t in REAL])
def test_mul_mat_of_model_rows(model, tensor):
    f = read_gguf(models.path(model))
    info = f.tensors[tensor]
    k = info.shape[0]
    raw = f.tensor_data(tensor).reshape(info.shape[1], -1)[:N_ROWS].copy()
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((8, k)) * np.float32(1.5)).astype(np.float32)
    x[:, rng.integers(0, k, 4)] *= 40                        # outliers, as real residuals have
    for cols in (1, 8):
        check_mul_mat(raw, info.ggml_type, x[:cols], threads=(1, 3))


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_mul_mat_bad_weight_scales(t):
    """inf and NaN f16 scales (F16: inf and NaN weights) make their group NaN, the rest stays."""
    k = 512
    rng = np.random.default_rng(t)
    raw = weights(t, N_ROWS, k, rng)
    if t == F16:
        h = raw.view(np.float16)
        h[0, 3], h[1, 300], h[2, 0] = np.inf, np.nan, -np.inf
    else:
        wt = WEIGHT_TYPES[t]
        blocks = raw.reshape(N_ROWS, -1, wt.block_bytes)
        blocks[0, 0, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
        blocks[1, -1, 0:2] = np.array([np.nan], np.float16).view(np.uint8)
        blocks[2, 0, 0:2] = np.array([-np.inf], np.float16).view(np.uint8)
        if t == Q4_1:
            blocks[3, 2, 2:4] = np.array([np.inf], np.float16).view(np.uint8)
    check_mul_mat(raw, t, activations(3, k, rng))


def wide_activations(k: int, rng) -> np.ndarray:
    """Blocks whose scales span hundreds of binades inside one group, and extremes."""
    base = np.clip(rng.standard_normal((6, k)), -3, 3).astype(np.float32)
    mag = np.ones((6, k // 32), np.float32)
    mag[0] = np.resize([1e-30, 1e30], k // 32)
    mag[1] = np.resize([1e-37, 1e-20, 1, 1e20, 1e37, 1e-10, 1e5, 3e-38], k // 32)
    mag[2] = np.resize([1e38, 1e-38], k // 32)
    mag[3] = np.float32(1e38)                                # overflow
    mag[4] = np.float32(1.5e-38)                             # flush: few elements, small sums
    mag[5] = np.resize([1e10, 1e-25, 1e-25, 1e10], k // 32)
    x = (base * np.repeat(mag, 32, axis=1)).astype(np.float32)
    x[4, np.arange(k) % 64 != 0] = 0
    return x


@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_mul_mat_wide_groups(t):
    """Groups the i64 path cannot hold go the i512 way and still equal the spec; results that
    overflow to inf and flush to zero included."""
    k = 512
    rng = np.random.default_rng(100 + t)
    raw = weights(t, N_ROWS, k, rng)
    if t != F16:                      # scales from f16 denormals to f16's largest
        wt = WEIGHT_TYPES[t]
        d = rng.choice([6e-8, 1e-5, 0.01, 1, 300, 65504], (N_ROWS, k // wt.block)) * rng.choice([-1, 1], (N_ROWS, k // wt.block))
        raw = weights(t, N_ROWS, k, rng, d=d)
    else:
        h = raw.view(np.float16)
        h[:, ::7] = np.float16(60000)
        h[:, 1::11] = np.float16(6e-8)
    x = wide_activations(k, rng)
    a = quant.quantize_act(x)
    want = quant.mul_mat(raw, t, a)
    assert np.isinf(want).any() and (want == 0).any()        # the edges are reached
    for nth in THREADS:
        assert np.array_equal(bits(run_mul_mat(raw, t, pq8(a), nth)), bits(want))


@pytest.mark.parametrize("t", [Q8_0, Q4_1, F16], ids=["Q8_0", "Q4_1", "F16"])
def test_mul_mat_exact_cancellation(t):
    """Big terms that cancel exactly, in one group with far smaller ones: the small ones decide
    (a rounded or truncated sum would give 0 or the wrong sign)."""
    k = 256
    rng = np.random.default_rng(7)
    raw = weights(t, N_ROWS, k, rng)
    if t == F16:
        h = raw.view(np.float16).reshape(N_ROWS, -1, 32)
        h[:, 1] = h[:, 0]
    else:
        blocks = raw.reshape(N_ROWS, -1, WEIGHT_TYPES[t].block_bytes)
        blocks[:, 1] = blocks[:, 0]                          # sub-block 1 = sub-block 0
    x = rng.standard_normal((4, k)).astype(np.float32)
    x[:, 32:64] = -x[:, 0:32]
    x[:, 0:64] *= np.float32(1e30)                           # +-big, cancelling
    x[:, 64:] *= np.array([1e-20, 1e-30, 1, 1e-35], np.float32)[:, None]
    a = quant.quantize_act(x)
    want = quant.mul_mat(raw, t, a)
    assert np.abs(want[want != 0]).max() < 1e10               # the big terms are gone
    for nth in (1, 2):
        assert np.array_equal(bits(run_mul_mat(raw, t, pq8(a), nth)), bits(want))


# ---- the exact sums ----------------------------------------------------------------------------

@functools.cache
def _round_module(n: int = 16):
    """rt: round_terms per row of n terms; rw: the i512 path on the same rows; ri: round_i64."""
    m = ir.Module(name="test_round")
    vt = ir.VectorType(i64, n)
    args = ir.FunctionType(void, [i64.as_pointer(), i64.as_pointer(), f32.as_pointer(), i64])
    for name in ("rt", "rw", "ri"):
        fn, b = new_function(m, name, args)
        pp, xp, op, cnt = fn.args
        with for_range(b, 0, cnt) as k:
            if name == "ri":
                r = round_i64(b, b.load(b.gep(pp, [k])), b.trunc(b.load(b.gep(xp, [k])), i32))
            elif name == "rt":
                o = b.mul(k, i64(n))
                p = b.load(b.bitcast(b.gep(pp, [o]), vt.as_pointer()), align=8)
                x = b.load(b.bitcast(b.gep(xp, [o]), vt.as_pointer()), align=8)
                r = round_terms(b, p, x)
            else:
                o = b.mul(k, i64(n))
                r = b.call(define_round_wide(m), [b.gep(pp, [o]), b.gep(xp, [o]), i64(n)])
            b.store(r, b.gep(op, [k]))
        b.ret_void()
    return jit.compile_module(m)


def run_round(name: str, p: np.ndarray, x: np.ndarray) -> np.ndarray:
    eng = _round_module(p.shape[-1] if p.ndim > 1 else 16)
    p, x = np.ascontiguousarray(p, np.int64), np.ascontiguousarray(x, np.int64)
    out = np.empty(len(p), np.float32)
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int64)(eng.get_function_address(name))
    fn(p.ctypes.data, x.ctypes.data, out.ctypes.data, len(p))
    return out


def random_terms(rng, count: int, spreads) -> tuple[np.ndarray, np.ndarray]:
    width = rng.integers(0, 57, (count, 16))
    p = rng.integers(-2 ** 62, 2 ** 62, (count, 16), dtype=np.int64) >> (62 - width)
    p[rng.random((count, 16)) < 0.3] = 0
    spread = rng.choice(spreads, (count, 1))
    x = np.clip(rng.integers(-160, 124, (count, 1)) + rng.integers(0, spread + 1, (count, 16)), -160, 124)
    p[: count // 10, 1] = -p[: count // 10, 0]                # exact cancellations
    x[: count // 10, 1] = x[: count // 10, 0]
    return p, x


def test_round_terms_equal_round_exact():
    rng = np.random.default_rng(3)
    p, x = random_terms(rng, 5000, [0, 3, 10, 30, 100, 280])
    want = np.array([round_exact(p[i:i + 1], x[i:i + 1])[0] for i in range(len(p))], np.float32)
    assert np.array_equal(bits(run_round("rt", p, x)), bits(want))
    assert np.array_equal(bits(run_round("rw", p, x)), bits(want))


def test_round_terms_sticky_and_ties():
    """Wide sums whose rounding is decided by a far-away low bit (above the half), or a tie; the
    low bit at the window's edge (SUM_WINDOW = 64 places below 2^100's least place) counts, one
    place past it is floored away (a tie again), and a negative one however far past takes
    one unit of the edge."""
    p = np.zeros((7, 16), np.int64)
    x = np.zeros((7, 16), np.int64)
    p[:, :3] = [[1, 1, 1], [1, 1, 0], [3, 1, -1], [-1, -1, -1], [1, -1, 1], [1, 1, 1], [1, 1, 1]]
    x[:, :3] = [[100, 76, 36], [100, 76, 0], [100, 77, -150], [100, 76, -160], [100, 76, -160], [123, 99, -160],
                [100, 76, 35]]
    want = np.array([round_exact(p[i:i + 1], x[i:i + 1])[0] for i in range(len(p))], np.float32)
    up = bits(np.float32(2.0 ** 100))[0] + 1
    assert bits(want)[0] == up                                            # above the half: up
    assert bits(want)[1] == up - 1                                        # a tie: even
    assert bits(want)[6] == up - 1                                        # past the window: a tie
    assert bits(want)[3] == up | 0x80000000                               # -2^100 - 2^76 - 2^36: up
    assert np.array_equal(bits(run_round("rt", p, x)), bits(want))


def test_wide_path_agrees_with_fast_path():
    """Where the i64 path applies, the i512 path gives the same bits."""
    rng = np.random.default_rng(4)
    p, x = random_terms(rng, 5000, [0, 1, 2])
    p >>= 4                                                   # every aligned term fits 58 bits
    fast, wide = run_round("rt", p, x), run_round("rw", p, x)
    assert np.array_equal(bits(fast), bits(wide))


def test_round_i64_equals_int_to_f32():
    rng = np.random.default_rng(5)
    s = rng.integers(-2 ** 63, 2 ** 63 - 1, 20000, dtype=np.int64) >> rng.integers(0, 63, 20000)
    s[:4] = [0, 1, -1, 2 ** 63 - 1]
    x = rng.integers(-200, 130, 20000).astype(np.int64)
    assert np.array_equal(bits(run_round("ri", s, x)), bits(int_to_f32(s, x)))


# ---- GET_ROWS --------------------------------------------------------------------------------

@pytest.mark.parametrize("t", TYPES, ids=NAMES)
def test_get_rows_of_weights(t):
    k = 512
    rng = np.random.default_rng(200 + t)
    raw = weights(t, N_ROWS, k, rng)
    if t == F16:
        raw.view(np.float16)[5, 40] = np.nan
    else:
        wt = WEIGHT_TYPES[t]
        blocks = raw.reshape(N_ROWS, -1, wt.block_bytes)
        blocks[5, 1, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
        blocks[6, 0, 0:2] = np.array([6e-8], np.float16).view(np.uint8)    # an f16 denormal scale
        if t == Q4_1:
            blocks[7, 2, 2:4] = np.array([np.nan], np.float16).view(np.uint8)
            blocks[8, 0, 0:2] = np.array([65504], np.float16).view(np.uint8)
            blocks[8, 0, 2:4] = np.array([6e-8], np.float16).view(np.uint8)  # d*q + min needs a rounding
    ids = np.array([5, 0, 6, 7, 8, 36, 5], np.int32)
    want = quant.get_rows(raw[ids], t, k)
    for nth in (1, 2):
        got = run_get_rows(raw, t, k, ids, nth)
        assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("model,tensor", [("smollm2-q8_0", "token_embd.weight"), ("qwen3-small-q1_0", "token_embd.weight"),
                                          ("smollm2-f16", "token_embd.weight"), ("qwen3-small-q2_0", "token_embd.weight")])
def test_get_rows_of_model_embeddings(model, tensor):
    f = read_gguf(models.path(model))
    info = f.tensors[tensor]
    k = info.shape[0]
    ids = np.array([0, 1, 17, 4000, 49151, 17], np.int32)
    raw = f.tensor_data(tensor).reshape(info.shape[1], -1)
    got = run_get_rows(raw, info.ggml_type, k, ids, 2)
    assert np.array_equal(bits(got), bits(quant.get_rows(raw[ids], info.ggml_type, k)))


def test_get_rows_of_f32_rows_copies():
    x = Node(0, Op.INPUT, (), (9, 64), "f32", params={"input": "x"})
    ids = Node(1, Op.INPUT, (), (3,), "i32", params={"input": "ids"})
    gr = Node(2, Op.GET_ROWS, (0, 1), (3, 64), "f32", name="rows")
    g = graph_of(x, ids, gr)
    g.meta["profile"] = "portable"
    src = np.random.default_rng(0).standard_normal((9, 64)).astype(np.float32)
    src[2, 3] = np.float32(1e-40)
    idx = np.array([2, 8, 2], np.int32)
    got = run_kernel(g, gr, np.zeros((3, 64), np.float32), [src, idx], 2)
    assert np.array_equal(bits(got), bits(src[idx]))
