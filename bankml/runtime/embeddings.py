"""Sentence embeddings as llama.cpp b11434 makes them: the final-norm rows of a prompt computed in
one micro-batch, pooled (build_pooling in llama-graph.cpp) and normalised (common_embd_normalize).

    m = bankml.load("model.gguf")
    v = embed(m, m.tokenize("Hello"), pooling="mean")          # one float32 vector, L2-normalised
    rows = embed(m, tokens, pooling="none")                    # each token's row, as they are

Pooling: "mean" is ggml_mul_mat(cont(transpose(rows)), inp_mean), one column of 1/n (n < 2 columns:
no tinyBLAS), so each dimension is ggml_vec_dot_f32 over the tokens (vec_dot_f32 below, its AVX2
order); "cls" the first token's row, "last" the last's; "none" every row, not normalised.
"""
from __future__ import annotations

import math

import numpy as np

from bankml.errors import BankmlError
from bankml.numerics.floats import fma

POOLINGS = ("none", "mean", "cls", "last")
F32 = np.float32


def vec_dot_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 (ggml-cpu/vec.cpp, GGML_SIMD on AVX2) of each row of x with y, in the order
    of the haswell binary (objdump): four 8-lane FMA accumulators over steps of 32, reduced (0+2,
    1+3, then the two, the 128-bit halves, two hadds); the leftovers as GCC vectorized their loop:
    blocks of 8, then one of 4, of rounded products added one by one, then the last (at most 3)
    as scalar FMAs."""
    rows, n = x.shape
    full = n & ~31
    acc = np.zeros((rows, 4, 8), F32)
    for i in range(0, full, 32):
        acc = fma(x[:, i:i + 32].reshape(rows, 4, 8), y[i:i + 32].reshape(4, 8), acc)
    v = (acc[:, 0] + acc[:, 2]) + (acc[:, 1] + acc[:, 3])
    t0 = v[:, 4:] + v[:, :4]
    s = (t0[:, 0] + t0[:, 1]) + (t0[:, 2] + t0[:, 3])
    i, left = full, n - full
    if left >= 8:                                   # the vectorized leftover loop: blocks of 8
        for _ in range(left // 8):
            p = x[:, i:i + 8] * y[i:i + 8]
            for k in range(8):
                s = s + p[:, k]
            i += 8
        left %= 8
    if left >= 4:                                   # its epilogue: one block of 4
        p = x[:, i:i + 4] * y[i:i + 4]
        for k in range(4):
            s = s + p[:, k]
        i, left = i + 4, left - 4
    for k in range(i, n):                           # the scalar tail: vfmadd231ss
        s = fma(x[:, k], y[k], s)
    return np.asarray(s, F32)


def pool(rows: np.ndarray, pooling: str) -> np.ndarray:
    """One sequence's rows [n_tokens, n_embd] pooled: [n_embd] (or the rows, for "none")."""
    if pooling == "none":
        return rows
    if pooling == "cls":
        return rows[0]
    if pooling == "last":
        return rows[-1]
    n = rows.shape[0]
    div = np.full(n, F32(1.0) / F32(n), F32)               # inp_mean: 1.0f/float(sum)
    return vec_dot_f32(np.ascontiguousarray(rows.T), div)


def normalize(v: np.ndarray, embd_norm: int = 2) -> np.ndarray:
    """common_embd_normalize: -1 none, 0 max-abs to an int16 range, 2 euclidean, p > 2 the p-norm;
    the sum in double, the scale (1.0/sum) rounded to float, each element times it in float."""
    x = [float(t) for t in v]
    if embd_norm == -1:
        total = 1.0
    elif embd_norm == 0:
        total = 0.0
        for t in x:
            total = max(total, abs(t))
        total /= 32760.0
    elif embd_norm == 2:
        total = 0.0
        for t in v * v:                                         # inp[i]*inp[i]: a float product
            total += float(t)
        total = math.sqrt(total)
    else:
        total = 0.0
        for t in x:
            total += math.pow(abs(t), embd_norm)
        total = math.pow(total, 1.0 / embd_norm)
    norm = F32(1.0 / total) if total > 0.0 else F32(0.0)
    return (v * norm).astype(F32)


def embed(model, tokens: list[int], pooling: str = "mean", embd_norm: int = 2, session=None) -> np.ndarray:
    """The prompt's embedding (a fresh session, or `session` emptied first): pooled and normalised,
    or for "none" each token's row. The prompt must fit one micro-batch, as llama-server requires,
    but for "last" pooling, whose prompt may be split (server_slot::can_split)."""
    if pooling not in POOLINGS:
        raise BankmlError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if not tokens:
        raise BankmlError("Input content cannot be empty")
    if len(tokens) > model.n_ubatch and pooling != "last":
        raise BankmlError(f"input ({len(tokens)} tokens) is too large to process. increase the physical batch "
                          f"size (current batch size: {model.n_ubatch})")
    s = session or model.session()
    s.truncate(0)
    rows = s.embeddings(tokens)
    if pooling == "none":
        return rows
    return normalize(pool(rows, pooling), embd_norm)
