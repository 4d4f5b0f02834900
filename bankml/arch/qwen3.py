"""llm_build_qwen3 (src/models/qwen3.cpp), line for line."""
from __future__ import annotations

from bankml.arch.blocks import Builder
from bankml.arch.registry import COMMON_REFUSALS, architecture, llama_tensors
from bankml.numerics.floats import inv_sqrtf


def qwen3_tensors(hp):
    """llama's tensors plus the per-head Q/K norms (src/models/qwen3.cpp load_arch_tensors)."""
    return llama_tensors(hp, lambda il: {"attn_q_norm": ((hp.head_dim,), "norm"),
                                         "attn_k_norm": ((hp.head_dim,), "norm")})


@architecture("qwen3", rope_type="neox", tensors=qwen3_tensors, refuse=COMMON_REFUSALS)
def build_qwen3(b: Builder) -> None:
    hp = b.hp

    inpL = b.inp_embd("token_embd.weight")
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        inpSA = inpL

        cur = b.cb(b.norm(inpL, p + "attn_norm.weight", il), "attn_norm", il)

        Qcur, Kcur, Vcur = b.qkv(cur, il)

        Qcur = b.cb(b.norm(Qcur, p + "attn_q_norm.weight", il), "Qcur_normed", il)
        Qcur = b.rope(Qcur)

        Kcur = b.cb(b.norm(Kcur, p + "attn_k_norm.weight", il), "Kcur_normed", il)
        Kcur = b.rope(Kcur)

        Qcur = b.cb(Qcur, "Qcur", il)
        Kcur = b.cb(Kcur, "Kcur", il)
        Vcur = b.cb(Vcur, "Vcur", il)

        cur = b.attn(p + "attn_output.weight", Qcur, Kcur, Vcur, inv_sqrtf(hp.head_dim), il)

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
