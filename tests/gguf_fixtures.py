"""Small GGUF files as raw bytes: hostile headers, and tiny llama/qwen3 models of any ggml type.

Written by hand (struct.pack) rather than with gguf-py's GGUFWriter so that a test can put any
byte anywhere, and because gguf-py does not know ggml type 42 (Q2_0).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import gguf

from bankml.oracle.paths import cache_root

U8, U32, I32, F32, BOOL, STR, ARRAY, U64 = 0, 4, 5, 6, 7, 8, 9, 10
F16_T, Q4_1_T, Q8_0_T, Q1_0_T, Q2_0_T, F32_T = 1, 3, 8, 41, 42, 0
SIZES = {int(t): s for t, s in gguf.GGML_QUANT_SIZES.items()} | {42: (64, 18)}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def s(text: str | bytes) -> bytes:
    """A GGUF string: u64 length, then the bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v: Any) -> bytes:
    if vtype == STR:
        return s(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<iQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack(SCALAR[vtype], v)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return s(key) + struct.pack("<i", vtype) + value(vtype, v)


def nbytes(ne: tuple[int, ...], ggml_type: int) -> int:
    blck, size = SIZES[ggml_type]
    n = 1
    for d in ne:
        n *= d
    return n // blck * size


def tensor_info(name: str, ne: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    dims = struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne)
    return s(name) + dims + struct.pack("<iQ", ggml_type, offset)


def gguf_bytes(kvs: dict[str, tuple[int, Any]], tensors: list[tuple[str, tuple[int, ...], int]],
               version: int = 3, alignment: int = 32) -> bytes:
    """A well-formed GGUF: tensors packed in order, each padded to the alignment, zero data,
    the file ending where the last tensor's bytes end."""
    infos, offset, end = [], 0, 0
    for name, ne, ggml_type in tensors:
        infos.append(tensor_info(name, ne, ggml_type, offset))
        end = offset + nbytes(ne, ggml_type)
        offset += -(-nbytes(ne, ggml_type) // alignment) * alignment
    head = b"GGUF" + struct.pack("<IqQ", version, len(tensors), len(kvs))
    head += b"".join(kv(k, t, v) for k, (t, v) in kvs.items()) + b"".join(infos)
    if tensors:
        head += b"\0" * (-len(head) % alignment)
    return head + b"\0" * end


def model_kvs(arch: str = "llama", n_embd: int = 128, n_layer: int = 2, n_head: int = 2,
              n_head_kv: int = 1, n_ff: int = 256, n_vocab: int = 32) -> dict[str, tuple[int, Any]]:
    return {
        "general.architecture": (STR, arch),
        f"{arch}.context_length": (U32, 256),
        f"{arch}.embedding_length": (U32, n_embd),
        f"{arch}.block_count": (U32, n_layer),
        f"{arch}.feed_forward_length": (U32, n_ff),
        f"{arch}.attention.head_count": (U32, n_head),
        f"{arch}.attention.head_count_kv": (U32, n_head_kv),
        f"{arch}.attention.layer_norm_rms_epsilon": (F32, 1e-6),
        f"{arch}.rope.freq_base": (F32, 100000.0),
        "tokenizer.ggml.model": (STR, "gpt2"),
        "tokenizer.ggml.pre": (STR, "smollm"),
        "tokenizer.ggml.tokens": (ARRAY, (STR, [f"t{i}" for i in range(n_vocab)])),
        "tokenizer.ggml.token_type": (ARRAY, (I32, [1] * n_vocab)),
        "tokenizer.ggml.merges": (ARRAY, (STR, ["t 1"])),
    }


def model_tensors(arch: str = "llama", mtype: int = F16_T, etype: int | None = None, tied: bool = False,
                  n_embd: int = 128, n_layer: int = 2, n_head: int = 2, n_head_kv: int = 1,
                  n_ff: int = 256, n_vocab: int = 32,
                  head_dim: int | None = None) -> list[tuple[str, tuple[int, ...], int]]:
    """The tensors `load_arch_tensors` wants, in llama.cpp's usual file order."""
    etype = mtype if etype is None else etype
    hd = head_dim or n_embd // n_head
    out = [("token_embd.weight", (n_embd, n_vocab), etype), ("output_norm.weight", (n_embd,), F32_T)]
    if not tied:
        out.append(("output.weight", (n_embd, n_vocab), etype))
    for il in range(n_layer):
        b = f"blk.{il}."
        out += [(b + "attn_norm.weight", (n_embd,), F32_T),
                (b + "attn_q.weight", (n_embd, hd * n_head), mtype),
                (b + "attn_k.weight", (n_embd, hd * n_head_kv), mtype),
                (b + "attn_v.weight", (n_embd, hd * n_head_kv), mtype),
                (b + "attn_output.weight", (hd * n_head, n_embd), mtype)]
        if arch in ("qwen3", "gemma3"):
            out += [(b + "attn_q_norm.weight", (hd,), F32_T), (b + "attn_k_norm.weight", (hd,), F32_T)]
        if arch == "gemma3":
            out += [(b + "post_attention_norm.weight", (n_embd,), F32_T), (b + "post_ffw_norm.weight", (n_embd,), F32_T)]
        out += [(b + "ffn_norm.weight", (n_embd,), F32_T), (b + "ffn_gate.weight", (n_embd, n_ff), mtype),
                (b + "ffn_up.weight", (n_embd, n_ff), mtype), (b + "ffn_down.weight", (n_ff, n_embd), mtype)]
    return out


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def write_model(path: Path, arch: str = "llama", kv_edit: dict[str, tuple[int, Any] | None] | None = None,
                add: list[tuple[str, tuple[int, ...], int]] = (), drop: tuple[str, ...] = (),
                retype: dict[str, int] | None = None, reshape: dict[str, tuple[int, ...]] | None = None,
                **shape: Any) -> Path:
    """A tiny model; kv_edit sets (or with None deletes) keys, add/drop/retype/reshape edit tensors."""
    dims = {k: v for k, v in shape.items() if k in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab")}
    kvs = model_kvs(arch, **dims)
    for key, v in (kv_edit or {}).items():
        if v is None:
            kvs.pop(key, None)
        else:
            kvs[key] = v
    tensors = [t for t in model_tensors(arch, **shape) if t[0] not in drop] + list(add)
    tensors = [(n, (reshape or {}).get(n, ne), (retype or {}).get(n, t)) for n, ne, t in tensors]
    return write(path, gguf_bytes(kvs, tensors))


def real_models() -> list[Path]:
    """The lead's models in <cache>/models, and any listed in $BANKML_TEST_GGUF."""
    found = sorted((cache_root() / "models").glob("*.gguf"))
    found += [Path(p) for p in os.environ.get("BANKML_TEST_GGUF", "").split(os.pathsep) if p]
    return [p for p in found if p.is_file() and "-vocab-" not in p.name]   # *-vocab-*: tokenizer files, no tensors
