"""The IR's own rules, checked on the builder's graph and after every pass (tinygrad's
uop/spec.py, type_verify): legality as one rule per op, and a SpecError naming the node,
the pass after which it broke and the rule.

    check(g, after="share_quantized_activations", types=TYPES)
    # SpecError: after share_quantized_activations: %10 Qcur-0 (mul_mat [7,512] f32): the
    # activation %172 [7,512] has not the weight's K 1536 (weight [512,1536]); a bankml bug

Every node: its op's arity (ARITY), inputs that exist and are computed before it (no
cycle), a shape of sizes and a dtype; leaves (LEAVES) and views (VIEWS) compute nothing,
so they carry no float order, and a view has its source's dtype and element count. Per op:
the output shape from the inputs' shapes as the op defines it, and the dtypes: f32
activations, i32 indices, f16 masks, the K/V cache types, a quantized activation in the
vec_dot type of the weight it feeds. A generic graph's shapes hold Dims: sizes compare
symbolically, an element count is a number times a product of Dims.

The dtype names of weights, caches and quantized activations are defined above this layer
(gguf, quants, profiles): `run_passes` hands them in as a `Types`. It checks every graph
when `enabled()`: BANKML_DEBUG>=1, or BANKML_VERIFY=1 (which tests/conftest.py sets).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import networkx as nx

from bankml.errors import SpecError
from bankml.ir.dims import Dim
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import ARITY, LEAVES, STATE_KINDS, VIEWS, Op

F32, I32, MASK = "f32", "i32", "f16"

# an input's params["input"] -> (its shape from the graph's meta sizes, its dtype)
_INPUTS = {
    "tokens": (("n_tokens",), I32), "pos": (("n_tokens",), I32), "swa_idxs": (("n_tokens",), I32),
    "out_ids": (("n_outputs",), I32), "kq_mask": (("n_tokens", "n_kv"), MASK),
    "kq_mask_swa": (("n_tokens", None), MASK),
    "kv_cells": (("n_tokens",), I32), "kv_cells_swa": (("n_tokens",), I32),   # a batch of sequences' rows
}


@dataclass(frozen=True)
class Types:
    """The dtype names that the layers above ir define (see passes/pipeline.py: TYPES)."""
    weight_name: Callable[[int], str]           # ggml type id -> its name ("Q8_0"): gguf's ggml_type_name
    act_type: Callable[[int], int | None]       # weight type id -> its vec_dot type id (quants.WEIGHT_TYPES)
    caches: frozenset[str]                      # K/V cache dtypes, ggml's and the portable profile's
    portable_act: str                           # the portable profile's quantized activation


def enabled() -> bool:
    """Whether run_passes checks its graphs: BANKML_DEBUG>=1 or BANKML_VERIFY=1."""
    return any(os.environ.get(v, "0") not in ("", "0") for v in ("BANKML_DEBUG", "BANKML_VERIFY"))


class Broken(Exception):
    """The rule a node breaks (check() adds the node and the pass)."""


def check(g: Graph, after: str, types: Types) -> None:
    """Raise SpecError for the first node that breaks a rule, naming it and the pass."""
    n = None
    try:
        for n in g.nodes.values():
            _structure(g, n)
        n, late = _in_cycle(g) or (None, None)
        if n is not None:
            raise Broken(f"input %{late} is computed after it (they are in a cycle)")
        for n in g.nodes.values():
            _common(g, n)
            RULES[n.op](g, n, types)
        n = None
        for key, i in g.outputs.items():
            if i not in g.nodes:
                raise Broken(f"output {key!r} is %{i}, which is not in the graph")
            n = g[i]
            if n.dtype != F32:
                raise Broken(f"output {key!r} is not f32")
    except Broken as e:
        where = f"{_label(n)}: " if n is not None else ""
        raise SpecError(f"after {after}: {where}{e}; a bankml bug (bankml/ir/verify.py)") from None


def _label(n: Node) -> str:
    shape = f"[{_s(n.shape)}]" if isinstance(n.shape, tuple) else repr(n.shape)
    return f"%{n.id} {n.name or '-'} ({getattr(n.op, 'value', n.op)} {shape} {n.dtype})"


def _s(shape) -> str:
    return ",".join(str(d) for d in shape)


def _structure(g: Graph, n: Node) -> None:
    if not isinstance(n.op, Op):
        raise Broken(f"op {n.op!r} is not an Op")
    if g.nodes.get(n.id) is not n:
        raise Broken("is stored under another id")
    arity = ARITY[n.op] if isinstance(ARITY[n.op], tuple) else (ARITY[n.op],)
    if len(n.inputs) not in arity:
        k = " or ".join(map(str, arity))
        raise Broken(f"{n.op.value} takes {k} input{'' if k == '1' else 's'}, it has {len(n.inputs)}")
    for i in n.inputs:
        if i not in g.nodes:
            raise Broken(f"input %{i} is not in the graph")


def _in_cycle(g: Graph) -> tuple[Node, int] | None:
    """A node and its input computed after it (both in a cycle), or None: Kahn's walk reaches
    every node of a graph whose inputs all come before their users."""
    waiting = {i: len(n.inputs) for i, n in g.nodes.items()}
    users = g.users()
    ready = [i for i, k in waiting.items() if k == 0]
    while ready:
        for u in users[ready.pop()]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if not any(waiting.values()):
        return None
    cycle = nx.find_cycle(g.digraph(), [i for i, k in waiting.items() if k])
    late, user = next(((u, v) for u, v in cycle if u > v), cycle[0])     # ids cannot rise all the way round
    return g[user], late


def _common(g: Graph, n: Node) -> None:
    """Every node: a shape of sizes, a dtype, a name or none; leaves and views compute nothing."""
    if type(n.shape) is not tuple or not all(type(d) is Dim or (type(d) is int and d >= 0) for d in n.shape):
        raise Broken(f"shape {n.shape!r} is not a tuple of sizes")
    if type(n.dtype) is not str or not n.dtype:
        raise Broken(f"dtype {n.dtype!r} is not a type name")
    if n.name is not None and (type(n.name) is not str or not n.name):
        raise Broken(f"name {n.name!r} is not a name")
    if n.order is not None and (n.op in LEAVES or n.op in VIEWS):
        raise Broken(f"a {'leaf' if n.op in LEAVES else 'view'} computes nothing but has a float order")


def _elements(shape) -> tuple[int, Counter]:
    """An element count as (number, Dims multiplied in): comparable whatever the Dims' values."""
    num, dims = 1, Counter()
    for d in shape:
        if isinstance(d, Dim):
            dims[d] += 1
        else:
            num *= d
    return (0, Counter()) if num == 0 else (num, dims)


