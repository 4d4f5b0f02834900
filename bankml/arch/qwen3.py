"""llm_build_qwen3 (src/models/qwen3.cpp), line for line."""
from __future__ import annotations

from bankml.arch import COMMON_REFUSALS, Builder, architecture, inv_sqrtf, llama_tensors


def qwen3_tensors(hp):
    """llama's tensors plus the per-head Q/K norms (src/models/qwen3.cpp load_arch_tensors)."""
    return llama_tensors(hp, lambda il: {"attn_q_norm": ((hp.head_dim,), "norm"),
                                         "attn_k_norm": ((hp.head_dim,), "norm")})


@architecture("qwen3", rope_type="neox", tensors=qwen3_tensors, refuse=COMMON_REFUSALS, ggml_layout=(7, 5),
              portable=True)
def build_qwen3(b: Builder) -> None:
    hp, model = b.hp, b.model

    # the graph inputs first (llama.cpp's are leafs, apart from its nodes; bankml numbers them first)
    inp_pos = b.inp_pos()
    inp_attn = b.inp_attn()
    inp_out_ids = b.inp_out_ids()

    inpL = b.inp_embd(model.tok_embd)
    for il in range(hp.n_layer):
        L = model.layers[il]
        inpSA = inpL

        cur = b.cb(b.norm(inpL, L.attn_norm, il), "attn_norm", il)

        Qcur, Kcur, Vcur = b.qkv(cur, L, il)

        Qcur = b.cb(b.norm(Qcur, L.attn_q_norm, il), "Qcur_normed", il)
        Qcur = b.rope(Qcur, inp_pos)

        Kcur = b.cb(b.norm(Kcur, L.attn_k_norm, il), "Kcur_normed", il)
        Kcur = b.rope(Kcur, inp_pos)

        Qcur = b.cb(Qcur, "Qcur", il)
        Kcur = b.cb(Kcur, "Kcur", il)
        Vcur = b.cb(Vcur, "Vcur", il)

        cur = b.attn(inp_attn, L.attn_output, Qcur, Kcur, Vcur, inv_sqrtf(hp.head_dim), il)

        if il == hp.n_layer - 1:
            cur = b.get_rows(cur, inp_out_ids)
            inpSA = b.get_rows(inpSA, inp_out_ids)
        ffn_inp = b.cb(b.add(cur, inpSA), "ffn_inp", il)

        cur = b.cb(b.norm(ffn_inp, L.ffn_norm, il), "ffn_norm", il)
        cur = b.cb(b.ffn(cur, L, il), "ffn_out", il)

        cur = b.cb(b.add(cur, ffn_inp), "l_out", il)
        inpL = cur

    cur = b.cb(b.norm(inpL, model.output_norm, -1), "result_norm")
    b.output("embd", cur)                                    # res->t_embd
    cur = b.cb(b.mm(model.output, cur), "result_output")
    b.output("logits", cur)
