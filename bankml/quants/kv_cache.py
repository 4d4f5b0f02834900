"""The K/V cache's types, as llama.cpp b11434 takes them from `--cache-type-k/-v` (`-ctk/-ctv`).

    kv = KvCacheTypes.of("q8_0", "f16", head_dim=64)     # or refused with the reason
    kv.k, kv.v                                           # "q8_0", "f16"
    kv.rot_k, kv.rot_v                                   # Hadamard sizes (0: no rotation)
    kv.cell_bytes(n_layer, n_head_kv)                    # bytes one cache cell takes
    cache_array("q8_0", (4096, 3, 64))                   # a cache node's array: ((4096, 204), uint8)

f16 stores each value as a half; q8_0 and q4_0 store each row of a cell (n_head_kv * head_dim
values) in ggml blocks of 32 values: q8_0 34 bytes (f16 d, 32 int8), q4_0 18 bytes (f16 d,
16 bytes of nibbles), written by ggml-cpu's from_float (quantize_row_q8_0, AVX2;
quantize_row_q4_0_ref) through set_rows.

The rotation (src/llama-kv-cache.cpp, llama_kv_cache constructor): with a quantized K cache
and a head size that is a multiple of 64, Q and K are rotated by an n_rot_k Hadamard
transform before K is stored and attended (n_rot_k starts at 64 and doubles while 2*n_rot_k
divides the head); with a quantized V cache V is rotated by a 64 Hadamard transform, and the
attention output back. LLAMA_ATTN_ROT_DISABLE (atoi, non-zero) turns both off.

llama.cpp refuses a quantized V cache without flash attention (bankml always runs flash
attention, as b11434 does by default on the CPU) and a quantized type whose block does not
divide the head size (llama_init_from_model). Other types (f32, bf16, q4_1, q5_0, q5_1,
iq4_nl) are llama.cpp's but not reproduced by bankml: refused here.

The portable profile stores its cache as "i8r" rows (profiles/portable/attention.cache_row):
per cell and K/V head an f16 scale and head_dim int8 codes. cache_array gives the array of any
of these types; the session allocates its caches with it from the graph's CACHE nodes (their
dtype, their view's heads and head size, params["cells"]) and the llvm backend checks the
arrays it binds against it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from bankml.errors import BankmlError
from bankml.quants import F16, Q4_0, Q8_0, WEIGHT_TYPES

# name -> ggml type id (its block and bytes: WEIGHT_TYPES)
CACHE_TYPES = {"f16": F16, "q8_0": Q8_0, "q4_0": Q4_0}
I8_ROWS = "i8r"         # the portable profile's rows: an f16 scale and int8 codes per cell and head
LLAMA_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # common/arg.cpp


def rotation_disabled() -> bool:
    """LLAMA_ATTN_ROT_DISABLE as llama_kv_cache reads it: atoi of the variable, non-zero disables."""
    s = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
    if not s:
        return False
    digits = s.strip()
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-")
    n = 0
    for ch in digits:
        if not ch.isdigit():
            break
        n = n * 10 + int(ch)
    return sign * n != 0


@dataclass(frozen=True)
class KvCacheTypes:
    k: str = "f16"
    v: str = "f16"
    rot_k: int = 0          # Hadamard size of Q and K (llama_kv_cache::n_rot_k), 0 for none
    rot_v: int = 0          # Hadamard size of V and the attention output (n_rot_v), 0 for none

    @classmethod
    def of(cls, k: str, v: str, head_dim: int, rotate: bool | None = None) -> "KvCacheTypes":
        """The cache of types k and v for this head size, or BankmlError naming why not."""
        for kind, t in (("K", k), ("V", v)):
            if t not in CACHE_TYPES:
                why = ("is llama.cpp's but not reproduced by bankml" if t in LLAMA_TYPES else
                       f"is not a llama.cpp cache type ({', '.join(LLAMA_TYPES)})")
                raise BankmlError(f"{kind} cache type {t!r} {why}; bankml reproduces {', '.join(CACHE_TYPES)}")
            block = WEIGHT_TYPES[CACHE_TYPES[t]].block
            if head_dim % block:
                raise BankmlError(f"{kind} cache type {t} with block size {block} does not divide the "
                                  f"head size {head_dim} (llama.cpp refuses it)")
        rotate = not rotation_disabled() if rotate is None else rotate
        rot_k = 0
        if rotate and k != "f16" and head_dim % 64 == 0:
            rot_k = 64
            while head_dim % (2 * rot_k) == 0:
                rot_k *= 2
        rot_v = 64 if rotate and v != "f16" and head_dim % 64 == 0 else 0
        return cls(k, v, rot_k, rot_v)

    @property
    def quantized(self) -> bool:
        return (self.k, self.v) != ("f16", "f16")

    def row_bytes(self, kind: str, n: int) -> int:
        """Bytes of one cell's row of n values in the K ("k") or V ("v") cache."""
        return WEIGHT_TYPES[CACHE_TYPES[self.k if kind == "k" else self.v]].row_bytes(n)

    def cell_bytes(self, n_layer: int, n_head_kv: int, head_dim: int) -> int:
        """Bytes one cache cell takes over all layers (K and V)."""
        n = n_head_kv * head_dim
        return n_layer * (self.row_bytes("k", n) + self.row_bytes("v", n))

    def describe(self) -> str:
        rot = [f"{x} {n}" for x, n in (("K", self.rot_k), ("V", self.rot_v)) if n]
        return f"K {self.k}, V {self.v}" + (f" (Hadamard rotation {', '.join(rot)})" if rot else "")


def i8_row(head_dim: int) -> np.dtype:
    """One "i8r" row: the f16 scale d and head_dim int8 codes qs."""
    return np.dtype([("d", "<f2"), ("qs", "i1", (head_dim,))])


def cache_array(dtype: str, shape: tuple[int, int, int]) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, numpy dtype) of the array holding a cache of this type with shape [cells, n_head_kv,
    head_dim]: f16 as it is; q8_0 and q4_0 the ggml block bytes of each cell's row, uint8
    [cells, row_bytes]; "i8r" [cells, n_head_kv] rows of i8_row(head_dim). A recurrent layer's
    state ("f32": the conv state [ch, d_conv-1], the delta-net state [Hv, S, S]) is f32 as it is."""
    if dtype == "f32":
        return tuple(shape), np.dtype(np.float32)
    cells, n_head_kv, head_dim = shape
    if dtype == "f16":
        return (cells, n_head_kv, head_dim), np.dtype(np.float16)
    if dtype == I8_ROWS:
        return (cells, n_head_kv), i8_row(head_dim)
    return (cells, WEIGHT_TYPES[CACHE_TYPES[dtype]].row_bytes(n_head_kv * head_dim)), np.dtype(np.uint8)