def _f32(x: Node, what: str) -> None:
    if x.dtype != F32:
        raise Broken(f"{what} %{x.id} is {x.dtype}, not an f32 activation")


def _same_shape(n: Node, x: Node, what: str = "its input") -> None:
    if n.shape != x.shape:
        raise Broken(f"shape differs from {what} %{x.id} [{_s(x.shape)}]")


def _tokens_by_heads(x: Node, what: str) -> None:
    if len(x.shape) != 3:
        raise Broken(f"{what} %{x.id} [{_s(x.shape)}] is not [rows, heads, head size]")


RULES: dict[Op, Callable[[Graph, Node, Types], None]] = {}


def rule(*ops: Op):
    def register(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return register


# ---- leaves ----
@rule(Op.INPUT)
def _input(g: Graph, n: Node, t: Types) -> None:
    """tokens, positions, the SWA cache's cells and out_ids: i32 rows; the KQ masks: f16
    [tokens, cells]; sized by the graph's meta."""
    kind = n.params.get("input")
    if kind not in _INPUTS:
        raise Broken(f"input {kind!r} is none of {', '.join(_INPUTS)}")
    sizes, dtype = _INPUTS[kind]
    if n.dtype != dtype or len(n.shape) != len(sizes):
        raise Broken(f"input {kind} is {dtype} of {len(sizes)} dimensions")
    for d, key in zip(n.shape, sizes):
        if key in g.meta and d != g.meta[key]:
            raise Broken(f"input {kind} has {d} where the graph's {key} is {g.meta[key]}")


@rule(Op.WEIGHT)
def _weight(g: Graph, n: Node, t: Types) -> None:
    """A model tensor named as itself, its dtype the name of its ggml type, sizes fixed."""
    typ = n.params.get("ggml_type")
    if n.params.get("tensor") != n.name:
        raise Broken(f"a weight is named as its tensor {n.params.get('tensor')!r}")
    if not isinstance(typ, int) or n.dtype != t.weight_name(typ):
        raise Broken(f"ggml type {typ!r} is not {n.dtype}")
    if not all(isinstance(d, int) for d in n.shape):
        raise Broken("a weight's shape holds a symbolic size")


@rule(Op.CACHE)
def _cache(g: Graph, n: Node, t: Types) -> None:
    """A K/V cache (kind k or v: cells of heads) of a cache type, or a recurrent layer's state
    (kind conv or ssm: the whole state of one sequence) in f32."""
    kind = n.params.get("kind")
    if kind in STATE_KINDS:
        if n.dtype != F32 or "cells" in n.params:
            raise Broken(f"a {kind} state is f32 and has no cells")
        return
    if n.dtype not in t.caches:
        raise Broken(f"a cache is one of {', '.join(sorted(t.caches))}")
    if kind not in ("k", "v"):
        raise Broken(f"cache kind {n.params.get('kind')!r} is neither k nor v")
    _tokens_by_heads(n, "the cache")


# ---- ops ----
@rule(Op.GET_ROWS)
def _get_rows(g: Graph, n: Node, t: Types) -> None:
    """ids [R] rows of x [N, E] (a weight, dequantized, or f32 rows): f32 [R, E]."""
    x, ids = g[n.inputs[0]], g[n.inputs[1]]
    if ids.dtype != I32 or len(ids.shape) != 1:
        raise Broken(f"row ids %{ids.id} are not one row of i32")
    if x.op is not Op.WEIGHT:
        _f32(x, "src0")
    if len(x.shape) != 2:
        raise Broken(f"rows of %{x.id} [{_s(x.shape)}], not a matrix")
    _f32(n, "the output")
    if n.shape != (ids.shape[0], *x.shape[1:]):
        raise Broken(f"not {ids.shape[0]} rows of [{_s(x.shape)}]")


@rule(Op.RMS_NORM, Op.L2_NORM, Op.SCALE, Op.SILU, Op.SIGMOID, Op.SOFTPLUS)
def _unary(g: Graph, n: Node, t: Types) -> None:
    x = g[n.inputs[0]]
    _f32(x, "src0")
    _f32(n, "the output")
    _same_shape(n, x)


@rule(Op.SWIGLU, Op.GEGLU)
def _binary(g: Graph, n: Node, t: Types) -> None:
    a, b = g[n.inputs[0]], g[n.inputs[1]]
    _f32(a, "src0")
    _f32(b, "src1")
    _f32(n, "the output")
    _same_shape(n, a, "src0")
    _same_shape(n, b, "src1")


@rule(Op.MUL, Op.ADD)
def _mul(g: Graph, n: Node, t: Types) -> None:
    """src1 (a weight, a norm's or Qwen3.5's ssm_dt bias, or f32) is repeated over src0's rows
    (ggml_can_repeat): its shape ends src0's."""
    x, w = g[n.inputs[0]], g[n.inputs[1]]
    _f32(x, "src0")
    if w.op is not Op.WEIGHT:
        _f32(w, "src1")
    _f32(n, "the output")
    _same_shape(n, x, "src0")
    if not 0 < len(w.shape) <= len(x.shape) or x.shape[len(x.shape) - len(w.shape):] != w.shape:
        raise Broken(f"src1 %{w.id} [{_s(w.shape)}] does not repeat over src0 [{_s(x.shape)}]")


@rule(Op.QUANTIZE)
def _quantize(g: Graph, n: Node, t: Types) -> None:
    """An f32 activation in the type of params["type"], same shape: a ggml vec_dot type id
    (dtype its name), or the portable profile's activation type."""
    x, typ = g[n.inputs[0]], n.params.get("type")
    _f32(x, "src0")
    _same_shape(n, x)
    if g.meta.get("profile") == "portable":
        if not typ == n.dtype == t.portable_act:
            raise Broken(f"the portable profile quantizes activations to {t.portable_act}, not {typ!r}")
    elif not isinstance(typ, int) or n.dtype != t.weight_name(typ):
        raise Broken(f"quantizes to type {typ!r}, which is not {n.dtype}")


@rule(Op.MUL_MAT)
def _mul_mat(g: Graph, n: Node, t: Types) -> None:
    """f32 [.., N] from weight [N, K] and activation [.., K]: f32 or its QUANTIZE to the
    weight's vec_dot type (the portable profile's one type)."""
    w, x = g[n.inputs[0]], g[n.inputs[1]]
    if w.op is not Op.WEIGHT or len(w.shape) != 2:
        raise Broken(f"src0 %{w.id} is not a weight matrix")
    if x.op is not Op.QUANTIZE:
        _f32(x, "src1")
    if not x.shape or x.shape[-1] != w.shape[1]:
        raise Broken(f"the activation %{x.id} [{_s(x.shape)}] has not the weight's K {w.shape[1]} "
                     f"(weight [{_s(w.shape)}])")
    _f32(n, "the output")
    if n.shape != (*x.shape[:-1], w.shape[0]):
        raise Broken(f"not [{_s((*x.shape[:-1], w.shape[0]))}]")
    if x.op is Op.QUANTIZE and g.meta.get("profile") != "portable":
        act = t.act_type(w.params["ggml_type"])
        if x.params.get("type") != act:
            raise Broken(f"its activation %{x.id} is {x.dtype}, not {w.dtype}'s vec_dot type "
                         f"{t.weight_name(act) if act is not None else '(none)'}")


@rule(*VIEWS)
def _view(g: Graph, n: Node, t: Types) -> None:
    """A view (reshape) aliases its source: the same dtype and number of elements."""
    x = g[n.inputs[0]]
    if n.dtype != x.dtype:
        raise Broken(f"a view of a {x.dtype} tensor is {n.dtype}")
    if _elements(n.shape) != _elements(x.shape):
        raise Broken(f"a view of %{x.id} [{_s(x.shape)}] holds another number of elements")


@rule(Op.ROPE)
def _rope(g: Graph, n: Node, t: Types) -> None:
    """x [T, H, D] rotated by positions [T] (i32): [T, H, D]."""
    x, pos = g[n.inputs[0]], g[n.inputs[1]]
    _f32(x, "src0")
    _tokens_by_heads(x, "src0")
    if pos.dtype != I32 or pos.shape != x.shape[:1]:
        raise Broken(f"positions %{pos.id} are not one i32 per row")
    _f32(n, "the output")
    _same_shape(n, x, "src0")
    if n.params.get("n_dims", 0) > x.shape[2]:
        raise Broken(f"rotates {n.params['n_dims']} dims of a head of {x.shape[2]}")


@rule(Op.SET_ROWS)
def _set_rows(g: Graph, n: Node, t: Types) -> None:
    """rows [T, Hkv, D] (f32) into cache [KV, Hkv, D] at cells [T] (i32): the cache, its type."""
    cache, x, cells = (g[i] for i in n.inputs)
    if cache.op is not Op.CACHE:
        raise Broken(f"src0 %{cache.id} is not a cache")
    _f32(x, "src1")
    _tokens_by_heads(x, "src1")
    if cells.dtype != I32 or cells.shape != x.shape[:1]:
        raise Broken(f"cells %{cells.id} are not one i32 per row of src1")
    if x.shape[1:] != cache.shape[1:]:
        raise Broken(f"rows [{_s(x.shape)}] do not fit the cache's [{_s(cache.shape)}]")
    if n.dtype != cache.dtype:
        raise Broken(f"writes a {cache.dtype} cache")
    _same_shape(n, cache, "its cache")


@rule(Op.FLASH_ATTN)
def _flash_attn(g: Graph, n: Node, t: Types) -> None:
    """q [T, H, D] (f32), k and v caches [KV, Hkv, D] (H a multiple of Hkv), mask f16 [T, KV]:
    f32 [T, H, Dv]. In a batch of sequences (caches with param seqs, one per row) a fifth input,
    i32 [T], holds each row's own cell count."""
    q, k, v, mask, *cells = (g[i] for i in n.inputs)
    seqs = g[_cache_of(g, k)].params.get("seqs", False)
    if len(cells) != seqs or (cells and (cells[0].dtype != I32 or cells[0].shape != q.shape[:1])):
        raise Broken("a batch of sequences' caches come with each row's cells (i32 [T]), and only they")
    _f32(q, "q")
    _tokens_by_heads(q, "q")
    for kind, c in (("k", k), ("v", v)):
        if c.op not in (Op.SET_ROWS, Op.CACHE) or c.dtype not in t.caches:
            raise Broken(f"{kind} %{c.id} is not a cache")
        _tokens_by_heads(c, kind)
    if k.shape[:2] != v.shape[:2]:
        raise Broken(f"k [{_s(k.shape)}] and v [{_s(v.shape)}] differ in cells or heads")
    if q.shape[2] != k.shape[2]:
        raise Broken(f"q's head size {q.shape[2]} is not k's {k.shape[2]}")
    if all(isinstance(d, int) for d in (q.shape[1], k.shape[1])) and q.shape[1] % k.shape[1]:
        raise Broken(f"q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]}")
    if mask.dtype != MASK or mask.shape != (q.shape[0], k.shape[0]):
        raise Broken(f"mask %{mask.id} is {mask.dtype} [{_s(mask.shape)}], not f16 [{q.shape[0]},{k.shape[0]}]")
    _f32(n, "the output")
    if n.shape != (*q.shape[:2], v.shape[2]):
        raise Broken(f"not [{_s((*q.shape[:2], v.shape[2]))}]")


def _cache_of(g: Graph, n: Node) -> int:
    """The CACHE node a SET_ROWS writes (or the cache itself)."""
    return _cache_of(g, g[n.inputs[0]]) if n.op is Op.SET_ROWS else n.id


@rule(Op.SLICE)
def _slice(g: Graph, n: Node, t: Types) -> None:
    """Columns [lo, hi) of each row of an f32 x: x's shape with hi - lo last."""
    x, lo, hi = g[n.inputs[0]], n.params.get("lo"), n.params.get("hi")
    _f32(x, "src0")
    _f32(n, "the output")
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi <= x.shape[-1]):
        raise Broken(f"columns [{lo}, {hi}) are not within rows of {x.shape[-1]}")
    if n.shape != (*x.shape[:-1], hi - lo):
        raise Broken(f"not [{_s((*x.shape[:-1], hi - lo))}]")


