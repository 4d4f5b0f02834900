"""ActScaling PerBlock chosen by the graph: `load(profile="portable", act_scaling="PerBlock")`
quantizes each mul_mat's activation per the weight's own block (quant.quantize_blocks, m in
128..255) and rounds each weight block once (coded.dot_blocks); the attention quantizes each
query head as one block (attention.quantize_head). Every mul_mat of a session is
the document's dot under PerBlock of the input it read, its rows do not depend on how a prompt
is cut, and a matrix without a block (F16) is refused from the header, naming it."""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml.ir.ops import Op
from bankml.profiles.portable import coded, orders as po
from bankml.profiles.portable.quant import ActScaling
from bankml.testing import models

MODELS = ["smollm2-q4_1", "qwen3-small-q1_0", "qwen35-small-q1_0"]         # Q8_0, Q2_0: the llvm test below


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def _load(name: str, **kw):
    return bankml.load(models.path(name), backend="reference", profile="portable", act_scaling="PerBlock",
                       n_ctx=256, **kw)


@pytest.mark.parametrize("name", MODELS)
def test_per_block_rows_equal_decode_rows_and_any_micro_batch_cut(name):
    toks = _tokens(6, 2)
    with _load(name) as m:
        full = m.session().prefill(toks, outputs="all")
        s = m.session()
        rows = [s.prefill(toks[:3], outputs="all")] + [s.decode(t)[None] for t in toks[3:]]
        assert np.isfinite(full).all()
        assert np.array_equal(full.view(np.uint32), np.concatenate(rows).view(np.uint32))
    with _load(name, n_ubatch=4) as m:
        assert np.array_equal(full.view(np.uint32), m.session().prefill(toks, outputs="all").view(np.uint32))
    with bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=256) as m:
        sub32 = m.session().prefill(toks, outputs="all")
    assert not np.array_equal(full, sub32)                  # the scaling is the graph's, not a no-op


@pytest.mark.parametrize("name", ["smollm2-q4_1", "qwen3-small-q1_0"])
def test_every_mul_mat_is_the_documents_per_block_dot_of_its_input(name):
    """Each MUL_MAT's output (traced) is coded.dot(weight, type, x, PerBlock) of the f32 x its
    QUANTIZE read, and each QUANTIZE is per the block of the weight reading it."""
    toks = _tokens(5, 3)
    with _load(name) as m:
        s = m.session()
        seen = {}
        s.trace = lambda ub, n, v: seen.__setitem__(n.id, (n, np.array(v)))
        s.prefill(toks, outputs="all")
        g = m.graph(len(toks), 256, len(toks))               # the same graph, its nodes' ids
        muls = [n for n in g if n.op is Op.MUL_MAT and n.id in seen and g[n.inputs[1]].inputs[0] in seen]
        assert len(muls) > 10                                # the named ones (the trace's)
        for n in muls:
            w, q = g[n.inputs[0]], g[n.inputs[1]]
            wtype = int(w.params["ggml_type"])
            got, x = seen[n.id][1], seen[q.inputs[0]][1]
            assert seen[n.id][0].name == n.name
            want = coded.dot(m.weight(w.name), wtype, x.reshape(-1, x.shape[-1]), ActScaling.PER_BLOCK)
            assert np.array_equal(got.reshape(want.shape).view(np.uint32), want.view(np.uint32)), n.name
        assert [n.order for n in g if n.op is Op.FLASH_ATTN] == [po.FLASH_ATTN_BLOCKS] * m.hparams.n_layer
        for n in g:
            if n.op is Op.MUL_MAT:
                q = g[n.inputs[1]]
                assert n.order == po.MUL_MAT_BLOCKS and q.order == po.QUANTIZE_BLOCKS
                assert q.params["block"] == coded.block_of(int(g[n.inputs[0]].params["ggml_type"]))


def test_a_matrix_without_a_block_is_refused_from_the_header(monkeypatch):
    from bankml.runtime.model import Model

    def no_read(self, name):
        raise AssertionError(f"read {name}")
    monkeypatch.setattr(Model, "weight", no_read)
    with pytest.raises(bankml.BankmlError, match=r"^smollm2-f16.gguf: tensor blk.0.attn_q.weight is F16: ActScaling "
                                                 r"PerBlock reads block formats") as e:
        _load("smollm2-f16")
    assert "\n" not in str(e.value)


def test_act_scaling_is_checked_with_the_options():
    with pytest.raises(bankml.BankmlError, match="unknown act_scaling 'Sub16'"):
        bankml.load(models.path("smollm2-q4_1"), profile="portable", act_scaling="Sub16")
    with pytest.raises(bankml.BankmlError, match="act_scaling PerBlock is the portable profile's"):
        bankml.load(models.path("smollm2-q4_1"), act_scaling="PerBlock")


