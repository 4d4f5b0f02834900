"""llm_build_gemma3 (src/models/gemma3.cpp, graph<iswa>), line for line, and its declaration:
the keys `llama_model_gemma3::load_arch_hparams` reads and the tensors `load_arch_tensors`
creates.

Gemma 3 in llama.cpp b11434:
- embeddings times sqrtf(n_embd) (build_inp_embd's tok_scale, an f32 multiply), named "inp_scaled";
- per-head Q/K rms norms before RoPE (NEOX), then Q times f_attention_scale (ggml_scale;
  1/sqrtf(head size), or 1/sqrtf(n_embd/n_head) for the 62-layer 27B) and attention scale 1;
- sliding-window layers (is_swa: layer il % pattern < pattern - 1, pattern 6 unless the file
  says) read their own cache through a window mask (a key at p0 is hidden from p1 when
  p1 - p0 >= n_swa) and rope with rope.freq_base_swa (default 10000) and scale 1; the
  other layers use the model's rope base and scaling;
- rms norms after attention (attn_post_norm) and after the FFN (ffn_post_norm, whose rms_norm
  is named "norm" without a layer: build_norm(..., -1));
- a GELU-gated FFN (ggml_geglu_split: the f16 GELU table), tied output by default.
The norm weights in a GGUF already hold Gemma's (1 + w): the graph multiplies by them.
"""
from __future__ import annotations

import numpy as np

from bankml.arch import COMMON_REFUSALS, Builder, Key, architecture, llama_tensors

KEYS = (
    Key("attention.sliding_window", "u32", default=0),              # n_swa; absent or 0: no SWA (graph<false>)
    Key("attention.sliding_window_pattern", "u32_or_array", default=6),  # load_swa_pattern(ml, 6)
    Key("rope.freq_base_swa", "f32", default=10000.0),               # rope_freq_base_train_swa
    Key("final_logit_softcapping", "f32", default=0.0),
)

REFUSE = COMMON_REFUSALS + (
    (r"^dense_[23]_out\.", "EmbeddingGemma's dense output layers are not reproduced by bankml"),
)


def gemma3_tensors(hp):
    """llama's tensors plus Q/K norms and the two post norms (post_attention_norm, post_ffw_norm)."""
    return llama_tensors(hp, lambda il: {"attn_q_norm": ((hp.head_dim,), "norm"),
                                         "attn_k_norm": ((hp.head_dim,), "norm"),
                                         "post_attention_norm": ((hp.n_embd,), "norm"),
                                         "post_ffw_norm": ((hp.n_embd,), "norm")})


def derive(hp, refuse) -> dict:
    """load_arch_hparams: the sliding-window layers, the Q scale, the softcap (refused if set)."""
    f32 = np.float32
    x = hp.extra
    if x["final_logit_softcapping"]:
        raise refuse(f"key gemma3.final_logit_softcapping is {x['final_logit_softcapping']}: "
                     "logit softcapping (tanh) is not reproduced by bankml")
    n_swa = x["attention.sliding_window"]
    swa_layers: tuple[bool, ...] = ()
    if n_swa > 0:
        pattern = x["attention.sliding_window_pattern"]
        if isinstance(pattern, tuple):                      # ml.get_arr: one flag per layer
            if len(pattern) != hp.n_layer:
                raise refuse(f"key gemma3.attention.sliding_window_pattern has {len(pattern)} entries "
                             f"for {hp.n_layer} layers")
            swa_layers = tuple(bool(v) for v in pattern)
        else:                                               # set_swa_pattern(n_pattern, dense_first=false)
            swa_layers = tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(hp.n_layer))
    # f_attention_scale: LLM_TYPE_27B (62 layers) uses n_embd / n_head, others the head size
    size = hp.n_embd // hp.n_head if hp.n_layer == 62 else hp.head_dim
    q_scale = f32(1.0) / np.sqrt(f32(size))
    return {"n_swa": n_swa if swa_layers else 0, "swa_layers": swa_layers, "attention_scale": float(q_scale),
            "rope_freq_base_swa": float(f32(x["rope.freq_base_swa"])), "rope_freq_scale_swa": 1.0}


@architecture("gemma3", rope_type="neox", keys=KEYS, tensors=gemma3_tensors, refuse=REFUSE, derive=derive)
def build_gemma3(b: Builder) -> None:
    hp, model = b.hp, b.model
    iswa = hp.n_swa > 0                     # graph<iswa>: LLAMA_SWA_TYPE_STANDARD

    # the graph inputs first (llama.cpp's are leafs, apart from its nodes; bankml numbers them first)
    inp_pos = b.inp_pos()
    inp_attn = b.inp_attn_iswa() if iswa else b.inp_attn()
    inp_out_ids = b.inp_out_ids()

    inpL = b.inp_embd(model.tok_embd, float(np.sqrt(np.float32(hp.n_embd))))
    inpL = b.cb(inpL, "inp_scaled")

    for il in range(hp.n_layer):
        L = model.layers[il]
        if iswa:
            freq_base_l, freq_scale_l = hp.get_rope_freq_base(il), hp.get_rope_freq_scale(il)
        else:
            freq_base_l, freq_scale_l = hp.rope_freq_base, hp.rope_freq_scale

        cur = b.cb(b.norm(inpL, L.attn_norm, il), "attn_norm", il)

        Qcur, Kcur, Vcur = b.qkv(cur, L, il)

        Qcur = b.cb(b.norm(Qcur, L.attn_q_norm, il), "Qcur_normed", il)
        Qcur = b.rope(Qcur, inp_pos, freq_base_l, freq_scale_l)

        Kcur = b.cb(b.norm(Kcur, L.attn_k_norm, il), "Kcur_normed", il)
        Kcur = b.rope(Kcur, inp_pos, freq_base_l, freq_scale_l)

        Qcur = b.cb(Qcur, "Qcur", il)
        Kcur = b.cb(Kcur, "Kcur", il)
        Vcur = b.cb(Vcur, "Vcur", il)

        Qcur = b.scale(Qcur, hp.attention_scale)

        cur = b.attn(inp_attn, L.attn_output, Qcur, Kcur, Vcur, 1.0, il)

        if il == hp.n_layer - 1:
            cur = b.get_rows(cur, inp_out_ids)
            inpL = b.get_rows(inpL, inp_out_ids)

        cur = b.cb(b.norm(cur, L.post_attention_norm, il), "attn_post_norm", il)

        sa_out = b.cb(b.add(cur, inpL), "sa_out", il)

        cur = b.cb(b.norm(sa_out, L.ffn_norm, il), "ffn_norm", il)

        cur = b.cb(b.ffn(cur, L, il, act="gelu"), "ffn_out", il)

        cur = b.cb(b.norm(cur, L.post_ffw_norm, -1), "ffn_post_norm", il)

        cur = b.cb(b.add(cur, sa_out), "l_out", il)

        inpL = cur

    cur = b.cb(b.norm(inpL, model.output_norm, -1), "result_norm")
    b.output("embd", cur)                                    # res->t_embd
    cur = b.cb(b.mm(model.output, cur), "result_output")
    b.output("logits", cur)
