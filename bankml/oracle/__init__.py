"""The reference: llama.cpp b11434 (AVX2 build) as a Python API, for bit-for-bit comparisons.

    rows = oracle.logits("m.gguf", tokens, threads=2)            # np.float32 [rows, n_vocab]
    named = oracle.tensors("m.gguf", tokens)                     # {"attn_norm-0": [OracleTensor, ...]}
    ids = oracle.tokenize("m.gguf", "text", add_special=True, parse_special=True)

Each call runs bankml-oracle (harness.c) in a subprocess over llama.cpp's C API.
"""
from __future__ import annotations

import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bankml.errors import OracleError
from bankml.oracle.build import build, harness_path, is_built

__all__ = ["build", "is_built", "logits", "tensors", "tokenize", "pieces", "OracleTensor"]

_TYPES = {0: np.float32, 1: np.float16, 26: np.int32, 27: np.int64}


@dataclass
class OracleTensor:
    """One named node of llama.cpp's graph as the eval callback handed it out."""
    name: str
    op: str
    ubatch: int                 # index of the micro-batch (llama_decode's ubatch) it came from
    ne: tuple[int, int, int, int]
    array: np.ndarray           # contiguous, numpy shape = reversed ne

    def f32(self) -> np.ndarray:
        return self.array.astype(np.float32)


def _call(args: list[str]) -> None:
    r = subprocess.run([str(harness_path()), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise OracleError(f"bankml-oracle {args[0]} failed: {r.stderr.strip().splitlines()[-1:]}")


def cache_arg(cache_type: str = "f16", cache_type_k: str | None = None, cache_type_v: str | None = None) -> str:
    """The harness's cache argument: one type for K and V, or "K,V" (llama.cpp's -ctk/-ctv)."""
    k, v = cache_type_k or cache_type, cache_type_v or cache_type
    return k if k == v else f"{k},{v}"


def _decode_args(mode, model, tokens, out, threads, n_ubatch, outputs, decode_from, cache_type, n_ctx):
    if outputs not in ("all", "last"):
        raise ValueError("outputs must be 'all' or 'last'")
    if len(tokens) == 0:
        raise ValueError("no tokens")
    tok = out.with_suffix(".tok")
    np.asarray(tokens, np.int32).tofile(tok)
    return [mode, str(model), str(tok), str(out), str(threads), str(n_ubatch), outputs,
            str(decode_from or 0), cache_type, str(n_ctx)]


def logits(model, tokens, threads: int = 2, n_ubatch: int = 512, outputs: str = "all",
           decode_from: int | None = None, cache_type: str = "f16", n_ctx: int = 4096,
           cache_type_k: str | None = None, cache_type_v: str | None = None) -> np.ndarray:
    """llama.cpp's logits rows, exactly as llama_decode gives them.

    The first `decode_from` tokens (default: all) go in one llama_decode with the rows that
    `outputs` asks for; each remaining token then gets its own llama_decode and one row.
    cache_type sets the K and V cache types; cache_type_k / cache_type_v one of them.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.bin"
        _call(_decode_args("logits", model, tokens, out, threads, n_ubatch, outputs, decode_from,
                           cache_arg(cache_type, cache_type_k, cache_type_v), n_ctx))
        raw = out.read_bytes()
    n_rows, n_vocab = struct.unpack_from("<ii", raw)
    return np.frombuffer(raw, np.float32, offset=8).reshape(n_rows, n_vocab).copy()


def tensors(model, tokens, names=None, threads: int = 2, n_ubatch: int = 512, outputs: str = "all",
            decode_from: int | None = None, cache_type: str = "f16",
            n_ctx: int = 4096, cache_type_k: str | None = None,
            cache_type_v: str | None = None) -> dict[str, list[OracleTensor]]:
    """Every named tensor of llama.cpp's graph through the eval callback, keyed by name.

    A name can appear several times (Qcur-0 is the mul_mat, its reshape and the RoPE output;
    each micro-batch repeats the graph): the list keeps them in compute order.
    """
    want = set(names) if names is not None else None
    found: dict[str, list[OracleTensor]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.bin"
        _call(_decode_args("tensors", model, tokens, out, threads, n_ubatch, outputs, decode_from,
                           cache_arg(cache_type, cache_type_k, cache_type_v), n_ctx))
        raw = memoryview(out.read_bytes())
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, raw, pos)
        pos += struct.calcsize(fmt)
        return v

    while pos < len(raw):
        (n,) = take("<i"); name = bytes(raw[pos:pos + n]).decode(); pos += n
        (n,) = take("<i"); op = bytes(raw[pos:pos + n]).decode(); pos += n
        ubatch, typ = take("<ii")
        ne = take("<4q")
        (nb,) = take("<q")
        data = raw[pos:pos + nb]; pos += nb
        if want is not None and name not in want:
            continue
        arr = np.frombuffer(data, _TYPES[typ]).reshape(ne[::-1]).copy()
        found.setdefault(name, []).append(OracleTensor(name, op, ubatch, ne, arr))
    return found


def tokenize(model, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
    """llama_tokenize of the model's vocabulary."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "text", Path(tmp) / "out.bin"
        src.write_bytes(text.encode("utf-8"))
        _call(["tokenize", str(model), str(src), str(out), str(int(add_special)), str(int(parse_special))])
        return np.fromfile(out, np.int32).tolist()


def pieces(model) -> list[bytes]:
    """llama_token_to_piece(special=true) of every token id."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.bin"
        _call(["pieces", str(model), str(out)])
        raw, pos, res = out.read_bytes(), 0, []
    while pos < len(raw):
        (n,) = struct.unpack_from("<i", raw, pos)
        res.append(raw[pos + 4:pos + 4 + n])
        pos += 4 + n
    return res


def sha256_rows(rows: np.ndarray) -> list[str]:
    """sha256 of each row's f32 bytes: how bankml compares with llama.cpp."""
    import hashlib
    rows = np.ascontiguousarray(rows, np.float32)
    return [hashlib.sha256(r.tobytes()).hexdigest() for r in rows.reshape(len(rows), -1)]