@pytest.mark.parametrize("chunk", [1, 2, 7, None])
def test_dot_blocks_rows_do_not_depend_on_the_chunk(chunk):
    """dot_blocks takes weight rows in chunks (bounded temporaries): any chunk gives every row of
    the unchunked terms rounded per weight block."""
    from bankml.profiles.portable.quant import quantize_blocks, round_groups
    from bankml.quants import Q4_1, WEIGHT_TYPES
    rng = np.random.default_rng(0)
    mod = WEIGHT_TYPES[Q4_1]
    raw = rng.integers(0, 256, (9, 2 * 3 * mod.block_bytes)).astype(np.uint8)
    blocks = raw.reshape(9, -1, mod.block_bytes)
    for at in (0, 2):                                        # d and the min: finite f16 values
        blocks[:, :, at:at + 2] = rng.standard_normal(blocks.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    x = rng.standard_normal((3, 192)).astype(np.float32)
    a = quantize_blocks(x, coded.block_of(Q4_1))
    p, e = coded._block_terms(coded.coded_rows(raw, Q4_1, 192), a, 32)
    want = round_groups(p, e, a.bad[:, None, :], 1)
    assert np.array_equal(coded.dot_blocks(raw, Q4_1, a, rows_per_chunk=chunk).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(coded.dot(raw, Q4_1, x, ActScaling.PER_BLOCK).view(np.uint32), want.view(np.uint32))


# model -> tokens of the reference prefill (the llvm prompts are its prefixes)
LLVM_MODELS = {"smollm2-q4_1": 9, "smollm2-q8_0": 9, "smollm2-q2_0": 9, "qwen3-small-q1_0": 65,
               "qwen35-small-q1_0": 9}


@pytest.mark.parametrize("name", list(LLVM_MODELS))
def test_llvm_per_block_rows_equal_reference_rows_for_threads_1_2_3(name):
    """backends/llvm/portable/per_block.py in whole sessions: every logits row of the reference
    backend's prefill, from one llvm prefill and from prefixes of 1, 7 and 64 tokens ("all" and
    "last") with a decode after each."""
    n = LLVM_MODELS[name]
    toks = _tokens(n, 3)
    with _load(name) as m:
        want = m.session().prefill(toks, outputs="all").view(np.uint32)
    for threads in (1, 2, 3):
        with bankml.load(models.path(name), backend="llvm", threads=threads, profile="portable",
                         act_scaling="PerBlock", n_ctx=256) as m:
            assert np.array_equal(m.session().prefill(toks, outputs="all").view(np.uint32), want), threads
            for cut in (c for c in (1, 7, 64) if c < n):
                s = m.session()
                rows = s.prefill(toks[:cut], outputs="all" if cut % 2 else "last").reshape(-1, want.shape[-1])
                first = 0 if cut % 2 else cut - 1
                assert np.array_equal(rows.view(np.uint32), want[first:cut]), (threads, cut)
                assert np.array_equal(s.decode(toks[cut]).view(np.uint32), want[cut]), (threads, cut)


def test_cli_run_and_ir_take_act_scaling():
    """`bankml run --act-scaling PerBlock` gives the same tokens on llvm and reference, other
    tokens' logits than Sub32's; `bankml ir` shows the PerBlock orders; without the portable
    profile the flag is refused in one line."""
    import json

    from click.testing import CliRunner

    from bankml.cli import main
    path = str(models.path("qwen3-small-q1_0"))
    args = ["run", path, "--profile", "portable", "--act-scaling", "PerBlock", "-p", "The capital of", "--raw",
            "-n", "4", "--temp", "0", "--json"]
    out = {be: CliRunner().invoke(main, [*args, "--backend", be]) for be in ("llvm", "reference")}
    for be, r in out.items():
        assert r.exit_code == 0, (be, r.output)
    tokens = {be: json.loads(r.output.strip().splitlines()[-1])["tokens"] for be, r in out.items()}
    assert len(tokens["llvm"]) == 4 and tokens["llvm"] == tokens["reference"]
    r = CliRunner().invoke(main, ["ir", path, "--profile", "portable", "--act-scaling", "PerBlock", "--tokens", "2"])
    assert r.exit_code == 0, r.output
    assert "portable.quantize_blocks" in r.output and "portable.dot_blocks" in r.output
    assert "portable.attention_i8_per_block" in r.output
    assert "portable.group_dot" not in r.output
    r = CliRunner().invoke(main, ["run", path, "--act-scaling", "PerBlock", "-p", "x", "-n", "1"])
    assert r.exit_code != 0 and "act_scaling PerBlock is the portable profile's" in r.output
    assert "Traceback" not in r.output


def test_per_block_k_quant_and_q5_models_llvm_equals_reference():
    """Q4_K_M mixes (Q4_K, Q6_K and a Q5_0 fallback) and Q5_1 under PerBlock: every row of llvm at
    2 threads is the reference backend's, a prefill and a decode after it."""
    for name in ("qwen35-small-q4_k_m", "llama-kq-q4_k_m", "smollm2-q5_1"):
        toks = _tokens(7, 5)
        with _load(name) as m:
            want = m.session().prefill(toks, outputs="all").view(np.uint32)
        with bankml.load(models.path(name), backend="llvm", threads=2, profile="portable", act_scaling="PerBlock",
                         n_ctx=256) as m:
            s = m.session()
            rows = s.prefill(toks[:6], outputs="all")
            assert np.array_equal(rows.view(np.uint32), want[:6]), name
            assert np.array_equal(s.decode(toks[6]).view(np.uint32), want[6]), name
