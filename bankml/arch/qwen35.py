"""llm_build_qwen35 (src/models/qwen35.cpp, graph), line for line, and its declaration: the keys
`llama_model_qwen35::load_arch_hparams` reads and the tensors `load_arch_tensors` creates.

Qwen3.5 in llama.cpp b11434 is a hybrid: most layers are Gated-DeltaNet (linear attention with
a recurrent state), every full_attention_interval-th one (or those attention.recurrent_layers
does not flag) gated full attention.
- a recurrent layer: the QKV mix and the output gate z projected; beta = sigmoid(ssm_beta x),
  the decay gate = softplus(ssm_alpha x + ssm_dt) * ssm_a; the QKV mix convolved over the last
  d_conv tokens (ggml_ssm_conv over the conv state and the tokens) through SiLU, split into q,
  k (Hk heads) and v (Hv heads), q and k L2-normed (build_gdn_l2_norm), then the fused
  ggml_gated_delta_net (b11434 runs it for every token count: cparams.fused_gdn_ar/_ch) from
  the SSM state; its output rms-normed per head times ssm_norm, times silu(z), then ssm_out;
- an attention layer: attn_q gives each head's query and gate side by side; Q/K rms norms,
  rope_multi over rope.dimension_count dims (IMROPE), attention with scale 1/sqrtf(head size),
  the output times sigmoid(gate), then attn_output;
- both: pre-norm, a residual, attn_post_norm (post_attention_norm), a SiLU-gated FFN and a
  residual; the final norm over every row ("h_nextn"), then the output rows (result_norm).
The MTP draft head (nextn_predict_layers) is refused.
"""
from __future__ import annotations

from bankml.arch import COMMON_REFUSALS, Builder, Key, architecture, inv_sqrtf, mrope_text_refusal

KEYS = (
    Key("rope.dimension_sections", "u32_or_array", required=True),  # get_key_or_arr(..., 4, true)
    Key("ssm.conv_kernel", "u32", required=True),      # ssm_d_conv
    Key("ssm.inner_size", "u32", required=True),       # ssm_d_inner
    Key("ssm.state_size", "u32", required=True),       # ssm_d_state: head size of q, k and v
    Key("ssm.time_step_rank", "u32", required=True),   # ssm_dt_rank: v heads
    Key("ssm.group_count", "u32", required=True),      # ssm_n_group: q/k heads
    Key("attention.recurrent_layers", "u32_or_array"),  # per-layer flags; else full_attention_interval
    Key("full_attention_interval", "u32", default=4),
    Key("nextn_predict_layers", "u32", default=0),
)

REFUSE = COMMON_REFUSALS + (
    (r"\.nextn\.", "the MTP draft head (nextn) is not reproduced by bankml"),
)

GDN_STATE_STEP = 32       # ggml_vec_dot_f32's 4 x 8-lane steps: bankml's GATED_DELTA_NET takes rows of 32k


