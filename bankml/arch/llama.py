"""llm_build_llama (src/models/llama.cpp), line for line."""
from __future__ import annotations

from bankml.arch.blocks import Builder
from bankml.arch.registry import COMMON_REFUSALS, architecture, llama_tensors
from bankml.numerics.floats import inv_sqrtf

REFUSE = COMMON_REFUSALS + (
    (r"^blk\.\d+\.attn_[qk]_norm\.", "Q/K norms are used by qwen3, not by llama's graph"),
)


@architecture("llama", rope_type="norm", tensors=llama_tensors, refuse=REFUSE)
def build_llama(b: Builder) -> None:
    hp = b.hp
    kq_scale = inv_sqrtf(hp.head_dim) if hp.attention_scale == 0.0 else hp.attention_scale

    inpL = b.inp_embd("token_embd.weight")
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        inpSA = inpL

        cur = b.cb(b.norm(inpL, p + "attn_norm.weight", il), "attn_norm", il)

        Qcur, Kcur, Vcur = b.qkv(cur, il)
        Qcur = b.rope(Qcur)
        Kcur = b.rope(Kcur)
        Qcur = b.cb(Qcur, "Qcur", il)
        Kcur = b.cb(Kcur, "Kcur", il)
        Vcur = b.cb(Vcur, "Vcur", il)

        cur = b.attn(p + "attn_output.weight", Qcur, Kcur, Vcur, kq_scale, il)
        cur = b.cb(cur, "attn_out", il)

        if il == hp.n_layer - 1:
            cur = b.get_rows(cur, b.out_ids)
            inpSA = b.get_rows(inpSA, b.out_ids)
        ffn_inp = b.cb(b.add(cur, inpSA), "ffn_inp", il)

        cur = b.cb(b.norm(ffn_inp, p + "ffn_norm.weight", il), "ffn_norm", il)
        cur = b.cb(b.ffn(cur, il), "ffn_out", il)

        cur = b.cb(b.add(cur, ffn_inp), "l_out", il)
        inpL = cur

    cur = b.cb(b.norm(inpL, "output_norm.weight", -1), "result_norm")
    cur = b.cb(b.mm(b.plan.logits_matrix, cur), "result_output")
    b.output("logits", cur)
