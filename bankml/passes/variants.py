"""The generic graphs a model compiles to: one per float order the passes can choose.

Sizes that change during use (tokens T, cache cells KV, output rows O) are Dims; a variant
is cut wherever a pass would choose another order, so that within it every node has one:

    decode        T=1   KV=256        O=1   one_chunk attention, vec_dot mat-muls
    decode-split  T=1   KV=512..ctx   O=1   split-KV attention (chunks from KV and llama_threads)
    small-all     T=2..63             O=T   one_chunk attention; F16 tinyBLAS
    small-last    T=2..63             O=0..1  ... the last layer's rows through vec_dot
    large-all     T=64..n_ubatch      O=T   tiled attention
    large-last    T=64..n_ubatch      O=0..1

(choose_attention_kernel: split at one row and 512 cells, tiled from 64 rows;
choose_matmul_kernel: F16's one column against tinyBLAS.) A one-token micro-batch that wants
no logits runs `decode` and drops them; the cache writes are the same.

    decode-seqs   T=2..16  KV=256..ctx  O=T   a batch of sequences, one decode token each
                                              (seqs_variant: every row its own cache, cells and kernels)
"""
from __future__ import annotations

from dataclasses import dataclass

from bankml.errors import BankmlError
from bankml.ir.dims import Dim
from bankml.passes.choose_attention_kernel import SPLIT_MIN_KV, TILE_Q

DECODE_KV = 256          # llama_kv_cache::get_n_kv pads to 256: below 512 cells a decode reads 256
SEQS_MAX = 16            # sequences one decode-seqs run takes (a larger batch runs in several)


@dataclass(frozen=True)
class Variant:
    name: str
    n_tokens: int | Dim
    n_kv: int | Dim
    n_outputs: int | Dim
    n_kv_swa: int | Dim | None = None   # the sliding-window cache's cells (KVS), for models with one
    seqs: bool = False                  # each token its own sequence (Batch.seqs)


def variants(n_ubatch: int, kv_size: int, kv_size_swa: int | None = None) -> list[Variant]:
    """Every variant a session of this micro-batch size and cache size can run; kv_size_swa:
    the cells of a sliding-window cache (its split-KV rule decided on its own cell count)."""
    def kvs(lo: int) -> int | Dim | None:
        if kv_size_swa is None:
            return None
        lo = min(lo, kv_size_swa)
        return lo if lo == kv_size_swa else Dim("KVS", lo, kv_size_swa)
    out = [Variant("decode", 1, DECODE_KV, 1, DECODE_KV if kv_size_swa else None)]
    if kv_size >= SPLIT_MIN_KV:
        out.append(Variant("decode-split", 1, Dim("KV", SPLIT_MIN_KV, kv_size), 1, kvs(SPLIT_MIN_KV)))
    for name, lo, hi in (("small", 2, TILE_Q - 1), ("large", TILE_Q, n_ubatch)):
        hi = min(hi, n_ubatch)
        if lo > hi:
            continue
        T, KV = Dim("T", lo, hi), Dim("KV", DECODE_KV, kv_size)
        out.append(Variant(f"{name}-all", T, KV, T, kvs(DECODE_KV)))
        out.append(Variant(f"{name}-last", T, KV, Dim("O", 0, 1), kvs(DECODE_KV)))
    return out


def seqs_variant(kv_size: int, kv_size_swa: int | None = None) -> Variant:
    """The batch of sequences' variant: 2..SEQS_MAX rows, each one sequence's decode token; KV (and
    KVS) the widest row's cells, each row reading its own."""
    T = Dim("T", 2, SEQS_MAX)
    kvs = None if kv_size_swa is None else Dim("KVS", min(DECODE_KV, kv_size_swa), kv_size_swa)
    if kvs is not None and kvs.lo == kvs.hi:
        kvs = kvs.lo
    return Variant("decode-seqs", T, Dim("KV", DECODE_KV, kv_size), T, kvs, seqs=True)


def choose_variant(vs: list[Variant], n_tokens: int, n_kv: int, n_outputs: int,
                   n_kv_swa: int | None = None) -> tuple[Variant, dict[str, int]]:
    """The variant that runs a micro-batch of these sizes, and the values of its Dims."""
    values = {"T": n_tokens, "KV": n_kv, "O": n_outputs}
    if n_kv_swa is not None:
        values["KVS"] = n_kv_swa
    for v in vs:
        if v.n_kv_swa is not None and (n_kv_swa is None or not _fits(v.n_kv_swa, n_kv_swa)):
            continue
        if n_tokens == 1 and v.n_tokens == 1 and _fits(v.n_kv, n_kv) and n_outputs <= 1:
            return v, values
        if isinstance(v.n_tokens, Dim) and _fits(v.n_tokens, n_tokens) and _fits(v.n_kv, n_kv) and (
                n_outputs == n_tokens if v.n_outputs is v.n_tokens else _fits(v.n_outputs, n_outputs)):
            return v, values
    raise BankmlError(f"no graph for a micro-batch of {n_tokens} tokens, {n_kv} cells and {n_outputs} outputs "
                      f"(outputs are all rows or the last)")


def _fits(d: int | Dim, x: int) -> bool:
    return d.lo <= x <= d.hi if isinstance(d, Dim) else d == x
