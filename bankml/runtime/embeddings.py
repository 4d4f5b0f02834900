"""Sentence embeddings as llama.cpp b11434 makes them: the final-norm rows of a prompt computed in
one micro-batch, pooled (build_pooling in llama-graph.cpp) and normalised (common_embd_normalize).

    m = bankml.load("model.gguf")
    v = embed(m, m.tokenize("Hello"), pooling="mean")          # one float32 vector, L2-normalised
    rows = embed(m, tokens, pooling="none")                    # each token's row, as they are

Pooling: "mean" is ggml_mul_mat(cont(transpose(rows)), inp_mean), one column of 1/n (n < 2 columns:
no tinyBLAS), so each dimension is ggml_vec_dot_f32 over the tokens (bankml/numerics/vec.py, its AVX2
order); "cls" the first token's row, "last" the last's; "none" every row, not normalised.
"""
from __future__ import annotations

import math

import numpy as np

from bankml.errors import BankmlError
from bankml.numerics.vec import vec_dot_f32

POOLINGS = ("none", "mean", "cls", "last")
F32 = np.float32


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
