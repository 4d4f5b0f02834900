"""The whole llama/qwen3 graph in the portable profile on the reference backend (the spec).

Its bits do not depend on how a prompt is cut: every logits row of a prefill equals the row
the same position gets from a shorter prefill and decodes, and from any micro-batch size
(the attention reads the same padded cells). llama.cpp has neither property.
"""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml.testing import models

MODELS = ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "qwen3-small-f16", "qwen3-small-q1_0",
          "qwen3-small-q2_0", "qwen3-small-untied-q1_0", "llama-gqa-f16", "qwen35-small-f16", "qwen35-small-q8_0",
          "qwen35-small-q1_0", "qwen35-small-q2_0", "qwen35-small-q4_k_m", "llama-kq-q4_k_m", "llama-kq-q6_k",
          "smollm2-q5_0"]


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


@pytest.mark.parametrize("name", MODELS)
def test_prefill_rows_equal_decode_rows_and_any_micro_batch_cut(name):
    toks = _tokens(6, 1)
    with bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=256) as m:
        full = m.session().prefill(toks, outputs="all")
        s = m.session()
        rows = [s.prefill(toks[:3], outputs="all")] + [s.decode(t)[None] for t in toks[3:]]
        assert np.isfinite(full).all()
        assert np.array_equal(full.view(np.uint32), np.concatenate(rows).view(np.uint32))
    with bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=256, n_ubatch=4) as m:
        cut = m.session().prefill(toks, outputs="all")
        assert np.array_equal(full.view(np.uint32), cut.view(np.uint32))


def test_smollm2_portable_logits_pick_llama_cpps_next_tokens():
    """A sanity check of the graph (the measured bar is tests/oracle/test_portable_bar.py)."""
    path = models.path("smollm2-q4_1")
    with bankml.load(path, backend="llvm", threads=1, n_ctx=256) as g:
        ids = g.tokenize("The capital of France is Paris. The capital of Germany is Berlin. The capital of", True)
        want = g.session().prefill(ids, outputs="all")
    with bankml.load(path, backend="reference", profile="portable", n_ctx=256) as p:
        got = p.session().prefill(ids, outputs="all")
    agree = np.mean(np.argmax(got, -1) == np.argmax(want, -1))
    assert agree >= 0.8 and np.abs(got - want).max() < 3.0, (agree, np.abs(got - want).max())


def test_qwen35_portable_logits_pick_llama_cpps_next_tokens():
    """A sanity check of the Gated-DeltaNet graph in the portable profile: its rows pick the ggml
    profile's (llama.cpp's) next tokens on a random-weight Qwen3.5 (ggml's rows checked against
    llama.cpp in tests/oracle)."""
    toks = _tokens(24, 5)
    with bankml.load(models.path("qwen35-small-f16"), backend="reference", n_ctx=256) as g:
        want = g.session().prefill(toks, outputs="all")
    with bankml.load(models.path("qwen35-small-f16"), backend="reference", profile="portable", n_ctx=256) as p:
        got = p.session().prefill(toks, outputs="all")
        assert [n.op.value for n in p.graph(len(toks), 256, len(toks)).nodes.values() if n.name == "q_conv_predelta-0"] \
            == ["l2_norm"]
    agree = np.mean(np.argmax(got, -1) == np.argmax(want, -1))
    assert agree >= 0.8 and np.abs(got - want).max() < 0.1 * np.abs(want).max(), (agree, np.abs(got - want).max())


def test_decodes_across_256_and_512_cells_equal_one_prefills_rows():
    """The attention reads n_kv padded cells (256, 512, 768 here) and its bits do not depend on
    how many: blocks of masked cells add -0.0. One session decodes across 256 cells, prefills,
    then decodes across 512; every row equals the row of one 520-token prefill."""
    toks = _tokens(520, 2)
    with bankml.load(models.path("qwen3-small-q1_0"), backend="reference", profile="portable", n_ctx=1024) as m:
        full = m.session().prefill(toks, outputs="all")
        s = m.session()
        rows = [s.prefill(toks[:252], outputs="last")] + [s.decode(t)[None] for t in toks[252:260]]
        rows += [s.prefill(toks[260:510], outputs="last")] + [s.decode(t)[None] for t in toks[510:]]
        want = np.concatenate([full[251:260], full[509:]])
        assert np.array_equal(want.view(np.uint32), np.concatenate(rows).view(np.uint32))


@pytest.mark.parametrize("name,tensor,row,block,value,at", [
    ("qwen3-small-q1_0", "blk.1.ffn_up.weight", 2, 3, 0x7E00, 0),        # a NaN scale
    ("qwen3-small-q2_0", "blk.0.attn_q.weight", 5, 0, 0xFC00, 0),        # a -inf scale
    ("qwen3-small-f16", "blk.3.ffn_down.weight", 7, 11, 0x7C00, 0),      # an infinite f16 weight
    ("llama-kq-q4_k", "blk.0.attn_k.weight", 3, 1, 0x7E00, 2),           # Q4_K's dmin NaN
    ("llama-kq-q6_k", "blk.0.attn_output.weight", 1, 0, 0xFC00, 208),    # Q6_K's d -inf
    ("smollm2-q5_1", "blk.0.attn_k.weight", 4, 2, 0x7C00, 2),            # Q5_1's min inf
])
def test_a_weight_block_with_an_infinite_or_nan_scale_is_refused_by_the_portable_profile(
        tmp_path, name, tensor, row, block, value, at):
    """The decode-arithmetic document's Unreadable: refused at load, in one line naming the tensor,
    row and block; the ggml profile (llama.cpp reads such a file) still loads it."""
    import shutil
    from bankml.errors import BankmlError
    from bankml.gguf import read_gguf
    from bankml.quants import WEIGHT_TYPES
    src, bad = models.path(name), tmp_path / "bad.gguf"
    shutil.copy(src, bad)
    t = read_gguf(src).tensors[tensor]
    row_bytes = t.nbytes // int(np.prod(t.shape[1:]))
    block_bytes = WEIGHT_TYPES[t.ggml_type].block_bytes
    with open(bad, "r+b") as f:
        f.seek(t.offset + row * row_bytes + block * block_bytes + at)
        f.write(int(value).to_bytes(2, "little"))
    unit = "element" if name.endswith("f16") else "block"
    with pytest.raises(BankmlError, match=rf"^bad.gguf: tensor {tensor}, row {row}, {unit} {block}: an infinite or "
                                          r"NaN (scale|f16 weight): the portable profile cannot read it") as e:
        bankml.load(bad, backend="reference", profile="portable", n_ctx=256)
    assert "\n" not in str(e.value)
    bankml.load(bad, backend="reference", n_ctx=256).close()


def test_the_portable_profile_reads_every_weight_type_bankml_reads():
    """Every matrix format has an integer form (coded rows): nothing is refused for its type."""
    from bankml.profiles.portable import coded
    from bankml.quants import WEIGHT_TYPES
    assert all(coded.reads(t) for t in WEIGHT_TYPES), [w.name for t, w in WEIGHT_TYPES.items() if not coded.reads(t)]
