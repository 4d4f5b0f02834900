"""plan(): what bankml builds for a GGUF, decided from its header alone, or a refusal.

Mirrors llama.cpp b11434: src/llama-model.cpp `llama_model_base::load_hparams` (the keys every
architecture reads, here), then the registered architecture's own declaration
(bankml/arch/registry.py: its keys, tensors, refusals, as src/models/<arch>.cpp's
`load_arch_hparams` and `load_arch_tensors`),
the rope/yarn defaults of src/llama-context.cpp's `llama_context` constructor (default
context params), and the loader's rule that every tensor in the file is used. Anything the
graph would not reproduce, or a vocabulary bankml's tokenizer cannot load, raises `ModelRefused`
naming the key or tensor, before any weight byte is read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bankml.arch import registry
from bankml.errors import ModelRefused
from bankml.gguf.reader import GGUF_ARRAY, GGUF_FLOAT32, GGUF_INT32, GGUF_STRING, GGUF_UINT32, GGUFFile, ggml_type_name
from bankml.quants import F32, WEIGHT_TYPES
from bankml.tokenizer import vocab_refusal

MATRIX_TYPES = tuple(WEIGHT_TYPES)   # bankml's weight types (bankml/quants), any per tensor
HEAD_DIM_STEP = 8          # head sizes bankml takes: multiples of 8 (ggml-cpu takes any; see _hparams)
ROPE_SCALING_TYPES = ("none", "linear", "yarn")  # llama.cpp also knows longrope: refused
GGUF_BOOL = 7
GGUF_TYPE_NAMES = {GGUF_UINT32: "u32", GGUF_INT32: "i32", GGUF_FLOAT32: "f32", GGUF_BOOL: "bool", GGUF_STRING: "str"}
LLAMA_MAX_LAYERS = 512


@dataclass(frozen=True)
class HParams:
    """The numbers the graph uses, as llama.cpp holds them after creating a default context.

    llama.cpp reads no yarn_* key, rope.scaling.yarn_log_multiplier nor attention.scale for
    llama and qwen3, so those keep its defaults here even when the file has them.
    """
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int             # attention.key_length (= value_length)
    n_ff: int
    n_ctx_train: int
    rms_eps: float
    rope_type: str            # "norm" (llama) | "neox" (qwen3)
    rope_freq_base: float
    rope_freq_scale: float    # cparams.rope_freq_scale: 1/factor, 1 for scaling type "none"
    rope_scaling_type: str    # "none" | "linear" | "yarn"; llama.cpp's default is "linear"
    yarn_orig_ctx: int        # cparams.n_ctx_orig_yarn
    yarn_ext_factor: float    # cparams.yarn_ext_factor: 1 for yarn, else 0
    yarn_attn_factor: float   # cparams.yarn_attn_factor (the attn_factor given to rope)
    yarn_beta_fast: float
    yarn_beta_slow: float
    yarn_log_multiplier: float
    rope_attn_factor: float   # rope.scaling.attn_factor, default 1
    attention_scale: float    # f_attention_scale; 0 means 1/sqrt(head_dim)
    tied: bool                # no output.weight: logits use token_embd.weight
    n_swa: int = 0            # sliding window (llama_hparams::n_swa); 0: no SWA layer
    swa_layers: tuple[bool, ...] = ()  # per layer: attends through the sliding-window cache (is_swa)
    rope_freq_base_swa: float = 10000.0  # rope_freq_base_train_swa: the sliding-window layers' rope base
    rope_freq_scale_swa: float = 1.0     # rope_freq_scale_train_swa
    n_rot: int = 0            # rope.dimension_count: the dims of a head rope rotates (0: the whole head)
    recurrent_layers: tuple[bool, ...] = ()  # per layer: a recurrent layer (hparams.is_recr): states, no K/V cells
    extra: dict = field(default_factory=dict, compare=False)  # the architecture's own keys and derived values

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def is_recr(self, il: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    def n_layer_kv(self) -> int:
        """The layers with K/V cells (the attention layers of a hybrid model)."""
        return self.n_layer - sum(self.recurrent_layers)

    def get_rope_freq_base(self, il: int) -> float:
        """llama_model::get_rope_freq_base: a sliding-window layer's own base, else the context's."""
        return self.rope_freq_base_swa if self.is_swa(il) else self.rope_freq_base

    def get_rope_freq_scale(self, il: int) -> float:
        """llama_model::get_rope_freq_scale."""
        return self.rope_freq_scale_swa if self.is_swa(il) else self.rope_freq_scale


@dataclass(frozen=True)
class Plan:
    arch: str
    hparams: HParams
    weight_types: dict[str, int]  # tensor name -> ggml type, file order
    logits_matrix: str            # "output.weight" or "token_embd.weight" when tied
    matrix_type: int              # the most common type of the matrices (llama.cpp's guessed file type)
    matrix_types: tuple[int, ...] = ()  # every type of the matrices, most common first (each tensor has its own)


def plan(gguf: GGUFFile, arch: str | None = None) -> Plan:
    """Decide the graph from the header (`load_hparams` + `load_arch_tensors`), or refuse.

    `arch` plans the file as another registered architecture (its keys are still read under
    the file's general.architecture prefix): a user's declaration run on a known file."""
    keys = _Keys(gguf)
    file_arch = keys.text("general.architecture", required=True)
    spec = registry.lookup(arch or file_arch)
    if spec is None or spec.tensors is None:
        raise keys.refuse(f"general.architecture is {arch or file_arch!r}; bankml reproduces "
                          f"{', '.join(registry.plannable())} (bankml.arch.registry registers more)")
    hp = _hparams(keys, file_arch, spec, tied="output.weight" not in gguf.tensors)
    expected = spec.tensors(hp)
    _check_tensor_names(gguf, keys, spec, expected)
    _check_shapes(gguf, keys, expected)
    matrix_types = _check_types(gguf, keys, expected)
    why = vocab_refusal(gguf.metadata, gguf.value_types)
    if why:
        raise keys.refuse(why)
    return Plan(spec.name, hp, {t.name: t.ggml_type for t in gguf.tensors.values()},
                "token_embd.weight" if hp.tied else "output.weight", matrix_types[0], matrix_types)


class _Keys:
    """Typed metadata access with llama.cpp's strict type check (`GGUFMeta::GKV::validate_type`)."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf

    def refuse(self, why: str) -> ModelRefused:
        return ModelRefused(f"{self.gguf.path}: {why}")

    def _get(self, key: str, gtypes: tuple[int, ...], required: bool) -> Any:
        if key not in self.gguf.metadata:
            if required:
                raise self.refuse(f"key {key} is missing; llama.cpp requires it")
            return None
        vtype = self.gguf.value_types[key]
        if vtype[0] not in gtypes:
            got = "array" if vtype[0] == GGUF_ARRAY else GGUF_TYPE_NAMES.get(vtype[0], f"type {vtype[0]}")
            raise self.refuse(f"key {key} is {got}, expected {GGUF_TYPE_NAMES[gtypes[0]]}")
        return self.gguf.metadata[key]

    def text(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        value = self._get(key, (GGUF_STRING,), required)
        return default if value is None else value

    def u32(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        value = self._get(key, (GGUF_UINT32,), required)
        return default if value is None else int(value)

    def f32(self, key: str, default: float | None = None, required: bool = False) -> float | None:
        value = self._get(key, (GGUF_FLOAT32,), required)
        return default if value is None else float(value)

    def boolean(self, key: str, default: bool | None = None, required: bool = False) -> bool | None:
        value = self._get(key, (GGUF_BOOL,), required)
        return default if value is None else bool(value)

    def declared(self, key: str, k: "registry.Key") -> Any:
        """A key as an architecture declares it (registry.Key)."""
        if k.type == "u32_or_array":
            return self.u32_or_array(key, k.default, k.required)
        read = {"u32": self.u32, "f32": self.f32, "str": self.text, "bool": self.boolean}[k.type]
        return read(key, k.default, k.required)

    def u32_or_array(self, key: str, default: Any = None, required: bool = False) -> Any:
        """`get_arr` or `get_key`: a per-layer array of integers/bools (a tuple), or one u32."""
        if key in self.gguf.metadata and self.gguf.value_types[key][0] == GGUF_ARRAY:
            if self.gguf.value_types[key][1] not in (GGUF_UINT32, GGUF_INT32, GGUF_BOOL):
                raise self.refuse(f"key {key} must be u32 or an array of integers")
            return tuple(int(v) for v in self.gguf.metadata[key])
        return self.u32(key, default, required)

    def u32_per_layer(self, key: str, n_layer: int, required: bool = False) -> int | None:
        """`get_key_or_arr`: one u32, or one per layer (all equal here, or refused)."""
        if key not in self.gguf.metadata or self.gguf.value_types[key][0] != GGUF_ARRAY:
            return self.u32(key, required=required)
        values = self.gguf.metadata[key]
        if self.gguf.value_types[key][1] not in (GGUF_UINT32, GGUF_INT32) or len(values) != n_layer:
            raise self.refuse(f"key {key} must be u32 or an array of {n_layer} integers")
        if len(set(int(v) for v in values)) != 1:
            raise self.refuse(f"key {key} differs between layers; bankml needs one value for all layers")
        return int(values[0])


def _hparams(keys: _Keys, arch: str, spec: "registry.Architecture", tied: bool) -> HParams:
    """`llama_model_base::load_hparams` (the keys of every architecture), the context's rope
    defaults, then the architecture's declared keys and `derive` (its `load_arch_hparams`)."""
    k = lambda name: f"{arch}.{name}"  # noqa: E731
    n_ctx_train = keys.u32(k("context_length"), required=True)
    n_embd = keys.u32(k("embedding_length"), required=True)
    n_layer = keys.u32(k("block_count"), required=True)
    if not 0 < n_layer <= LLAMA_MAX_LAYERS:
        raise keys.refuse(f"key {k('block_count')} is {n_layer}; llama.cpp needs 1..{LLAMA_MAX_LAYERS}")
    n_expert = keys.u32(k("expert_count"), 0)
    if n_expert:
        raise keys.refuse(f"key {k('expert_count')} is {n_expert}: mixture-of-experts is not reproduced by bankml")
    n_ff = keys.u32_per_layer(k("feed_forward_length"), n_layer, required=True)
    n_head = keys.u32_per_layer(k("attention.head_count"), n_layer, required=True)
    n_head_kv = keys.u32_per_layer(k("attention.head_count_kv"), n_layer)
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    if n_ff == 0:
        raise keys.refuse(f"key {k('feed_forward_length')} is 0; bankml needs a feed-forward block")
    if n_head == 0 or n_head_kv == 0 or n_head % n_head_kv:
        raise keys.refuse(f"{n_head} heads over {n_head_kv} K/V heads: needs n_head a multiple of n_head_kv")
    head_dim = keys.u32(k("attention.key_length"), n_embd // n_head)
    head_dim_v = keys.u32(k("attention.value_length"), n_embd // n_head)
    n_rot = keys.u32(k("rope.dimension_count"), head_dim)
    if head_dim_v != head_dim:
        raise keys.refuse(f"key {k('attention.value_length')} is {head_dim_v}, key_length is {head_dim}: "
                          "they must be equal")
    if n_rot != head_dim and not spec.partial_rope:
        raise keys.refuse(f"key {k('rope.dimension_count')} is {n_rot}, head size is {head_dim}: "
                          "partial rope is not reproduced by bankml")
    if head_dim == 0 or head_dim % HEAD_DIM_STEP:
        # ggml-cpu's flash attention, rope and rms_norm take any head size, their leftover loops
        # in the vector loops' float order (vec_dot_f16's f64 tail past D % 32, vec_mad_f16's
        # contracted fma); bankml's llvm kernels hold Q, K, V rows in 8-lane vectors
        raise keys.refuse(f"head size {head_dim} (key {k('attention.key_length')} or n_embd/n_head) "
                          f"is not a multiple of {HEAD_DIM_STEP}; bankml's attention kernels need one")
    tokens = keys.gguf.metadata.get("tokenizer.ggml.tokens")
    if keys.gguf.value_types.get("tokenizer.ggml.tokens") != (GGUF_ARRAY, GGUF_STRING) or not tokens:
        raise keys.refuse("key tokenizer.ggml.tokens is missing, empty or not a string array; it gives n_vocab")
    rope = _rope(keys, arch, n_ctx_train)
    hp = HParams(
        n_vocab=len(tokens), n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_ff=n_ff, n_ctx_train=n_ctx_train, n_rot=n_rot,
        rms_eps=keys.f32(k("attention.layer_norm_rms_epsilon"), required=True),
        rope_type=spec.rope_type, attention_scale=0.0, tied=tied, **rope)
    hp.extra.update({key.name: keys.declared(k(key.name), key) for key in spec.keys})
    if spec.derive is not None:
        derived = spec.derive(hp, keys.refuse)
        fields = {n: v for n, v in derived.items() if n in HParams.__dataclass_fields__}
        hp = replace(hp, **fields, extra={**hp.extra, **{n: v for n, v in derived.items() if n not in fields}})
    return hp


def _rope(keys: _Keys, arch: str, n_ctx_train: int) -> dict[str, Any]:
    """rope keys (`load_hparams`) resolved as the `llama_context` constructor does."""
    k = lambda name: f"{arch}.rope.{name}"  # noqa: E731
    scaling = keys.text(k("scaling.type"), "linear")
    if scaling not in ROPE_SCALING_TYPES:
        raise keys.refuse(f"key {k('scaling.type')} is {scaling!r}; bankml reproduces "
                          f"{', '.join(ROPE_SCALING_TYPES)}")
    factor = keys.f32(k("scaling.factor"))
    if factor is None:
        factor = keys.f32(k("scale_linear"), 0.0)
    f32 = np.float32
    freq_scale = f32(1.0) if factor == 0.0 else f32(1.0) / f32(factor)
    if scaling == "none":
        freq_scale = f32(1.0)  # "never scale if scaling type is none"
    rope_attn_factor = f32(keys.f32(k("scaling.attn_factor"), 1.0))
    ext_factor = 1.0 if scaling == "yarn" else 0.0
    attn_factor = f32(1.0)
    if ext_factor != 0.0:
        from bankml.numerics.libm import logf  # glibc logf, as llama-context.cpp calls it
        scale = f32(1.0) / freq_scale
        log_scale = logf(np.array([scale], f32))[0]
        mscale = f32(1.0) if scale <= 1.0 else f32(0.1) * log_scale + f32(1.0)
        attn_factor = mscale * (f32(1.0) / (f32(1.0) + f32(0.1) * log_scale))
    orig_ctx = keys.u32(k("scaling.original_context_length"), n_ctx_train) or n_ctx_train
    return dict(rope_freq_base=keys.f32(k("freq_base"), 10000.0), rope_freq_scale=float(freq_scale),
                rope_scaling_type=scaling, yarn_orig_ctx=orig_ctx, yarn_ext_factor=ext_factor,
                yarn_attn_factor=float(attn_factor * rope_attn_factor), yarn_beta_fast=32.0,
                yarn_beta_slow=1.0, yarn_log_multiplier=0.0, rope_attn_factor=float(rope_attn_factor))


def _check_tensor_names(gguf: GGUFFile, keys: _Keys, spec: "registry.Architecture", expected: dict) -> None:
    """Every tensor used and every required one present (`done_getting_tensors`)."""
    arch = spec.name
    for name in gguf.tensors:
        if name in expected:
            continue
        why = next((why for pat, why in spec.refuse if re.search(pat, name)),
                   f"not used by the {arch} graph")
        raise keys.refuse(f"tensor {name}: {why}")
    for name in expected:
        if name not in gguf.tensors:
            raise keys.refuse(f"tensor {name} is missing; the {arch} graph needs it")


def _check_shapes(gguf: GGUFFile, keys: _Keys, expected: dict) -> None:
    """Shapes as `create_tensor` checks them (ne padded with 1s to 4 dims)."""
    pad = lambda s: tuple(s) + (1,) * (4 - len(s))  # noqa: E731
    for name, (shape, _) in expected.items():
        got = gguf.tensors[name].shape
        if pad(got) != pad(shape):
            raise keys.refuse(f"tensor {name} has shape {list(got)}, hparams give {list(shape)}")


def _check_types(gguf: GGUFFile, keys: _Keys, expected: dict) -> tuple[int, ...]:
    """Each matrix (embeddings and output too) one of bankml's weight types, whole blocks per row;
    F32 norms. Types mix per tensor as llama-quantize's mixes (Q4_K_M...) make them: every mul_mat
    quantizes its activation to its own weight's vec_dot type (passes/share_quantized_activations).
    Returns the matrices' types, most common first (ties in file order), as llama.cpp's
    `llama_model_loader` guesses the file type from the most common tensor type."""
    names = " ".join(map(ggml_type_name, MATRIX_TYPES))
    counts: dict[int, int] = {}
    for name, (shape, role) in expected.items():
        t = gguf.tensors[name]
        if role == "norm" and t.ggml_type != F32:
            raise keys.refuse(f"tensor {name} is {t.type_name}; norm weights must be F32")
        if role == "norm":
            continue
        if t.ggml_type not in MATRIX_TYPES:
            raise keys.refuse(f"tensor {name} is {t.type_name}; bankml supports {names}")
        block = WEIGHT_TYPES[t.ggml_type].block
        if shape[0] % block:
            raise keys.refuse(f"tensor {name} rows of {shape[0]} are not a multiple of the "
                              f"{t.type_name} block ({block})")
        counts[t.ggml_type] = counts.get(t.ggml_type, 0) + 1
    return tuple(sorted(counts, key=lambda t: -counts[t]))
