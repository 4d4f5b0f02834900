"""An architecture defined outside bankml, registered with its whole declaration, run end to end.

`my_llama` is Llama written out by hand from the DSL's primitives (no `b.ffn`, no `b.qkv`):
the feed-forward is spelled as three mul_mats and a swiglu. It reads the layer weights as
attributes (`L.attn_q` is the file's blk.{il}.attn_q.weight, checked against the file) and asks
for the graph inputs it uses (positions, the attention input, the output rows). Its registration declares
what plan() checks a file against (bankml/arch/registry.py): the keys its load_arch_hparams
reads (here one optional key, with llama.cpp's default), the tensors it requires with their
shapes from the hyper-parameters, the tensors it refuses and why, and its rope type. It runs
SmolLM2 through `bankml.load(..., arch="my_llama")` (planned by this declaration) and its logits
are compared with the built-in Llama graph (and with llama.cpp when the oracle build is present).

    python examples/custom_architecture.py [MODEL.gguf]
"""
from __future__ import annotations

import math
import sys

import numpy as np

import bankml
from bankml.arch import COMMON_REFUSALS, Builder, Key, architecture


def my_llama_tensors(hp) -> dict:
    """name -> (ne shape as llama.cpp's create_tensor takes it, role: matrix | embed | norm)."""
    q, kv = hp.head_dim * hp.n_head, hp.head_dim * hp.n_head_kv
    out = {"token_embd.weight": ((hp.n_embd, hp.n_vocab), "embed"), "output_norm.weight": ((hp.n_embd,), "norm")}
    if not hp.tied:
        out["output.weight"] = ((hp.n_embd, hp.n_vocab), "embed")
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        out |= {p + "attn_norm.weight": ((hp.n_embd,), "norm"), p + "ffn_norm.weight": ((hp.n_embd,), "norm"),
                p + "attn_q.weight": ((hp.n_embd, q), "matrix"), p + "attn_k.weight": ((hp.n_embd, kv), "matrix"),
                p + "attn_v.weight": ((hp.n_embd, kv), "matrix"), p + "attn_output.weight": ((q, hp.n_embd), "matrix"),
                p + "ffn_gate.weight": ((hp.n_embd, hp.n_ff), "matrix"),
                p + "ffn_up.weight": ((hp.n_embd, hp.n_ff), "matrix"),
                p + "ffn_down.weight": ((hp.n_ff, hp.n_embd), "matrix")}
    return out


@architecture("my_llama", rope_type="norm", keys=(Key("attention.scale", "f32", default=0.0),),
              tensors=my_llama_tensors,
              refuse=COMMON_REFUSALS + ((r"attn_[qk]_norm", "my_llama has no Q/K norms"),))
def build_my_llama(b: Builder) -> None:
    hp, model = b.hp, b.model
    kq_scale = 1.0 / math.sqrt(hp.head_dim)
    T = b.batch.n_tokens

    inp_pos = b.inp_pos()
    inp_attn = b.inp_attn()
    inp_out_ids = b.inp_out_ids()

    inpL = b.inp_embd(model.tok_embd)
    for il in range(hp.n_layer):
        L = model.layers[il]
        inpSA = inpL
        cur = b.cb(b.norm(inpL, L.attn_norm, il), "attn_norm", il)

        q = b.cb(b.reshape(b.cb(b.mm(L.attn_q, cur), "Qcur", il), (T, hp.n_head, hp.head_dim)), "Qcur", il)
        k = b.cb(b.reshape(b.cb(b.mm(L.attn_k, cur), "Kcur", il), (T, hp.n_head_kv, hp.head_dim)), "Kcur", il)
        v = b.cb(b.reshape(b.cb(b.mm(L.attn_v, cur), "Vcur", il), (T, hp.n_head_kv, hp.head_dim)), "Vcur", il)
        q = b.cb(b.rope(q, inp_pos), "Qcur", il)
        k = b.cb(b.rope(k, inp_pos), "Kcur", il)
        cur = b.cb(b.attn(inp_attn, L.attn_output, q, k, v, kq_scale, il), "attn_out", il)

        if il == hp.n_layer - 1:
            cur, inpSA = b.get_rows(cur, inp_out_ids), b.get_rows(inpSA, inp_out_ids)
        ffn_inp = b.cb(b.add(cur, inpSA), "ffn_inp", il)

        cur = b.cb(b.norm(ffn_inp, L.ffn_norm, il), "ffn_norm", il)
        up = b.cb(b.mm(L.ffn_up, cur), "ffn_up", il)
        gate = b.cb(b.mm(L.ffn_gate, cur), "ffn_gate", il)
        act = b.cb(b.swiglu(gate, up), "ffn_swiglu", il)
        cur = b.cb(b.mm(L.ffn_down, act), "ffn_out", il)
        inpL = b.cb(b.add(cur, ffn_inp), "l_out", il)

    cur = b.cb(b.norm(inpL, model.output_norm, -1), "result_norm")
    b.output("logits", b.cb(b.mm(model.output, cur), "result_output"))


def main() -> int:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from bankml.runtime.default_model import default_model_path
        path = default_model_path()
    mine = bankml.load(path, arch="my_llama", threads=2)
    builtin = bankml.load(path, threads=2)
    ids = mine.tokenize("The capital of France is", add_special=True, parse_special=True)
    a = mine.session().prefill(ids, outputs="all")
    b = builtin.session().prefill(ids, outputs="all")
    same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    print(f"planned as {mine.plan.arch} (attention.scale {mine.hparams.extra['attention.scale']})")
    print(f"my_llama: {len(ids)} prompt tokens, next token {int(a[-1].argmax())}; "
          f"equal to the built-in llama graph: {same}")
    try:
        from bankml import oracle
        if oracle.is_built():
            ref = oracle.logits(path, ids, threads=2)
            print(f"equal to llama.cpp: {np.array_equal(a.view(np.uint32), ref.view(np.uint32))}")
            same = same and np.array_equal(a.view(np.uint32), ref.view(np.uint32))
    except ImportError:
        pass
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
