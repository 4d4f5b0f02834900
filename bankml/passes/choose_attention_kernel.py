"""Reference / Tiled / Split flash-attention kernel, as ggml-cpu chooses.

ggml-cpu/ops.cpp:ggml_compute_forward_flash_attn_ext_f16: split-KV when one query row
(neq1 == 1) reads 512 or more cells (nek1 >= 512), with one chunk of keys per llama.cpp
thread; tiled when the micro-batch has GGML_FA_TILE_Q (64) rows or more; otherwise the
one_chunk reference kernel. The split-KV and tiled kernels need K and V of one type, f16 (or
f32): over a quantized cache (K or V q8_0/q4_0) every micro-batch runs one_chunk, with the
order of its K and V types (attention_order_quant).

In a batch of sequences (g.meta["seqs"]: each row one sequence's decode token, over its own
cache) every row takes the kernel its sequence would alone, by its own cell count: FA_ROWS
(one_chunk below 512 cells, split-KV from 512 with llama_threads' chunks). Such a batch is
built over f16 caches only.
"""
from __future__ import annotations

from bankml.errors import BankmlError
from bankml.ir import order as fo
from bankml.ir.dims import as_range, decide
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op

SPLIT_MIN_KV = 512
TILE_Q = 64


def attention_order(n_tokens: int, n_kv: int) -> fo.FloatOrder:
    if n_tokens == 1 and n_kv >= SPLIT_MIN_KV:
        return fo.FA_SPLIT
    if n_tokens >= TILE_Q:
        return fo.FA_TILED
    return fo.FA_REFERENCE


def attention_order_quant(k_type: str, v_type: str) -> fo.FloatOrder:
    """one_chunk over a cache of these types (not both f16)."""
    if k_type == "f16":
        return fo.FA_REFERENCE_QV
    return fo.FA_REFERENCE_QK if v_type == "f16" else fo.FA_REFERENCE_QKV


def choose_attention_kernel(g: Graph) -> Graph:
    n_tokens, threads = g.meta["n_tokens"], g.meta.get("llama_threads", 1)

    def pick(n: Node) -> Node:
        n_kv = g[n.inputs[1]].shape[0]        # the cells of its cache (a sliding-window layer's own)
        k_type, v_type = g[n.inputs[1]].dtype, g[n.inputs[2]].dtype
        if g.meta.get("seqs"):
            if (k_type, v_type) != ("f16", "f16"):
                raise BankmlError(f"a batch of sequences runs over f16 caches, not {k_type}/{v_type}")
            return n.replace(order=fo.FA_ROWS, params={**n.params, "n_threads": threads})
        if (k_type, v_type) != ("f16", "f16"):
            return n.replace(order=attention_order_quant(k_type, v_type))
        o = decide(attention_order, as_range(n_tokens), as_range(n_kv))
        params = {**n.params, "n_threads": threads} if o is fo.FA_SPLIT else n.params
        return n.replace(order=o, params=params)
    return g.map(pick, Op.FLASH_ATTN)
