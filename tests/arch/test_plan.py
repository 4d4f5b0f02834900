"""plan(): llama.cpp's hparams and defaults from the header, and one refusal per unsupported feature."""
from __future__ import annotations

import numpy as np
import pytest
from gguf_fixtures import (ARRAY, BOOL, F16_T, F32, F32_T, I32, Q1_0_T, Q2_0_T, Q4_1_T, Q8_0_T, STR, U32, model_tensors,
                           real_models, write_model)

from bankml.errors import ModelRefused

Q5_0_T, Q4_K_T, Q6_K_T = 6, 12, 14
from bankml.gguf import GGUFFile, read_gguf
from bankml.arch.plan import plan
from bankml.testing import models

IQ4_NL_T, Q5_K_T = 20, 13


def planned(tmp_path, **kw):
    return plan(read_gguf(write_model(tmp_path / "m.gguf", **kw)))


def refused(tmp_path, *causes: str, **kw) -> str:
    """Plan a model that must be refused; the one-line message names every cause."""
    path = write_model(tmp_path / "m.gguf", **kw)
    with pytest.raises(ModelRefused) as err:
        plan(read_gguf(path))
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    for cause in causes:
        assert cause in msg
    return msg


def test_plans_tiny_llama_f16(tmp_path):
    p = planned(tmp_path)
    hp = p.hparams
    assert p.arch == "llama" and p.matrix_type == F16_T and p.logits_matrix == "output.weight"
    assert (hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv) == (32, 128, 2, 2, 1)
    assert (hp.head_dim, hp.n_ff) == (64, 256)
    assert hp.rope_type == "norm" and hp.rope_freq_base == 100000.0 and hp.n_ctx_train == 256
    assert hp.rms_eps == float(np.float32(1e-6)) and not hp.tied and hp.attention_scale == 0.0
    assert list(p.weight_types) == [name for name, _, _ in model_tensors()]
    assert p.weight_types["blk.0.attn_norm.weight"] == F32_T


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("mtype", [F16_T, Q8_0_T, Q4_1_T, Q1_0_T, Q2_0_T], ids=["F16", "Q8_0", "Q4_1", "Q1_0", "Q2_0"])
def test_plans_each_weight_type(tmp_path, arch, mtype):
    p = planned(tmp_path, arch=arch, mtype=mtype)
    assert p.matrix_type == mtype and p.hparams.rope_type == {"llama": "norm", "qwen3": "neox"}[arch]


def test_tied_model_takes_logits_from_token_embd(tmp_path):
    p = planned(tmp_path, arch="qwen3", tied=True)
    assert p.hparams.tied and p.logits_matrix == "token_embd.weight" and "output.weight" not in p.weight_types


@pytest.mark.parametrize("etype", [Q8_0_T, F16_T], ids=["Q8_0", "F16"])
def test_q4_1_layers_with_other_embeddings_like_smollm2(tmp_path, etype):
    p = planned(tmp_path, mtype=Q4_1_T, etype=etype, tied=True)
    assert p.matrix_type == Q4_1_T and p.weight_types["token_embd.weight"] == etype


def test_defaults_are_llama_cpps(tmp_path):
    gone = {"llama.rope.freq_base": None, "llama.attention.head_count_kv": None}
    hp = planned(tmp_path, kv_edit=gone, n_head_kv=2).hparams
    assert hp.rope_freq_base == 10000.0 and hp.n_head_kv == hp.n_head == 2
    assert hp.rope_scaling_type == "linear" and hp.rope_freq_scale == 1.0 and hp.yarn_orig_ctx == 256
    assert (hp.yarn_ext_factor, hp.yarn_attn_factor, hp.yarn_beta_fast, hp.yarn_beta_slow) == (0.0, 1.0, 32.0, 1.0)
    assert hp.yarn_log_multiplier == 0.0 and hp.rope_attn_factor == 1.0


def test_head_dim_from_key_length(tmp_path):
    hp = planned(tmp_path, arch="qwen3", n_embd=128, n_head=4, n_head_kv=2, head_dim=128,
                 kv_edit={"qwen3.attention.key_length": (U32, 128),
                          "qwen3.attention.value_length": (U32, 128)}).hparams
    assert hp.head_dim == 128


