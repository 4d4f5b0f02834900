"""Architectures: one Python module each, registered with everything `plan()` needs.

An architecture declares, as llama.cpp's `llama_model_<arch>` does in src/models/<arch>.cpp:

- `keys`: the GGUF hyper-parameters its `load_arch_hparams` reads beyond the common ones
  (`llama_model_base::load_hparams`, read by plan() for every architecture), each required or
  optional with llama.cpp's default;
- `tensors(hp)`: the tensors its `load_arch_tensors` creates, with their shapes from the
  hyper-parameters and a role (matrix | embed | norm) that decides which weight types they
  may have;
- `refuse`: tensors llama.cpp could load for it that bankml does not reproduce, and why;
- `derive(hp, refuse)`: the hyper-parameters llama.cpp computes from the keys (a Q scale, the
  sliding-window layers and their rope base), refusing a value bankml does not reproduce; it
  returns a dict of HParams fields (typed, what the graph reads) and `extra` entries;
- `rope_type` (`llama_model_rope_type`) and `build`, the graph builder (the DSL, blocks.py);
- facts about the graph it builds: `ggml_layout`, its node counts in llama.cpp's graph (to name
  the Hadamard rotations of a quantized cache as ggml does), and `portable`, whether the
  portable profile runs it.

    register(Architecture("myarch", build_myarch, rope_type="neox", keys=(...), tensors=...))

or, for a builder alone that runs on another architecture's plan (`bankml.load(path, arch=...)`):

    @architecture("my_llama")
    def build_my_llama(b: Builder) -> None: ...

`plan()` accepts every registered architecture whose `tensors` is declared.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from bankml.errors import ModelRefused

BUILTIN = ("llama", "qwen3", "gemma3", "qwen35")      # modules of bankml.arch that register themselves


@dataclass(frozen=True)
class Key:
    """A GGUF key `"{arch}.{name}"` as `ml.get_key` reads it."""
    name: str                 # after the architecture prefix: "attention.sliding_window"
    type: str = "u32"         # "u32" | "f32" | "str" | "bool" | "u32_or_array" (one u32 or a per-layer array)
    default: Any = None       # llama.cpp's value when the key is absent (None: absent stays None)
    required: bool = False    # get_key(..., required = true): a missing key refuses the file


# tensor name -> (ne shape, role); role "matrix" (a layer matrix), "embed" (token_embd/output), "norm" (F32)
TensorTable = dict[str, tuple[tuple[int, ...], str]]


@dataclass(frozen=True)
class Architecture:
    name: str
    build: Callable                                   # build(b: Builder) -> None
    rope_type: str = "norm"                           # "norm" | "neox" | "imrope" (llama_model_rope_type)
    partial_rope: bool = False                        # rope turns hp.n_rot dims of a head; else plan refuses n_rot != head size
    keys: tuple[Key, ...] = ()
    tensors: Callable[[Any], TensorTable] | None = None
    refuse: tuple[tuple[str, str], ...] = ()          # (tensor name regex, why)
    derive: Callable[[Any, Callable[[str], Exception]], dict] | None = None
    # llama.cpp's nodes of a layer (src/models/<arch>.cpp): up to Q's rope, and K's chain (mul_mat ..
    # rope); blocks.py counts build_attn's from them to name the Hadamard nodes "node_<index>" as
    # ggml does. None: those nodes stay unnamed.
    ggml_layout: tuple[int, int] | None = None
    portable: bool = False                            # the portable profile runs this graph (docs/PORTABLE.md)
    doc: str = field(default="", compare=False)


ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    ARCHITECTURES[arch.name] = arch
    return arch


def architecture(name: str, **declared) -> Callable:
    """Decorator registering a builder function as `Architecture(name, fn, **declared)`."""
    def wrap(fn: Callable) -> Callable:
        register(Architecture(name, fn, **declared))
        return fn
    return wrap


def _load_builtins() -> None:
    for mod in BUILTIN:
        importlib.import_module(f"bankml.arch.{mod}")


def lookup(name: str) -> Architecture | None:
    """The registered architecture of that name, or None."""
    _load_builtins()
    return ARCHITECTURES.get(name)


def plannable() -> list[str]:
    """Architectures plan() accepts (those that declare their tensors): the built-in ones in BUILTIN's
    order (whichever module was imported first), then those registered from outside."""
    _load_builtins()
    names = [n for n in BUILTIN if n in ARCHITECTURES] + [n for n in ARCHITECTURES if n not in BUILTIN]
    return [n for n in names if ARCHITECTURES[n].tensors is not None]


def get(name: str) -> Architecture:
    """The registered architecture of that name, or ModelRefused listing those known."""
    a = lookup(name)
    if a is None:
        raise ModelRefused(f"architecture {name!r} has no graph builder; known: {', '.join(ARCHITECTURES)}")
    return a


def portable() -> list[str]:
    """Architectures whose graphs the portable profile runs, by name (not by import order)."""
    _load_builtins()
    return sorted(n for n, a in ARCHITECTURES.items() if a.portable)


# ---- shared tensor tables (llama.cpp's create_tensor_qkv and the dense FFN) -------------------

def llama_tensors(hp, layer_extra: Callable[[int], dict] | None = None) -> TensorTable:
    """token_embd, output_norm, output (unless tied) and per layer attn_norm, q/k/v/o, ffn_norm,
    gate/up/down, as llm_build_llama's load_arch_tensors creates them; `layer_extra(il)` adds
    {part: (shape, role)} for an architecture's own layer tensors."""
    q, kv = hp.head_dim * hp.n_head, hp.head_dim * hp.n_head_kv
    out: TensorTable = {"token_embd.weight": ((hp.n_embd, hp.n_vocab), "embed"),
                        "output_norm.weight": ((hp.n_embd,), "norm")}
    if not hp.tied:
        out["output.weight"] = ((hp.n_embd, hp.n_vocab), "embed")
    for il in range(hp.n_layer):
        parts = {"attn_norm": ((hp.n_embd,), "norm"), "attn_q": ((hp.n_embd, q), "matrix"),
                 "attn_k": ((hp.n_embd, kv), "matrix"), "attn_v": ((hp.n_embd, kv), "matrix"),
                 "attn_output": ((q, hp.n_embd), "matrix"), "ffn_norm": ((hp.n_embd,), "norm"),
                 "ffn_gate": ((hp.n_embd, hp.n_ff), "matrix"), "ffn_up": ((hp.n_embd, hp.n_ff), "matrix"),
                 "ffn_down": ((hp.n_ff, hp.n_embd), "matrix")}
        if layer_extra is not None:
            parts |= layer_extra(il)
        for part, spec in parts.items():
            out[f"blk.{il}.{part}.weight"] = spec
    return out


# Tensors llama.cpp may load for the llama family that bankml's graphs do not reproduce, and why.
COMMON_REFUSALS = (
    (r"\.bias$", "biases are not reproduced by bankml"),
    (r"^blk\.\d+\.attn_qkv\.", "fused QKV is not reproduced by bankml (needs attn_q/attn_k/attn_v)"),
    (r"^rope_freqs\.|rope_factors", "rope frequency factors (llama3 rope scaling) are not reproduced by bankml"),
    (r"_exps\.|_shexp\.|ffn_gate_inp\.", "mixture-of-experts is not reproduced by bankml"),
    (r"^cls\.", "classifier heads are not reproduced by bankml"),
)
