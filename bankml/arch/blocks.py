"""The DSL: a Builder whose calls read like llama.cpp's graph code (llama-graph.cpp).

An architecture file calls these in the order llm_build_* does; each call adds IR nodes
named as llama.cpp's cb() names them. Float orders of fixed ops are attached here; those
that depend on shapes (mul_mat, attention) are chosen by passes.

What a graph reads comes through three doors, as in llama.cpp:
- the model's tensors: `b.model.tok_embd`, `.output_norm`, `.output` (token_embd when the file
  ties it) and `b.model.layers[il].attn_q` ... (`blk.{il}.attn_q.weight`), each checked against
  the file's tensors (a missing one is a `MissingTensor` naming it);
- the graph inputs it asks for (`b.inp_pos()`, `b.inp_attn()` or `b.inp_attn_iswa()`,
  `b.inp_out_ids()`: llama.cpp's build_inp_*), besides the micro-batch's tokens that
  `inp_embd` reads;
- the hyper-parameters `b.hp` (typed fields, arch/plan.py) and the registered Architecture.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bankml.arch.plan import Plan
from bankml.arch.registry import Architecture, lookup
from bankml.errors import BankmlError, MissingTensor
from bankml.gguf.reader import ggml_type_name
from bankml.ir import order as fo
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.numerics.floats import inv_sqrtf
from bankml.quants.kv_cache import KvCacheTypes

_ACT_DTYPE = "f32"
_SET_ROWS = {"f16": fo.SET_ROWS_F16, "q8_0": fo.SET_ROWS_Q8_0, "q4_0": fo.SET_ROWS_Q4_0}


def mrope_text_refusal(sections: tuple[int, ...], n_rot: int) -> str | None:
    """Why rope_multi's sections would not be NEOX rope on text positions, or None: a rotated pair
    whose sector ggml_mrope_cache_init (is_imrope) gives the 4th position (0 for text)."""
    if len(sections) != 4 or min(sections) < 0 or sum(sections) == 0:
        return f"rope sections {list(sections)}: rope_multi needs 4 sizes, not all 0"
    for k in range(n_rot // 2):
        sector = k % sum(sections)
        if not any(sector % 3 == i and sector < 3 * sections[i] for i in range(3)):
            return (f"rope sections {list(sections)} give rotated pair {k} the 4th (vision) position, which "
                    "bankml does not reproduce for text")
    return None


def tensor_name(name: str, il: int) -> str:
    """llama.cpp's cb(): "name-il", or "name" for il < 0."""
    return f"{name}-{il}" if il >= 0 else name


@dataclass(frozen=True)
class Batch:
    """What one micro-batch graph is built for."""
    n_tokens: int
    n_kv: int          # padded cache cells the attention reads
    n_outputs: int     # rows whose logits are wanted
    kv_size: int       # cells of the whole cache (llama_kv_cache's size: n_ctx padded)
    n_kv_swa: int | None = None     # cells the sliding-window layers read from their own cache
    kv_size_swa: int | None = None  # cells of the sliding-window layers' whole cache
    seqs: bool = False              # each token its own sequence (a batch of decodes): its own cache and cells


@dataclass(frozen=True)
class Weight:
    """A tensor of the file, as llama.cpp's model.tok_embd or model.layers[il].wq: a block that
    reads it makes its `weight` node there (so the IR numbers a weight where it is first used)."""
    name: str                  # the GGUF tensor: "blk.3.attn_q.weight"


class Layer:
    """model.layers[il]: `L.attn_q` is the file's blk.{il}.attn_q.weight (GGUF part names); a part
    the file lacks raises MissingTensor (an AttributeError too: `getattr(L, "attn_q_norm", None)`
    asks whether it is there, as llama.cpp tests `if (model.layers[il].bq)`)."""

    def __init__(self, b: "Builder", il: int):
        self._b, self.il = b, il

    def __getattr__(self, part: str) -> Weight:
        if part.startswith("_"):
            raise AttributeError(part)
        return self._b.tensor(f"blk.{self.il}.{part}.weight", f"model.layers[{self.il}].{part}")