def test_head_dim_from_key_length_shapes_the_tensors(tmp_path):
    kv = {"qwen3.attention.key_length": (U32, 128), "qwen3.attention.value_length": (U32, 128)}
    refused(tmp_path, "tensor blk.0.attn_q.weight has shape [128, 128], hparams give [128, 256]",
            arch="qwen3", n_head=1, kv_edit=kv | {"qwen3.attention.head_count": (U32, 2)})


def test_linear_rope_scaling_factor(tmp_path):
    kv = {"llama.rope.scaling.type": (STR, "linear"), "llama.rope.scaling.factor": (F32, 4.0)}
    assert planned(tmp_path, kv_edit=kv).hparams.rope_freq_scale == 0.25


def test_rope_scale_linear_old_key(tmp_path):
    assert planned(tmp_path, kv_edit={"llama.rope.scale_linear": (F32, 2.0)}).hparams.rope_freq_scale == 0.5


def test_scaling_type_none_never_scales(tmp_path):
    kv = {"llama.rope.scaling.type": (STR, "none"), "llama.rope.scaling.factor": (F32, 4.0)}
    hp = planned(tmp_path, kv_edit=kv).hparams
    assert hp.rope_scaling_type == "none" and hp.rope_freq_scale == 1.0


def test_yarn_resolves_ext_and_attn_factor_like_llama_context(tmp_path):
    kv = {"qwen3.rope.scaling.type": (STR, "yarn"), "qwen3.rope.scaling.factor": (F32, 4.0),
          "qwen3.rope.scaling.original_context_length": (U32, 64), "qwen3.rope.scaling.attn_factor": (F32, 2.0)}
    hp = planned(tmp_path, arch="qwen3", kv_edit=kv).hparams
    assert hp.yarn_ext_factor == 1.0 and hp.rope_freq_scale == 0.25 and hp.yarn_orig_ctx == 64
    f32 = np.float32
    mscale = f32(0.1) * f32(np.log(4.0)) + f32(1.0)  # glibc logf(4) is the correctly rounded one
    assert hp.yarn_attn_factor == float(mscale * (f32(1.0) / mscale) * f32(2.0))


def test_yarn_keys_llama_cpp_ignores_keep_defaults(tmp_path):
    kv = {"llama.rope.scaling.yarn_beta_fast": (F32, 8.0), "llama.attention.scale": (F32, 0.5)}
    hp = planned(tmp_path, kv_edit=kv).hparams
    assert hp.yarn_beta_fast == 32.0 and hp.attention_scale == 0.0


# ---- refusals: each names its key or tensor and why ------------------------------------------

def test_refuses_other_architecture_from_header(tmp_path):
    refused(tmp_path, "general.architecture is 'gemma'; bankml reproduces llama, qwen3, gemma3, qwen35",
            kv_edit={"general.architecture": (STR, "gemma")})


def test_refuses_missing_architecture_from_header(tmp_path):
    refused(tmp_path, "key general.architecture is missing", kv_edit={"general.architecture": None})


def test_refuses_attn_q_bias_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.attn_q.bias: biases are not reproduced by bankml",
            add=[("blk.0.attn_q.bias", (128,), F32_T)])


def test_refuses_ffn_down_bias_from_header(tmp_path):
    refused(tmp_path, "tensor blk.1.ffn_down.bias: biases", add=[("blk.1.ffn_down.bias", (128,), F32_T)])


def test_refuses_fused_attn_qkv_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.attn_qkv.weight: fused QKV",
            drop=("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"),
            add=[("blk.0.attn_qkv.weight", (128, 256), F16_T)])


def test_refuses_expert_count_from_header(tmp_path):
    refused(tmp_path, "key llama.expert_count is 8: mixture-of-experts",
            kv_edit={"llama.expert_count": (U32, 8), "llama.expert_used_count": (U32, 2)})


def test_refuses_expert_tensors_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.ffn_gate_exps.weight: mixture-of-experts",
            add=[("blk.0.ffn_gate_exps.weight", (128, 256, 4), F16_T)])


def test_refuses_rope_freqs_from_header(tmp_path):
    refused(tmp_path, "tensor rope_freqs.weight: rope frequency factors", add=[("rope_freqs.weight", (32,), F32_T)])


def test_refuses_qk_norm_on_llama_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.attn_q_norm.weight: Q/K norms", add=[("blk.0.attn_q_norm.weight", (64,), F32_T)])


