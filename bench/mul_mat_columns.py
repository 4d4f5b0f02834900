"""One mul_mat kernel alone, by column count: the decode graph's one-column kernel against the
generic kernel a step of several sessions (decode-seqs) or a short prompt runs, on one thread, over
a weight matrix too large for the caches (196,608 rows of K 576: it streams from memory, as a
decode's weights do). Best of 5 calls; GB/s = the weight bytes over the time.

    python bench/mul_mat_columns.py [--type q8_0|q4_1]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "backends" / "llvm"))
from llvm_kernel_util import compile_kernel, graph_of, run_kernel  # noqa: E402

from bankml.backends.reference.matmul import quantize_activation  # noqa: E402
from bankml.gguf.reader import ggml_type_name  # noqa: E402
from bankml.ir.dims import Dim  # noqa: E402
from bankml.ir.node import Node  # noqa: E402
from bankml.ir.ops import Op  # noqa: E402
from bankml.passes.choose_matmul_kernel import matmul_order  # noqa: E402
from bankml.quants import Q4_1, Q8_0, WEIGHT_TYPES  # noqa: E402
from bankml.quants.activation import to_bytes  # noqa: E402

N, K = 4 * 49152, 576


def weights(t: int) -> np.ndarray:
    """Random blocks with small f16 scales (and mins): N rows of K."""
    wt = WEIGHT_TYPES[t]
    raw = np.random.default_rng(0).integers(0, 256, (N, wt.row_bytes(K)), dtype=np.uint8)
    blocks = raw.reshape(N, -1, wt.block_bytes)
    small = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, :, 0:2] = small
    if t == Q4_1:
        blocks[:, :, 2:4] = small
    return raw


def kernel(t: int, T):
    wt = WEIGHT_TYPES[t]
    x = Node(0, Op.INPUT, (), (T, K), "f32", params={"input": "x"})
    w = Node(1, Op.WEIGHT, (), (N, K), wt.name, params={"tensor": "w", "ggml_type": t})
    q = Node(2, Op.QUANTIZE, (0,), (T, K), ggml_type_name(wt.act_type), params={"type": wt.act_type})
    mm = Node(3, Op.MUL_MAT, (1, 2), (T, N), "f32", name="mm", order=matmul_order(t, N, 1))
    g = graph_of(x, w, q, mm)
    return g, mm, compile_kernel(g, mm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="q8_0", choices=("q8_0", "q4_1"))
    t = {"q8_0": Q8_0, "q4_1": Q4_1}[ap.parse_args().type]
    raw = weights(t)
    generic = Dim("T", 1, 16)
    for label, T, m in [("one-column kernel, 1 column", 1, 1)] + [(f"generic kernel, {m} columns", generic, m)
                                                                   for m in (1, 2, 4, 8)]:
        g, mm, kern = kernel(t, T)
        x = np.random.default_rng(1).standard_normal((m, K)).astype(np.float32)
        act = to_bytes(quantize_activation(x, WEIGHT_TYPES[t].act_type))
        out = np.zeros((m, N), np.float32)
        sizes = None if T == 1 else {"T": m}
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            run_kernel(g, mm, out, [raw, act], 1, sizes, kern)
            times.append(time.perf_counter() - t0)
        best = min(times[1:])
        print(f"{WEIGHT_TYPES[t].name} {label}: {best * 1e3:.1f} ms, {raw.nbytes / best / 1e9:.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