class Weights:
    """llama_model's tensors: tok_embd, output_norm, output (llama.cpp's TENSOR_DUPLICATED
    token_embd when the file has no output.weight) and layers[il]."""

    def __init__(self, b: "Builder"):
        self._b = b
        self.layers = tuple(Layer(b, il) for il in range(b.hp.n_layer))

    @property
    def tok_embd(self) -> Weight:
        return self._b.tensor("token_embd.weight", "model.tok_embd")

    @property
    def output_norm(self) -> Weight:
        return self._b.tensor("output_norm.weight", "model.output_norm")

    @property
    def output(self) -> Weight:
        return self._b.tensor(self._b.plan.logits_matrix, "model.output")


@dataclass(frozen=True)
class AttnInput:
    """llm_graph_input_attn_kv (build_attn_inp_kv) or, with the `_swa` pair, its iSWA form
    (build_attn_inp_kv_iswa): the cells a layer's K/V rows go to and the mask it reads through."""
    kq_mask: Node
    k_idxs: Node                    # the tokens' cells: their positions (bankml's cache is unified)
    kq_mask_swa: Node | None = None
    k_idxs_swa: Node | None = None  # the cells find_slot gave the tokens in the sliding-window cache
    kv_cells: Node | None = None    # a batch of sequences: each row's own n_kv (and in its sliding-window cache)
    kv_cells_swa: Node | None = None


# Where llama.cpp's graph puts a layer's nodes (src/models/*.cpp, llama-graph.cpp:build_attn): nodes of
# layer il start at 4 + il * (layer size) (embd, and the mixed-batch get_rows, dup and set_rows come
# first); an architecture declares its own counts (Architecture.ggml_layout: nodes up to Q's rope,
# nodes of K's chain); build_attn's are these. Unnamed nodes are named "node_<index>" by ggml, which
# is how the eval callback reports the Hadamard rotations.
_GGML_ATTN, _GGML_TAIL = 11, 9          # cache writes and views .. flash_attn_ext; wo .. l_out