def test_refuses_unknown_tensor_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.layer_out_norm.weight: not used by the llama graph",
            add=[("blk.0.layer_out_norm.weight", (128,), F32_T)])


def test_refuses_missing_ffn_up_from_header(tmp_path):
    refused(tmp_path, "tensor blk.1.ffn_up.weight is missing", drop=("blk.1.ffn_up.weight",))


def test_refuses_missing_qwen3_k_norm_from_header(tmp_path):
    refused(tmp_path, "tensor blk.1.attn_k_norm.weight is missing", arch="qwen3", drop=("blk.1.attn_k_norm.weight",))


def test_refuses_missing_output_norm_from_header(tmp_path):
    refused(tmp_path, "tensor output_norm.weight is missing", drop=("output_norm.weight",))


@pytest.mark.parametrize("key", ["llama.block_count", "llama.context_length", "llama.embedding_length",
                                 "llama.attention.layer_norm_rms_epsilon", "llama.feed_forward_length",
                                 "llama.attention.head_count"])
def test_refuses_missing_required_key_from_header(tmp_path, key):
    refused(tmp_path, f"key {key} is missing", kv_edit={key: None})


def test_refuses_zero_kv_heads_from_header(tmp_path):
    refused(tmp_path, "2 heads over 0 K/V heads", kv_edit={"llama.attention.head_count_kv": (U32, 0)})


def test_refuses_key_of_wrong_type_from_header(tmp_path):
    refused(tmp_path, "key llama.block_count is f32, expected u32", kv_edit={"llama.block_count": (F32, 2.0)})


def test_refuses_zero_layers_from_header(tmp_path):
    refused(tmp_path, "key llama.block_count is 0", kv_edit={"llama.block_count": (U32, 0)})


def test_refuses_per_layer_head_counts_that_differ_from_header(tmp_path):
    refused(tmp_path, "key llama.attention.head_count differs between layers",
            kv_edit={"llama.attention.head_count": (ARRAY, (I32, [2, 4]))})


def test_accepts_per_layer_head_counts_that_agree(tmp_path):
    assert planned(tmp_path, kv_edit={"llama.attention.head_count": (ARRAY, (U32, [2, 2]))}).hparams.n_head == 2


def test_refuses_missing_token_list_from_header(tmp_path):
    refused(tmp_path, "key tokenizer.ggml.tokens is missing", kv_edit={"tokenizer.ggml.tokens": None})


@pytest.mark.parametrize("key,value,cause", [
    ("tokenizer.ggml.model", (STR, "t5"), "tokenizer.ggml.model is 't5' (Unigram); bankml implements gpt2"),
    ("tokenizer.ggml.model", (STR, "bert"), "tokenizer.ggml.model is 'bert' (WordPiece)"),
    ("tokenizer.ggml.model", None, "tokenizer.ggml.model is missing"),
    ("tokenizer.ggml.pre", (STR, "llama-bpe"), "tokenizer.ggml.pre is 'llama-bpe'; bankml implements the qwen2 smollm"),
    ("tokenizer.ggml.pre", None, "tokenizer.ggml.pre is missing (llama.cpp's 'default')"),
    ("tokenizer.ggml.merges", None, "key tokenizer.ggml.merges is missing"),
    ("tokenizer.ggml.merges", (ARRAY, (STR, [])), "key tokenizer.ggml.merges is empty or not an array of strings"),
    ("tokenizer.ggml.token_type", None, "key tokenizer.ggml.token_type is missing"),
    ("tokenizer.ggml.token_type", (ARRAY, (I32, [1] * 31)), "tokenizer.ggml.token_type has 31 entries for 32 tokens"),
    ("tokenizer.ggml.tokens", (ARRAY, (I32, [1] * 32)), "key tokenizer.ggml.tokens is missing, empty or not a string"),
], ids=["ugm", "wpm", "no_model", "llama3_pre", "no_pre", "no_merges", "empty_merges", "no_token_types",
        "short_token_types", "int_tokens"])
def test_refuses_vocabulary_the_tokenizer_cannot_load_from_header(tmp_path, key, value, cause):
    refused(tmp_path, cause, kv_edit={key: value})


@pytest.mark.parametrize("edit", [{"tokenizer.ggml.model": (STR, "t5")},
                                  {"tokenizer.ggml.pre": (STR, "llama-bpe")}], ids=["ugm", "llama3_pre"])