def derive(hp, refuse) -> dict:
    """load_arch_hparams: the recurrent layers, the Gated-DeltaNet sizes, the rope sections."""
    x = hp.extra
    if x["nextn_predict_layers"]:
        raise refuse(f"key qwen35.nextn_predict_layers is {x['nextn_predict_layers']}: the MTP layers are "
                     "not reproduced by bankml")
    sections = x["rope.dimension_sections"]
    sections = tuple(sections) if isinstance(sections, tuple) else (sections,)
    if not 0 < hp.n_rot <= hp.head_dim or hp.n_rot % 2:
        raise refuse(f"key qwen35.rope.dimension_count is {hp.n_rot}; rope needs an even count up to the "
                     f"head size {hp.head_dim}")
    why = mrope_text_refusal(sections, hp.n_rot)
    if why:
        raise refuse(f"key qwen35.rope.dimension_sections: {why}")
    d_conv, d_inner, d_state = x["ssm.conv_kernel"], x["ssm.inner_size"], x["ssm.state_size"]
    n_v, n_k = x["ssm.time_step_rank"], x["ssm.group_count"]
    if not (d_conv > 1 and n_v and n_k and n_v % n_k == 0 and d_inner == d_state * n_v):
        raise refuse(f"keys qwen35.ssm.*: conv kernel {d_conv}, inner size {d_inner}, state size {d_state}, "
                     f"{n_v} v heads over {n_k} k heads: needs a kernel of 2 or more, v heads a multiple of "
                     "k heads and inner size = state size x v heads")
    if d_state % GDN_STATE_STEP:
        raise refuse(f"key qwen35.ssm.state_size is {d_state}; bankml's gated_delta_net needs a multiple of "
                     f"{GDN_STATE_STEP}")
    flags = x["attention.recurrent_layers"]
    if flags is None:
        interval = x["full_attention_interval"]
        if interval == 0:
            raise refuse("key qwen35.full_attention_interval is 0")
        recurrent = tuple((il + 1) % interval != 0 for il in range(hp.n_layer))
    elif isinstance(flags, tuple) and len(flags) == hp.n_layer:
        recurrent = tuple(bool(f) for f in flags)
    else:
        raise refuse(f"key qwen35.attention.recurrent_layers must hold one flag for each of {hp.n_layer} layers")
    return {"rope_sections": sections, "recurrent_layers": recurrent, "ssm_d_conv": d_conv,
            "ssm_d_state": d_state, "ssm_n_v_heads": n_v, "ssm_n_k_heads": n_k,
            "ssm_conv_channels": 2 * n_k * d_state + n_v * d_state}


def qwen35_tensors(hp) -> dict:
    """load_block_trunk for every layer: attention layers' Q (query and gate: twice the rows), K,
    V, output and Q/K norms; recurrent layers' QKV mix, z gate, conv kernel (F32), dt bias, A,
    beta, alpha, norm and output; both norms and the FFN everywhere."""
    x = hp.extra
    S, n_v = x["ssm_d_state"], x["ssm_n_v_heads"]
    q, kv, value = hp.head_dim * hp.n_head, hp.head_dim * hp.n_head_kv, S * n_v
    out = {"token_embd.weight": ((hp.n_embd, hp.n_vocab), "embed"), "output_norm.weight": ((hp.n_embd,), "norm")}
    if not hp.tied:
        out["output.weight"] = ((hp.n_embd, hp.n_vocab), "embed")
    for il in range(hp.n_layer):
        blk = f"blk.{il}."
        parts = {"attn_norm.weight": ((hp.n_embd,), "norm"), "post_attention_norm.weight": ((hp.n_embd,), "norm")}
        if hp.is_recr(il):
            parts |= {"attn_qkv.weight": ((hp.n_embd, x["ssm_conv_channels"]), "matrix"),
                      "attn_gate.weight": ((hp.n_embd, value), "matrix"),
                      "ssm_conv1d.weight": ((x["ssm_d_conv"], x["ssm_conv_channels"]), "norm"),
                      "ssm_dt.bias": ((n_v,), "norm"), "ssm_a": ((n_v,), "norm"),
                      "ssm_beta.weight": ((hp.n_embd, n_v), "matrix"),
                      "ssm_alpha.weight": ((hp.n_embd, n_v), "matrix"),
                      "ssm_norm.weight": ((S,), "norm"), "ssm_out.weight": ((value, hp.n_embd), "matrix")}
        else:
            parts |= {"attn_q.weight": ((hp.n_embd, 2 * q), "matrix"), "attn_k.weight": ((hp.n_embd, kv), "matrix"),
                      "attn_v.weight": ((hp.n_embd, kv), "matrix"), "attn_output.weight": ((q, hp.n_embd), "matrix"),
                      "attn_q_norm.weight": ((hp.head_dim,), "norm"), "attn_k_norm.weight": ((hp.head_dim,), "norm")}
        parts |= {"ffn_gate.weight": ((hp.n_embd, hp.n_ff), "matrix"), "ffn_up.weight": ((hp.n_embd, hp.n_ff), "matrix"),
                  "ffn_down.weight": ((hp.n_ff, hp.n_embd), "matrix")}
        out |= {blk + part: spec for part, spec in parts.items()}
    return out


