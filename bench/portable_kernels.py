"""The portable profile's decode kernels timed on their own, one thread: for A/B of kernel changes.

    python bench/portable_kernels.py [attn] [swiglu] [small] [mul_mat]      (default: all four)

attn: FLASH_ATTN of SmolLM2's shape (9/3 heads, D 64, one query row) with 65 of 128 or 256
cells used and 128 of 128; swiglu: 8 and 1536 values; small: ADD, MUL (a broadcast weight),
RMS_NORM of 576, ROPE (mode norm, 9 and 3 heads of 64), SET_ROWS (3 heads of 64), QUANTIZE of
576 and 1536; mul_mat: the decode MUL_MAT (one column) of SmolLM2's Q4_1 shapes (K x N: 576 x
1536 ffn_up, 1536 x 576 ffn_down, 576 x 576 attn_q) and Q8_0 576 x 4096 (a slice of the tied
output matrix), random weights, the f64 fast path. Each kernel is called through a ctypes pointer made once; prints the 10th
percentile and the median of one call in us (a call costs about 0.5 us by itself: SWIGLU of 8
values shows it). Not a test: a measuring tool for docs/PERFORMANCE.md.
"""
from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.backends.llvm import test_llvm_portable_matmul as tpm  # noqa: E402
from tests.backends.llvm import test_llvm_portable_ops as ops  # noqa: E402
from tests.backends.llvm.llvm_kernel_util import compile_kernel  # noqa: E402

from bankml.ir.dims import DIM_SLOTS  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.profiles.portable import attention, orders as po  # noqa: E402
from bankml.profiles.portable import quant  # noqa: E402
from bankml.quants import Q4_1, Q8_0, WEIGHT_TYPES  # noqa: E402


def timed(label: str, g, n, out, ins, reps: int = 2000) -> None:
    eng, name = compile_kernel(g, n)
    dims = np.array([{"llama_threads": 1}.get(k, 0) for k in DIM_SLOTS], np.int64)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (1 + len(ins))), ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_void_p)
    fn = proto(eng.get_function_address(name))
    args = [out.ctypes.data, *[x.ctypes.data for x in ins], 0, 1, dims.ctypes.data]
    for _ in range(20):
        fn(*args)
    ns = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn(*args)
        ns.append(time.perf_counter_ns() - t0)
    print(f"{label}: p10 {np.percentile(ns, 10) / 1e3:.2f} us, median {np.median(ns) / 1e3:.2f} us")


def attn() -> None:
    for used, n_kv in [(65, 128), (65, 256), (128, 128)]:
        q, k, v, mask, scale = ops._attn_case(3, 1, used - 1, "smollm2", n_kv=n_kv)
        M, H, D = q.shape
        cache = lambda i, kind: Node(i, Op.CACHE, (), (n_kv, 3, D), po.CACHE_TYPE, None, None,  # noqa: E731
                                     {"layer": 0, "kind": kind})
        g = ops._pgraph(ops._inp(0, (M, H, D)), cache(1, "k"), cache(2, "v"), ops._inp(3, (M, n_kv), "f16"))
        n = g.add(Node(4, Op.FLASH_ATTN, (0, 1, 2, 3), (M, H, D), "f32", None, po.FLASH_ATTN, {"scale": scale}))
        timed(f"flash_attn {used} of {n_kv} cells", g, n, np.zeros((M, H, D), np.float32), [q, k, v, mask])


def swiglu(rng) -> None:
    for k in (8, 1536):
        g = ops._pgraph(ops._inp(0, (1, k)), ops._inp(1, (1, k)))
        n = g.add(Node(2, Op.SWIGLU, (0, 1), (1, k), "f32", None, po.SWIGLU, {}))
        gate, up = (rng.standard_normal((2, 1, k)) * [[[3.0]], [[1.0]]]).astype(np.float32)
        timed(f"swiglu {k}", g, n, np.zeros((1, k), np.float32), [gate, up])


def small(rng) -> None:
    x, w = rng.standard_normal((1, 576)).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    for op, other in ((Op.ADD, x.copy()), (Op.MUL, w)):
        g = ops._pgraph(ops._inp(0, (1, 576)), Node(1, Op.WEIGHT, (), other.shape, "F32"))
        n = g.add(Node(2, op, (0, 1), (1, 576), "f32", "x", po.ELEMENTWISE))
        timed(f"{op.value} 576", g, n, np.zeros((1, 576), np.float32), [x, other])
    g = ops._pgraph(ops._inp(0, (1, 576)))
    n = g.add(Node(1, Op.RMS_NORM, (0,), (1, 576), "f32", "norm-0", po.RMS_NORM, {"eps": ops.EPS}))
    timed("rms_norm 576", g, n, np.zeros((1, 576), np.float32), [x])
    for heads in (9, 3):
        g = ops._pgraph(ops._inp(0, (1, heads, 64)), ops._inp(1, (1,), "i32"))
        params = {**ops.ROPE_PARAMS, "mode": "norm", "n_dims": 64, "freq_base": 100000.0, "freq_scale": 1.0}
        n = g.add(Node(2, Op.ROPE, (0, 1), (1, heads, 64), "f32", "Qcur-0", po.ROPE, params))
        xr = rng.standard_normal((1, heads, 64)).astype(np.float32)
        timed(f"rope {heads}x64", g, n, np.zeros_like(xr), [xr, np.array([64], np.int32)])
    kv, hkv, d = 256, 3, 64
    g = ops._pgraph(Node(0, Op.CACHE, (), (kv, hkv, d), po.CACHE_TYPE, None, None, {"layer": 0, "kind": "k"}),
                    ops._inp(1, (1, hkv, d)), ops._inp(2, (1,), "i32"))
    n = g.add(Node(3, Op.SET_ROWS, (0, 1, 2), (kv, hkv, d), po.CACHE_TYPE, "cache_k_l0", po.SET_ROWS))
    c = np.zeros((kv, hkv), attention.cache_dtype(d))
    timed(f"set_rows {hkv}x{d}", g, n, c, [c, rng.standard_normal((1, hkv, d)).astype(np.float32),
                                           np.array([64], np.int32)])
    for k in (576, 1536):
        g, q, _, _ = tpm._graph(Q4_1, k, 1)
        xq = (rng.standard_normal((1, k)) * 3).astype(np.float32)
        timed(f"quantize {k}", g, q, np.zeros(k // 32 * 36, np.uint8), [xq])


def mul_mat(rng) -> None:
    for t, k, n in [(Q4_1, 576, 1536), (Q4_1, 1536, 576), (Q4_1, 576, 576), (Q8_0, 576, 4096)]:
        g, _, mm, _ = tpm._graph(t, k, 1, n)
        raw = tpm.weights(t, n, k, rng)
        act = tpm.pq8(quant.quantize_act((rng.standard_normal((1, k)) * 3).astype(np.float32)))
        timed(f"mul_mat {WEIGHT_TYPES[t].name} {k}x{n}", g, mm, np.zeros((1, n), np.float32), [raw, act])


def main() -> None:
    which = sys.argv[1:] or ["attn", "swiglu", "small", "mul_mat"]
    rng = np.random.default_rng(0)
    if "attn" in which:
        attn()
    if "swiglu" in which:
        swiglu(rng)
    if "small" in which:
        small(rng)
    if "mul_mat" in which:
        mul_mat(rng)


if __name__ == "__main__":
    main()