def test_info_and_load_refuse_an_unloadable_vocabulary_in_one_line(tmp_path, edit):
    import subprocess
    import sys

    import bankml
    path = write_model(tmp_path / "model.gguf", kv_edit=edit)
    key = next(iter(edit))
    r = subprocess.run([sys.executable, "-m", "bankml.cli", "info", str(path)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith(f"Error: {path}: {key} is ")
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
    with pytest.raises(ModelRefused, match=key):
        bankml.load(path)


def test_refuses_wrong_shape_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.attn_k.weight has shape [128, 128], hparams give [128, 64]",
            reshape={"blk.0.attn_k.weight": (128, 128)})


def test_refuses_token_embd_of_wrong_vocab_from_header(tmp_path):
    refused(tmp_path, "tensor token_embd.weight has shape [128, 33]", reshape={"token_embd.weight": (128, 33)})


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("head_dim", [80, 96, 112, 160, 192])
def test_plans_head_sizes_past_64_128_256(tmp_path, arch, head_dim):
    """Any multiple of 8, from n_embd / n_head as from key_length."""
    assert planned(tmp_path, arch=arch, n_embd=2 * head_dim, n_head=2).hparams.head_dim == head_dim
    keys = {f"{arch}.attention.key_length": (U32, head_dim), f"{arch}.attention.value_length": (U32, head_dim)}
    hp = planned(tmp_path, arch=arch, n_embd=128, n_head=2, head_dim=head_dim, kv_edit=keys).hparams
    assert hp.head_dim == head_dim


@pytest.mark.parametrize("n_embd,n_head", [(200, 2), (36, 1)])
def test_refuses_head_size_not_a_multiple_of_8_from_header(tmp_path, n_embd, n_head):
    refused(tmp_path, f"head size {n_embd // n_head}", "not a multiple of 8", n_embd=n_embd, n_head=n_head)


def test_refuses_value_length_unlike_key_length_from_header(tmp_path):
    refused(tmp_path, "key llama.attention.value_length is 128, key_length is 64",
            kv_edit={"llama.attention.value_length": (U32, 128)})


def test_refuses_partial_rope_from_header(tmp_path):
    refused(tmp_path, "key llama.rope.dimension_count is 32", kv_edit={"llama.rope.dimension_count": (U32, 32)})


def test_refuses_heads_not_a_multiple_of_kv_heads_from_header(tmp_path):
    refused(tmp_path, "4 heads over 3 K/V heads", n_embd=256, n_head=4, n_head_kv=3)


def test_refuses_longrope_from_header(tmp_path):
    refused(tmp_path, "key llama.rope.scaling.type is 'longrope'",
            kv_edit={"llama.rope.scaling.type": (STR, "longrope")})


def test_plans_matrix_types_mixed_per_tensor(tmp_path):
    """Real files mix types per tensor (llama-quantize's Q4_K_M...): each matrix keeps its own."""
    p = planned(tmp_path, retype={"blk.1.ffn_down.weight": Q8_0_T, "output.weight": Q4_1_T})
    assert p.weight_types["blk.1.ffn_down.weight"] == Q8_0_T and p.weight_types["blk.0.ffn_down.weight"] == F16_T
    assert p.matrix_type == F16_T and set(p.matrix_types) == {F16_T, Q8_0_T, Q4_1_T}


@pytest.mark.parametrize("mtype", [IQ4_NL_T, Q5_K_T], ids=["IQ4_NL", "Q5_K"])
def test_refuses_unsupported_matrix_type_from_header(tmp_path, mtype):
    name = {IQ4_NL_T: "IQ4_NL", Q5_K_T: "Q5_K"}[mtype]
    refused(tmp_path, f"is {name}; bankml supports F16 Q8_0 Q4_1 Q1_0 Q2_0 Q4_0 Q5_0 Q5_1 Q4_K Q6_K", mtype=mtype, n_ff=512, n_embd=256,
            n_head=4, n_head_kv=2, etype=F16_T)


def test_plans_q1_0_token_embd_with_q4_1_layers(tmp_path):
    p = planned(tmp_path, mtype=Q4_1_T, etype=Q1_0_T)
    assert p.matrix_type == Q4_1_T and p.weight_types["token_embd.weight"] == Q1_0_T


def test_refuses_f32_output_from_header(tmp_path):
    refused(tmp_path, "tensor output.weight is F32", retype={"output.weight": F32_T})


def test_refuses_f16_norm_from_header(tmp_path):
    refused(tmp_path, "tensor blk.0.attn_norm.weight is F16; norm weights must be F32",
            retype={"blk.0.attn_norm.weight": F16_T})


class Untouchable:
    """Stands in for the mapped file: any read of tensor bytes fails the test."""

    def __getitem__(self, _):
        raise AssertionError("plan() read tensor data")


REFUSED = {
    "bias": dict(add=[("blk.0.attn_q.bias", (128,), F32_T)]),
    "f16_norm": dict(retype={"blk.0.attn_norm.weight": F16_T}),
    "wrong_shape": dict(reshape={"blk.0.attn_k.weight": (128, 128)}),
    "other_arch": dict(kv_edit={"general.architecture": (STR, "gemma")}),
}


@pytest.mark.parametrize("case", [None, *REFUSED], ids=["accepted", *REFUSED])
def test_plan_never_reads_tensor_data(tmp_path, monkeypatch, case):
    g = read_gguf(write_model(tmp_path / "m.gguf", **REFUSED.get(case, {})))
    g._bytes = Untouchable()
    monkeypatch.setattr(GGUFFile, "tensor_data", lambda self, name: Untouchable()[name])
    if case is None:
        plan(g)
    else:
        with pytest.raises(ModelRefused):
            plan(g)


TYPE_IN_NAME = {"f16": F16_T, "q8_0": Q8_0_T, "q4_1": Q4_1_T, "q1_0": Q1_0_T, "q2_0": Q2_0_T,
                "q4_0": 2, "q5_0": 6, "q5_1": 7}


@pytest.mark.parametrize("path", real_models() or [None], ids=lambda p: p.name if p else "absent")
def test_plans_real_model(path):
    if path is None:
        pytest.skip("no real GGUF models found")
    p = plan(read_gguf(path))
    if path.stem.startswith("qwen35-small"):           # 3 Gated-DeltaNet layers, then attention
        x = p.hparams.extra
        assert p.arch == "qwen35" and p.hparams.recurrent_layers == (True, True, True, False)
        assert (x["ssm_d_state"], x["ssm_n_v_heads"], x["ssm_n_k_heads"], x["ssm_d_conv"]) == (32, 8, 4, 4)
        assert x["ssm_conv_channels"] == 512 and x["rope_sections"] == (3, 3, 2, 0) and p.hparams.n_rot == 16
    if path.name == "gemma3-270m-q4_k_m.gguf":       # 81 Q5_0, 27 Q4_K, 10 Q8_0, 9 Q6_K matrices
        assert p.arch == "gemma3" and p.matrix_types == (Q5_0_T, Q4_K_T, Q8_0_T, Q6_K_T)
        assert p.weight_types["blk.0.attn_v.weight"] == Q8_0_T and p.weight_types["blk.0.ffn_down.weight"] == Q6_K_T
    suffix = path.stem.rsplit("-", 1)[-1].rsplit(".", 1)[-1].lower()
    if suffix in TYPE_IN_NAME:
        assert p.matrix_type == TYPE_IN_NAME[suffix]
    if path.stem.startswith(("smollm2", "SmolLM2")):
        hp = p.hparams
        assert (p.arch, hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_ff) == (
            "llama", 49152, 576, 30, 9, 3, 1536)
        assert hp.head_dim == 64 and hp.rope_freq_base == 100000.0 and hp.tied
        assert p.logits_matrix == "token_embd.weight"


# ---- gemma3: its declared keys (llama_model_gemma3::load_arch_hparams) -------------------------

def test_gemma3_sliding_window_layers_follow_the_default_pattern_of_6(tmp_path):
    hp = planned(tmp_path, arch="gemma3", n_layer=13, tied=True,
                 kv_edit={"gemma3.attention.sliding_window": (U32, 512)}).hparams
    assert hp.n_swa == 512 and hp.rope_type == "neox"
    assert [il for il in range(13) if not hp.is_swa(il)] == [5, 11]
    assert hp.rope_freq_base_swa == 10000.0 and hp.rope_freq_base == 100000.0
    assert hp.attention_scale == float(np.float32(1) / np.sqrt(np.float32(64)))


def test_gemma3_pattern_key_and_swa_rope_base(tmp_path):
    kv = {"gemma3.attention.sliding_window": (U32, 64), "gemma3.attention.sliding_window_pattern": (U32, 2),
          "gemma3.rope.freq_base_swa": (F32, 5000.0)}
    hp = planned(tmp_path, arch="gemma3", n_layer=4, tied=True, kv_edit=kv).hparams
    assert hp.swa_layers == (True, False, True, False) and hp.rope_freq_base_swa == 5000.0
    assert [hp.get_rope_freq_base(il) for il in range(4)] == [5000.0, hp.rope_freq_base, 5000.0, hp.rope_freq_base]
    assert [hp.get_rope_freq_scale(il) for il in range(4)] == [1.0, hp.rope_freq_scale, 1.0, hp.rope_freq_scale]


def test_gemma3_pattern_as_a_per_layer_array(tmp_path):
    kv = {"gemma3.attention.sliding_window": (U32, 64),
          "gemma3.attention.sliding_window_pattern": (ARRAY, (BOOL, [False, True]))}
    assert planned(tmp_path, arch="gemma3", tied=True, kv_edit=kv).hparams.swa_layers == (False, True)


def test_gemma3_without_a_window_has_no_sliding_layers(tmp_path):
    hp = planned(tmp_path, arch="gemma3", tied=True).hparams
    assert hp.n_swa == 0 and not any(hp.is_swa(il) for il in range(hp.n_layer))


def test_refuses_gemma3_logit_softcapping_from_header(tmp_path):
    refused(tmp_path, "key gemma3.final_logit_softcapping is 30.0: logit softcapping (tanh) is not reproduced",
            arch="gemma3", tied=True, kv_edit={"gemma3.final_logit_softcapping": (F32, 30.0)})


def test_refuses_gemma3_without_post_norms_from_header(tmp_path):
    refused(tmp_path, "tensor blk.1.post_ffw_norm.weight is missing; the gemma3 graph needs it",
            arch="gemma3", tied=True, drop=("blk.1.post_ffw_norm.weight",))


def test_refuses_gemma3_dense_output_layers_from_header(tmp_path):
    refused(tmp_path, "tensor dense_2_out.weight: EmbeddingGemma's dense output layers", arch="gemma3", tied=True,
            add=[("dense_2_out.weight", (128, 256), F16_T)])


def test_refuses_gemma3_window_key_of_wrong_type_from_header(tmp_path):
    refused(tmp_path, "key gemma3.attention.sliding_window is f32, expected u32", arch="gemma3", tied=True,
            kv_edit={"gemma3.attention.sliding_window": (F32, 512.0)})


# ---- an architecture registered from outside the package ---------------------------------------

def test_a_registered_architecture_is_planned_from_its_declaration(tmp_path):
    """A user's declaration (keys, tensors, refusals) plans a file of that architecture name."""
    from bankml.arch import registry

    def tensors(hp):
        return registry.llama_tensors(hp, lambda il: {"layer_scale": ((hp.n_embd,), "norm")})

    registry.register(registry.Architecture(
        "myarch", build=lambda b: None, rope_type="neox", tensors=tensors,
        keys=(registry.Key("my.flag", "u32", default=3), registry.Key("my.needed", "f32", required=True)),
        refuse=((r"\.bias$", "myarch has no biases"),)))
    try:
        adds = [(f"blk.{il}.layer_scale.weight", (128,), F32_T) for il in range(2)]
        hp = planned(tmp_path, arch="myarch", add=adds, kv_edit={"myarch.my.needed": (F32, 0.5)}).hparams
        assert hp.rope_type == "neox" and hp.extra == {"my.flag": 3, "my.needed": 0.5}
        refused(tmp_path, "key myarch.my.needed is missing", arch="myarch", add=adds)
        refused(tmp_path, "tensor blk.0.layer_scale.weight is missing; the myarch graph needs it", arch="myarch",
                kv_edit={"myarch.my.needed": (F32, 0.5)})
        refused(tmp_path, "tensor blk.0.attn_q.bias: myarch has no biases", arch="myarch",
                add=adds + [("blk.0.attn_q.bias", (128,), F32_T)], kv_edit={"myarch.my.needed": (F32, 0.5)})
    finally:
        registry.ARCHITECTURES.pop("myarch")