@architecture("qwen35", rope_type="imrope", partial_rope=True, keys=KEYS, tensors=qwen35_tensors,
              refuse=REFUSE, derive=derive, portable=True)
def build_qwen35(b: Builder) -> None:
    hp, model = b.hp, b.model
    x = hp.extra

    inpL = b.inp_embd(model.tok_embd)
    inpL = b.cb(inpL, "model.input_embed")

    inp = b.inp_mem_hybrid()                                 # inp->get_attn(); the states per layer below
    inp_pos = b.inp_pos()
    inp_out_ids = b.inp_out_ids()

    for il in range(hp.n_layer):
        inpSA = inpL

        cur = b.cb(b.norm(inpL, model.layers[il].attn_norm, il), "attn_norm", il)

        if hp.is_recr(il):
            cur = build_layer_attn_linear(b, cur, il)
        else:
            cur = build_layer_attn(b, inp, cur, inp_pos, x["rope_sections"], il)

        cur = b.cb(b.add(cur, inpSA), "attn_residual", il)

        ffn_residual = cur

        attn_post_norm = b.cb(b.norm(cur, model.layers[il].post_attention_norm, il), "attn_post_norm", il)

        cur = b.cb(b.ffn(attn_post_norm, model.layers[il], il), "ffn_out", il)

        cur = b.cb(b.add(cur, ffn_residual), "post_ffn", il)

        cur = b.cb(cur, "l_out", il)

        inpL = cur

    cur = b.cb(b.norm(inpL, model.output_norm, -1), "h_nextn")
    cur = b.cb(b.get_rows(cur, inp_out_ids), "result_norm")
    b.output("embd", cur)                                    # res->t_embd
    cur = b.cb(b.mm(model.output, cur), "result_output")
    b.output("logits", cur)


def build_layer_attn(b: Builder, inp, cur, inp_pos, sections, il: int):
    """graph::build_layer_attn: joint Q and gate projection, Q/K norms, rope_multi, attention,
    the sigmoid gate, wo."""
    hp, L, T = b.hp, b.model.layers[il], b.batch.n_tokens
    n_embd_head = hp.head_dim

    Qcur_full = b.cb(b.mm(L.attn_q, cur), "Qcur_full", il)    # build_qkv(..., reshape = false)
    Kcur = b.cb(b.mm(L.attn_k, cur), "Kcur", il)
    Vcur = b.cb(b.mm(L.attn_v, cur), "Vcur", il)

    Qcur = b.cb(b.view_3d(Qcur_full, n_embd_head, hp.n_head, n_embd_head * 2, 0), "Qcur_reshaped", il)

    Qcur = b.cb(b.norm(Qcur, L.attn_q_norm, il), "Qcur_normed", il)

    Kcur = b.reshape(Kcur, (T, hp.n_head_kv, n_embd_head))
    Kcur = b.cb(b.norm(Kcur, L.attn_k_norm, il), "Kcur_normed", il)

    gate = b.view_3d(Qcur_full, n_embd_head, hp.n_head, n_embd_head * 2, n_embd_head)
    gate = b.cb(b.reshape(gate, (T, hp.n_head * n_embd_head)), "gate_reshaped", il)

    Vcur = b.reshape(Vcur, (T, hp.n_head_kv, n_embd_head))

    Qcur = b.rope_multi(Qcur, inp_pos, sections)
    Kcur = b.rope_multi(Kcur, inp_pos, sections)

    Qcur = b.cb(Qcur, "Qcur", il)
    Kcur = b.cb(Kcur, "Kcur", il)
    Vcur = b.cb(Vcur, "Vcur", il)

    kq_scale = inv_sqrtf(n_embd_head)

    cur = b.cb(b.attn(inp, None, Qcur, Kcur, Vcur, kq_scale, il), "attn_pregate", il)

    gate_sigmoid = b.cb(b.sigmoid(gate), "gate_sigmoid", il)

    cur = b.cb(b.mul(cur, gate_sigmoid), "attn_gated", il)

    return b.cb(b.mm(L.attn_output, cur), "attn_output", il)