@rule(Op.SSM_CONV)
def _ssm_conv(g: Graph, n: Node, t: Types) -> None:
    """x [T, ch] (f32), weight [ch, d_conv] (F32), conv state cache [ch, d_conv-1] (f32): f32 [T, ch]."""
    x, w, state = (g[i] for i in n.inputs)
    _f32(x, "x")
    _f32(n, "the output")
    if w.op is not Op.WEIGHT or w.dtype != "F32" or len(w.shape) != 2:
        raise Broken(f"weight %{w.id} is not an F32 matrix (ggml's ssm_conv takes no other)")
    if state.op is not Op.CACHE or state.dtype != "f32" or state.shape != (w.shape[0], w.shape[1] - 1):
        raise Broken(f"state %{state.id} is not an f32 cache [{w.shape[0]},{w.shape[1] - 1}]")
    if len(x.shape) != 2 or x.shape[1] != w.shape[0]:
        raise Broken(f"x [{_s(x.shape)}] is not [T,{w.shape[0]}]")
    _same_shape(n, x, "x")


@rule(Op.GATED_DELTA_NET)
def _gated_delta_net(g: Graph, n: Node, t: Types) -> None:
    """q, k [T, Hk, S], v [T, Hv, S] (Hv a multiple of Hk), g and beta [T, Hv], the state cache
    [Hv, S, S], all f32, S a multiple of 32 (ggml_vec_dot_f32's leftovers are not lowered): f32 [T, Hv, S]."""
    q, k, v, gate, beta, state = (g[i] for i in n.inputs)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", gate), ("beta", beta)):
        _f32(x, name)
    _f32(n, "the output")
    if len(v.shape) != 3 or q.shape != k.shape or len(q.shape) != 3 or q.shape[::2] != v.shape[::2]:
        raise Broken(f"q [{_s(q.shape)}], k [{_s(k.shape)}], v [{_s(v.shape)}] are not [T,Hk,S] and [T,Hv,S]")
    T, hv, S = v.shape
    if hv % q.shape[1] or S % 32:
        raise Broken(f"{hv} v-heads over {q.shape[1]} k-heads of {S}: want a multiple of each, S of 32")
    for name, x in (("g", gate), ("beta", beta)):
        if x.shape != (T, hv):
            raise Broken(f"{name} %{x.id} [{_s(x.shape)}] is not [{_s((T, hv))}]")
    if state.op is not Op.CACHE or state.dtype != "f32" or state.shape != (hv, S, S):
        raise Broken(f"state %{state.id} is not an f32 cache [{hv},{S},{S}]")
    _same_shape(n, v, "v")


@rule(Op.HADAMARD)
def _hadamard(g: Graph, n: Node, t: Types) -> None:
    """Rows in blocks of params n (a power of 2) times the Walsh-Hadamard matrix: same shape."""
    x, size = g[n.inputs[0]], n.params.get("n")
    _unary(g, n, t)
    if not (isinstance(size, int) and size > 0 and size & (size - 1) == 0):
        raise Broken(f"size {size!r} is not a power of 2")
    if isinstance(x.shape[-1], int) and x.shape[-1] % size:
        raise Broken(f"rows of {x.shape[-1]} are not blocks of {size}")