class Builder:
    """One micro-batch's graph as an architecture's build(b) writes it (llm_graph_context): b.hp,
    b.model (the tensors), the inputs it asks for, and the blocks below."""

    def __init__(self, plan: Plan, batch: Batch, shapes: dict[str, tuple[int, ...]],
                 kv: KvCacheTypes | None = None, arch: Architecture | None = None):
        self.plan, self.hp, self.batch, self.shapes = plan, plan.hparams, batch, shapes
        self.kv = kv or KvCacheTypes()
        self.arch = arch or lookup(plan.arch)       # the architecture whose graph this builds
        self.g = Graph(meta={"arch": plan.arch, "n_tokens": batch.n_tokens, "n_kv": batch.n_kv,
                             "n_outputs": batch.n_outputs})
        if batch.seqs:
            self.g.meta["seqs"] = True      # passes: each row's mul_mat column and attention as its sequence's alone
        self._weights: dict[str, Node] = {}
        self._inputs: dict[str, Node] = {}
        self.model = Weights(self)
        self.inp_tokens = self._input("tokens", (batch.n_tokens,), "i32")   # ubatch.token: inp_embd reads it

    # ---- plumbing ----
    def node(self, op: Op, inputs: tuple[Node, ...], shape: tuple[int, ...], dtype: str = _ACT_DTYPE,
             name: str | None = None, order: fo.FloatOrder | None = None, **params) -> Node:
        n = Node(self.g.next_id(), op, tuple(i.id for i in inputs), tuple(shape), dtype, name, order, params)
        return self.g.add(n)

    def _input(self, name: str, shape, dtype) -> Node:
        """A graph input, made once (asking again gives the same node)."""
        if name not in self._inputs:
            self._inputs[name] = self.node(Op.INPUT, (), shape, dtype, input=name,
                                           name=f"attn_inp_{name}" if name.startswith("kq_mask") else f"inp_{name}")
        return self._inputs[name]

    def tensor(self, name: str, attr: str | None = None) -> Weight:
        """The file's tensor `name`, or MissingTensor naming it (plan() checked the file against the
        architecture's declared tensors, so a graph asking for one it did not declare fails here)."""
        if name not in self.plan.weight_types:
            raise MissingTensor(f"{attr or name}: tensor {name} is not in the file; the {self.arch.name} graph "
                                "asks for it (declare it in the architecture's tensors)")
        return Weight(name)

    def weight(self, w: Weight) -> Node:
        """The `weight` node of a tensor, made the first time a block reads it."""
        if w.name not in self._weights:
            shape = self.shapes[w.name]
            typ = self.plan.weight_types[w.name]
            self._weights[w.name] = self.node(Op.WEIGHT, (), shape[::-1], ggml_type_name(typ), name=w.name,
                                              tensor=w.name, ggml_type=typ)
        return self._weights[w.name]

    def cb(self, n: Node, name: str, il: int = -1) -> Node:
        """Name a tensor as llama.cpp's cb(cur, name, il) does."""
        renamed = n.replace(name=tensor_name(name, il))
        self.g.nodes[n.id] = renamed
        return renamed

    def output(self, key: str, n: Node) -> None:
        self.g.outputs[key] = n.id

    # ---- graph inputs (llama-graph.cpp build_inp_*) ----
    def inp_pos(self) -> Node:
        """build_inp_pos: the tokens' positions."""
        return self._input("pos", (self.batch.n_tokens,), "i32")

    def inp_out_ids(self) -> Node:
        """build_inp_out_ids: the rows whose logits are wanted."""
        return self._input("out_ids", (self.batch.n_outputs,), "i32")

    def inp_attn(self) -> AttnInput:
        """build_attn_inp_kv: the KQ mask over n_kv cells; the tokens go to the cells of their positions.
        In a batch of sequences (Batch.seqs) each row also has its own cell count, kv_cells."""
        k_idxs, T = self.inp_pos(), self.batch.n_tokens
        cells = self._input("kv_cells", (T,), "i32") if self.batch.seqs else None
        return AttnInput(self._input("kq_mask", (T, self.batch.n_kv), "f16"), k_idxs, kv_cells=cells)

    def inp_attn_iswa(self) -> AttnInput:
        """build_attn_inp_kv_iswa (llama_kv_cache_iswa): inp_attn's mask and, for the sliding-window
        layers (hp.is_swa), their own cache's mask over n_kv_swa cells and the cells find_slot gave
        this micro-batch's tokens."""
        T, n_kv_swa = self.batch.n_tokens, self.batch.n_kv_swa
        if n_kv_swa is None:
            raise BankmlError(f"the {self.arch.name} graph asks for a sliding-window cache, but the model "
                              "has no sliding window (n_swa 0)")
        base = self.inp_attn()
        cells = self._input("kv_cells_swa", (T,), "i32") if self.batch.seqs else None
        return AttnInput(base.kq_mask, base.k_idxs, self._input("kq_mask_swa", (T, n_kv_swa), "f16"),
                         self._input("swa_idxs", (T,), "i32"), base.kv_cells, cells)

    # ---- llama-graph.cpp blocks ----
    def inp_embd(self, tok_embd: Weight, tok_scale: float = 1.0) -> Node:
        """build_inp_embd: get_rows of the token embeddings, named "embd"; with a tok_scale
        other than 1 the rows are multiplied by it (llama.cpp: ggml_mul by the input
        scale_rows, holding tok_scale for every token row: r(x*s), the bits of ggml_scale)
        and that product is "embd"."""
        w = self.weight(tok_embd)
        rows = (self.batch.n_tokens, w.shape[1])
        if tok_scale == 1.0:
            return self.node(Op.GET_ROWS, (w, self.inp_tokens), rows, name="embd")
        cur = self.node(Op.GET_ROWS, (w, self.inp_tokens), rows)
        return self.node(Op.SCALE, (cur,), rows, name="embd", order=fo.SCALE, scale=tok_scale)

    def scale(self, x: Node, s: float) -> Node:
        """ggml_scale(x, s): r(x*s) (an unnamed node, as in llama.cpp)."""
        return self.node(Op.SCALE, (x,), x.shape, order=fo.SCALE, scale=s)

    def norm(self, x: Node, w: Weight, il: int) -> Node:
        """build_norm(LLM_NORM_RMS): rms_norm ("norm-il") then mul by the weight."""
        cur = self.rms_norm(x, self.hp.rms_eps, tensor_name("norm", il))
        return self.mul(cur, w)

    def rms_norm(self, x: Node, eps: float, name: str | None = None) -> Node:
        """ggml_rms_norm(x, eps) over each row."""
        return self.node(Op.RMS_NORM, (x,), x.shape, name=name, order=fo.RMS_NORM, eps=eps)

    def gdn_l2_norm(self, x: Node, eps: float) -> Node:
        """build_gdn_l2_norm (src/models/models.h): rms_norm with eps/n, then times 1/sqrtf(n), for
        rows of n (f32 arithmetic, as the C computes both constants). The scale carries eps as
        l2_eps: the portable profile makes the pair its l2norm (passes/choose_portable_orders.py)."""
        n = np.float32(x.shape[-1])
        rms = self.rms_norm(x, float(np.float32(eps) / n))
        return self.node(Op.SCALE, (rms,), x.shape, order=fo.SCALE, scale=inv_sqrtf(n), l2_eps=eps)

    def mm(self, w: Weight, x: Node) -> Node:
        """build_lora_mm: a plain mul_mat; the pass choose_matmul_kernel gives its order."""
        wn = self.weight(w)
        return self.node(Op.MUL_MAT, (wn, x), (*x.shape[:-1], wn.shape[0]))

    def reshape(self, x: Node, shape: tuple[int, ...]) -> Node:
        """ggml_reshape_*: named "<x's name> (reshaped)" as ggml names it."""
        return self.node(Op.RESHAPE, (x,), shape, name=f"{x.name} (reshaped)" if x.name else None)

    def qkv(self, cur: Node, L: Layer, il: int) -> tuple[Node, Node, Node]:
        """build_qkv with separate wq/wk/wv: mul_mat, cb, reshape_3d, cb."""
        hp, T = self.hp, self.batch.n_tokens
        out = []
        for w, nm, heads in (("attn_q", "Qcur", hp.n_head), ("attn_k", "Kcur", hp.n_head_kv),
                             ("attn_v", "Vcur", hp.n_head_kv)):
            t = self.cb(self.mm(getattr(L, w), cur), nm, il)
            out.append(self.cb(self.reshape(t, (T, heads, hp.head_dim)), nm, il))
        return out[0], out[1], out[2]

    def rope(self, x: Node, pos: Node, freq_base: float | None = None, freq_scale: float | None = None,
             mode: str | None = None) -> Node:
        """ggml_rope_ext(x, inp_pos) with the model's (or YaRN-derived) parameters; a layer may pass
        its own base and scale (hp.get_rope_freq_base/_scale: llama_model's, for sliding-window layers).
        It turns hp.n_rot dims of each head (all when 0) and copies the rest."""
        hp = self.hp
        freq_base = hp.rope_freq_base if freq_base is None else freq_base
        freq_scale = hp.rope_freq_scale if freq_scale is None else freq_scale
        return self.node(Op.ROPE, (x, pos), x.shape, order=fo.ROPE, mode=mode or hp.rope_type,
                         n_dims=hp.n_rot or hp.head_dim, n_ctx_orig=hp.yarn_orig_ctx, freq_base=freq_base,
                         freq_scale=freq_scale, ext_factor=hp.yarn_ext_factor,
                         attn_factor=hp.yarn_attn_factor, beta_fast=hp.yarn_beta_fast,
                         beta_slow=hp.yarn_beta_slow)

    def rope_multi(self, x: Node, pos: Node, sections: tuple[int, ...]) -> Node:
        """ggml_rope_multi(x, inp_pos, sections) (LLAMA_ROPE_TYPE_IMROPE) on text tokens. llama.cpp
        gives a text token the four positions [p, p, p, 0]; where every rotated pair takes one of
        the first three (mrope_text_refusal: the plan refuses other sections), ggml_mrope_cache_init
        steps theta_t, theta_h and theta_w by theta_scale from p as ggml_rope_cache_init steps
        theta, and rope_multi turns pairs (k, k + n_rot/2): the bits of NEOX rope over n_rot dims."""
        why = mrope_text_refusal(sections, self.hp.n_rot or self.hp.head_dim)
        if why:
            raise BankmlError(why)
        return self.rope(x, pos, mode="neox")

    def inp_mem_hybrid(self) -> AttnInput:
        """build_inp_mem_hybrid: the attention layers' input (inp_attn: their K/V cells); the
        recurrent layers read their states (recurrent_state)."""
        return self.inp_attn()

    def recurrent_state(self, il: int, kind: str, shape: tuple[int, ...]) -> Node:
        """Layer il's recurrent state of one sequence, f32 (llama_memory_recurrent's r_l, kind "conv",
        or s_l, kind "ssm"): zeros at the sequence's start; the op that reads it leaves it updated."""
        return self.node(Op.CACHE, (), shape, "f32", layer=il, kind=kind)

    def attn(self, inp: AttnInput, wo: Weight | None, q: Node, k: Node, v: Node, kq_scale: float, il: int) -> Node:
        """build_attn with the K/V cache and flash attention: the Hadamard rotations of a quantized
        cache (Q and K by rot_k, V by rot_v), set_rows into the cache, flash_attn_ext over the n_kv
        cells, reshape "kqv_out-il", V's rotation undone (the same transform), then wo. Through an
        iSWA input a sliding-window layer (hp.is_swa) writes and reads its own cache: the cells
        find_slot gave its tokens, n_kv_swa of them read through the SWA mask. Without wo (None,
        as qwen35 passes nullptr) the attention's output rows are returned. In a batch of sequences
        (Batch.seqs) each row writes and reads its own sequence's cache (the CACHE node is one per
        row, param seqs), the first of its own kv_cells (the flash_attn node's fifth input)."""
        hp, b, kv = self.hp, self.batch, self.kv
        swa = inp.kq_mask_swa is not None and hp.is_swa(il)
        mask, idxs, cells = ((inp.kq_mask_swa, inp.k_idxs_swa, inp.kv_cells_swa) if swa
                             else (inp.kq_mask, inp.k_idxs, inp.kv_cells))
        if kv.rot_k:
            q = self.hadamard(q, kv.rot_k, self._ggml_name(il, "q"))
        if kv.rot_v:
            v = self.hadamard(v, kv.rot_v, self._ggml_name(il, "v"))
        if kv.rot_k:
            k = self.hadamard(k, kv.rot_k, self._ggml_name(il, "k"))
        kv_shape = (b.n_kv_swa if swa else b.n_kv, hp.n_head_kv, hp.head_dim)
        caches = []
        for kind, x, typ in (("k", k, kv.k), ("v", v, kv.v)):
            seqs = {"seqs": True} if b.seqs else {}
            cache = self.node(Op.CACHE, (), kv_shape, typ, layer=il, kind=kind,
                              cells=b.kv_size_swa if swa else b.kv_size, **seqs)
            caches.append(self.node(Op.SET_ROWS, (cache, x, idxs), kv_shape, typ,
                                    name=f"cache_{kind}_l{il} (view)", order=_SET_ROWS[typ]))
        fa_in = (q, caches[0], caches[1], mask) + ((cells,) if b.seqs else ())
        fa = self.node(Op.FLASH_ATTN, fa_in, q.shape, scale=kq_scale)
        cur = self.cb(self.reshape(fa, (b.n_tokens, hp.n_head * hp.head_dim)), "kqv_out", il)
        if kv.rot_v:
            cur = self.hadamard(cur, kv.rot_v, self._ggml_name(il, "kqv"))
        return cur if wo is None else self.mm(wo, cur)

    def hadamard(self, x: Node, n: int, name: str | None) -> Node:
        """llama_mul_mat_hadamard (src/llama-impl.h): rows of n values times the Walsh-Hadamard
        matrix, which ggml-cpu computes as ggml_compute_forward_fwht (mul_mat's Hadamard hint)."""
        return self.node(Op.HADAMARD, (x,), x.shape, name=name, order=fo.FWHT, n=n)

    def _ggml_name(self, il: int, which: str) -> str | None:
        """ggml's name of the Hadamard mul_mat of Q, V, K or kqv_out in layer il ("node_<index>"),
        counted as build_attn adds nodes: Q's chain (and its rotation: reshape_2d, mul_mat,
        reshape_4d), V's, K's, the cache writes and flash_attn_ext, kqv_out (and its rotation)."""
        layout = self.arch.ggml_layout
        if layout is None:
            return None
        q_chain, k_chain = layout
        rk, rv = 3 * bool(self.kv.rot_k), 3 * bool(self.kv.rot_v)
        at = {"q": q_chain + 1}
        at["v"] = q_chain + rk + 2 + 1
        at["k"] = q_chain + rk + 2 + rv + k_chain + 1
        at["kqv"] = q_chain + rk + 2 + rv + k_chain + rk + _GGML_ATTN + 1 + 1
        per_layer = q_chain + rk + 2 + rv + k_chain + rk + _GGML_ATTN + 1 + rv + _GGML_TAIL
        return f"node_{4 + il * per_layer + at[which]}"

    def get_rows(self, x: Node, ids: Node) -> Node:
        """ggml_get_rows of f32 rows: the output rows through the last layer (inp_out_ids)."""
        return self.node(Op.GET_ROWS, (x, ids), (ids.shape[0], *x.shape[1:]))

    def add(self, a: Node, b: Node | Weight) -> Node:
        """ggml_add(a, b); b may be one row (a weight: a bias), repeated over a's rows."""
        return self.node(Op.ADD, (a, self._operand(b)), a.shape, order=fo.ELEMENTWISE)

    def mul(self, a: Node, b: Node | Weight) -> Node:
        """ggml_mul(a, b); b may be one row (a weight: a norm's or ssm_a), repeated over a's rows."""
        return self.node(Op.MUL, (a, self._operand(b)), a.shape, order=fo.ELEMENTWISE)

    def _operand(self, x: Node | Weight) -> Node:
        return self.weight(x) if isinstance(x, Weight) else x

    def slice(self, x: Node, lo: int, hi: int) -> Node:
        """Columns [lo, hi) of every row of x, a copy: what a ggml_view_* of each row's part holds
        (llama.cpp's q/k/v of the conv output, Qwen3.5's query and gate halves)."""
        return self.node(Op.SLICE, (x,), (*x.shape[:-1], hi - lo), lo=lo, hi=hi)

    def view_3d(self, x: Node, ne0: int, ne1: int, nb1: int, offset: int) -> Node:
        """ggml_view_3d(x, ne0, ne1, n_tokens, nb1, nb1 * ne1, offset) of rows x [T, nb1 * ne1], strides
        and offset counted in elements: ne1 pieces of ne0 values, piece h at h * nb1 + offset of the
        row, copied (a reshape to [T, ne1, nb1], then each piece's columns)."""
        rows = self.node(Op.RESHAPE, (x,), (x.shape[0], ne1, nb1))
        return self.slice(rows, offset, offset + ne0)

    def silu(self, x: Node) -> Node:
        """ggml_silu(x): x / (1 + expf(-x)) (ggml_v_silu on 8-lane chunks of each row)."""
        return self.node(Op.SILU, (x,), x.shape, order=fo.SILU)

    def sigmoid(self, x: Node) -> Node:
        """ggml_sigmoid(x): 1 / (1 + expf(-x))."""
        return self.node(Op.SIGMOID, (x,), x.shape, order=fo.SIGMOID)

    def softplus(self, x: Node) -> Node:
        """ggml_softplus(x): x past 20, else logf(1 + expf(x))."""
        return self.node(Op.SOFTPLUS, (x,), x.shape, order=fo.SOFTPLUS)

    def ssm_conv(self, x: Node, w: Weight, state: Node) -> Node:
        """ggml_ssm_conv over ggml_concat(conv state, x^T): x [T, ch] after the state cache
        [ch, d_conv-1], each channel by its row of w; the cache keeps the last d_conv-1 columns."""
        return self.node(Op.SSM_CONV, (x, self.weight(w), state), x.shape, order=fo.SSM_CONV)

    def gated_delta_net(self, q: Node, k: Node, v: Node, g: Node, beta: Node, state: Node) -> Node:
        """ggml_gated_delta_net (the fused op b11434 runs for every token count): [T, Hv, S]; the
        state cache [Hv, S, S] is left at the new state."""
        return self.node(Op.GATED_DELTA_NET, (q, k, v, g, beta, state), v.shape, order=fo.GATED_DELTA_NET)

    def swiglu(self, gate: Node, up: Node) -> Node:
        """ggml_swiglu_split(gate, up): silu(gate) * up."""
        return self.node(Op.SWIGLU, (gate, up), gate.shape, order=fo.SWIGLU)

    def geglu(self, gate: Node, up: Node) -> Node:
        """ggml_geglu_split(gate, up): gelu(gate) * up (ggml's f16 GELU table)."""
        return self.node(Op.GEGLU, (gate, up), gate.shape, order=fo.GEGLU)

    def ffn(self, cur: Node, L: Layer, il: int, act: str = "silu") -> Node:
        """build_ffn(LLM_FFN_SILU or LLM_FFN_GELU, LLM_FFN_PAR): up, gate, swiglu(gate, up) or
        geglu(gate, up), down."""
        up = self.cb(self.mm(L.ffn_up, cur), "ffn_up", il)
        gate = self.cb(self.mm(L.ffn_gate, cur), "ffn_gate", il)
        if act == "gelu":
            cur = self.cb(self.geglu(gate, up), "ffn_geglu", il)
        else:
            cur = self.cb(self.swiglu(gate, up), "ffn_swiglu", il)
        return self.mm(L.ffn_down, cur)
