"""llm_build_llama (src/models/llama.cpp), line for line."""
from __future__ import annotations

from bankml.arch import COMMON_REFUSALS, Builder, architecture, inv_sqrtf, llama_tensors

REFUSE = COMMON_REFUSALS + (
    (r"^blk\.\d+\.attn_[qk]_norm\.", "Q/K norms are used by qwen3, not by llama's graph"),
)


@architecture("llama", rope_type="norm", tensors=llama_tensors, refuse=REFUSE, ggml_layout=(5, 3), portable=True)
def build_llama(b: Builder) -> None:
    hp, model = b.hp, b.model
    kq_scale = inv_sqrtf(hp.head_dim) if hp.attention_scale == 0.0 else hp.attention_scale

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
        Qcur = b.rope(Qcur, inp_pos)
        Kcur = b.rope(Kcur, inp_pos)
        Qcur = b.cb(Qcur, "Qcur", il)
        Kcur = b.cb(Kcur, "Kcur", il)
        Vcur = b.cb(Vcur, "Vcur", il)

        cur = b.attn(inp_attn, L.attn_output, Qcur, Kcur, Vcur, kq_scale, il)
        cur = b.cb(cur, "attn_out", il)

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
