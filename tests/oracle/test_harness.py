"""The reference harness itself: llama.cpp's facts that bankml's tests lean on."""
from __future__ import annotations

import numpy as np
import pytest

from bankml import oracle
from bankml.testing import models

pytestmark = pytest.mark.oracle


def tokens(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def test_same_call_twice_gives_same_sha256():
    m = models.path("smollm2-f16")
    t = tokens(9)
    assert oracle.sha256_rows(oracle.logits(m, t)) == oracle.sha256_rows(oracle.logits(m, t))


@pytest.mark.parametrize("name", ["smollm2-q8_0", "smollm2-q4_1", "qwen3-small-q1_0", "smollm2-q2_0",
                                  "qwen3-small-q2_0"])
def test_last_only_equals_last_of_all_for_quantized(name):
    m, t = models.path(name), tokens(7, 1)
    all_rows = oracle.logits(m, t, outputs="all")
    last = oracle.logits(m, t, outputs="last")
    assert all_rows.shape == (7, 49152) and last.shape == (1, 49152)
    assert oracle.sha256_rows(all_rows[-1:]) == oracle.sha256_rows(last)


@pytest.mark.parametrize("name", ["smollm2-f16", "llama-gqa-f16"])
def test_last_only_differs_from_all_for_f16(name):
    """One output row takes ggml_vec_dot_f16, several take llamafile's tinyBLAS."""
    m, t = models.path(name), tokens(7, 2)
    all_rows = oracle.logits(m, t, outputs="all")
    last = oracle.logits(m, t, outputs="last")
    assert oracle.sha256_rows(all_rows[-1:]) != oracle.sha256_rows(last)


def test_prepared_models_have_the_types_their_names_say():
    from bankml.gguf import read_gguf
    want = {"f16": 1, "q8_0": 8, "q4_1": 3, "q1_0": 41, "q2_0": 42, "q4_0": 2, "q5_0": 6, "q5_1": 7, "q4_k": 12, "q6_k": 14}
    for name in models.DEFAULT:
        f = read_gguf(models.path(name))
        typ = want[name.rsplit("-", 1)[1]]
        for t in f.tensors.values():
            if len(t.shape) < 2 or t.name.endswith("ssm_conv1d.weight"):
                assert t.ggml_type == 0, (name, t.name)          # norms (and Qwen3.5's conv kernels) stay F32
            elif name == "smollm2-q4_1" and t.name == "token_embd.weight":
                assert t.ggml_type == 8, t.name                  # as shipped: Q8_0 embeddings
            else:
                assert t.ggml_type == typ, (name, t.name, t.ggml_type)


def test_named_tensors_have_the_shapes_the_model_implies():
    m, n = models.path("qwen3-small-q1_0"), 5
    named = oracle.tensors(m, tokens(n, 3))
    embd, hd, nh, nkv, ff = 512, 128, 4, 2, 1536
    assert named["attn_norm-0"][-1].ne == (embd, n, 1, 1)
    assert [x.op for x in named["Qcur-0"]] == ["MUL_MAT", "RESHAPE", "ROPE"]
    assert named["Qcur-0"][-1].ne == (hd, nh, n, 1)
    assert named["Kcur-0"][-1].ne == (hd, nkv, n, 1)
    assert named["Qcur_normed-0"][-1].ne == (hd, nh, n, 1)
    assert named["kqv_out-0"][-1].ne == (hd * nh, n, 1, 1)
    assert named["ffn_swiglu-0"][-1].ne == (ff, n, 1, 1)
    assert named["l_out-3"][-1].ne == (embd, n, 1, 1)
    assert named["result_norm"][-1].ne == (embd, n, 1, 1)
    assert named["result_output"][-1].ne == (49152, n, 1, 1)
    assert named["result_output"][-1].array.dtype == np.float32
    rows = oracle.logits(m, tokens(n, 3))
    assert np.array_equal(named["result_output"][-1].array.reshape(n, -1).view(np.uint32), rows.view(np.uint32))


def test_micro_batches_are_numbered():
    named = oracle.tensors(models.path("qwen3-small-q1_0"), tokens(70, 4), n_ubatch=64, names=["l_out-0"])
    assert [(x.ubatch, x.ne[1]) for x in named["l_out-0"]] == [(0, 64), (1, 6)]


def test_decode_rows_depend_on_threads_only_from_512_padded_cells():
    """n_kv = max(256, pad256(cells)): up to 256 cells the rows agree for 2 and 3 threads;
    from 257 cells (512 padded) the split-KV kernel's chunks follow the thread count."""
    m, t = models.path("qwen3-small-q1_0"), tokens(300, 5)
    two = oracle.logits(m, t, threads=2, decode_from=240)
    three = oracle.logits(m, t, threads=3, decode_from=240)
    first_decode = 240                      # row index of the token at position 240
    for pos in range(240, 300):
        row = first_decode + (pos - 240)
        same = np.array_equal(two[row].view(np.uint32), three[row].view(np.uint32))
        if pos + 1 <= 256:
            assert same, pos
    assert not all(np.array_equal(two[r].view(np.uint32), three[r].view(np.uint32))
                   for r in range(first_decode + 16, len(two)))


def test_tokenize_round_trip_through_pieces():
    m = models.path("smollm2-q4_1")
    ids = oracle.tokenize(m, "Hello world", add_special=False)
    p = oracle.pieces(m)
    assert b"".join(p[i] for i in ids) == b"Hello world"