def build_layer_attn_linear(b: Builder, cur, il: int):
    """graph::build_layer_attn_linear: the Gated-DeltaNet layer through the fused op."""
    hp, L, T = b.hp, b.model.layers[il], b.batch.n_tokens
    x = hp.extra
    head_k_dim, num_k_heads, num_v_heads = x["ssm_d_state"], x["ssm_n_k_heads"], x["ssm_n_v_heads"]
    head_v_dim = head_k_dim

    qkv_mixed = b.cb(b.mm(L.attn_qkv, cur), "linear_attn_qkv_mixed", il)     # build_qkvz
    z = b.cb(b.mm(L.attn_gate, cur), "z", il)

    beta = b.cb(b.mm(L.ssm_beta, cur), "beta", il)
    beta = b.cb(b.sigmoid(beta), "beta_sigmoid", il)

    alpha = b.cb(b.mm(L.ssm_alpha, cur), "alpha", il)

    alpha_biased = b.add(alpha, b.tensor(f"blk.{il}.ssm_dt.bias"))
    alpha_softplus = b.cb(b.softplus(alpha_biased), "a_softplus", il)

    gate = b.cb(b.mul(alpha_softplus, b.tensor(f"blk.{il}.ssm_a")), "gate", il)   # -A_log.exp() * softplus

    conv_states = b.recurrent_state(il, "conv", (x["ssm_conv_channels"], x["ssm_d_conv"] - 1))  # get_r_l(il)
    state = b.recurrent_state(il, "ssm", (num_v_heads, head_v_dim, head_v_dim))   # get_s_l(il): "state_predelta"

    conv_output_proper = b.cb(b.ssm_conv(qkv_mixed, L.ssm_conv1d, conv_states), "conv_output_raw", il)

    conv_output_silu = b.cb(b.silu(conv_output_proper), "conv_output_silu", il)

    qk = head_k_dim * num_k_heads
    q_conv = b.reshape(b.slice(conv_output_silu, 0, qk), (T, num_k_heads, head_k_dim))
    k_conv = b.reshape(b.slice(conv_output_silu, qk, 2 * qk), (T, num_k_heads, head_k_dim))
    v_conv = b.reshape(b.slice(conv_output_silu, 2 * qk, 2 * qk + head_v_dim * num_v_heads),
                       (T, num_v_heads, head_v_dim))
    q_conv = b.cb(q_conv, "q_conv", il)
    k_conv = b.cb(k_conv, "k_conv", il)
    v_conv = b.cb(v_conv, "v_conv", il)

    q_conv = b.gdn_l2_norm(q_conv, hp.rms_eps)
    k_conv = b.gdn_l2_norm(k_conv, hp.rms_eps)

    q_conv = b.cb(q_conv, "q_conv_predelta", il)
    k_conv = b.cb(k_conv, "k_conv_predelta", il)
    v_conv = b.cb(v_conv, "v_conv_predelta", il)

    output = b.cb(b.gated_delta_net(q_conv, k_conv, v_conv, gate, beta, state), "attn_output", il)

    z_2d = b.reshape(z, (T, num_v_heads, head_v_dim))

    attn_out_norm = b.mul(b.norm(output, L.ssm_norm, il), b.silu(z_2d))     # build_norm_gated

    final_output = b.cb(b.reshape(attn_out_norm, (T, head_v_dim * num_v_heads)), "final_output", il)

    return b.cb(b.mm(L.ssm_out, final_output), "linear_attn_out", il)
