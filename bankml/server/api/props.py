"""llama-server's GET /props (server-context.cpp handle_props): the default generation settings, the
slots, the model file, its chat template and what the template takes, the special tokens; and its
GET /slots (server_slot::to_json(only_metrics), as llama-server answers without --slots-debug).

The template's capabilities are found as llama.cpp's jinja caps_get finds them, by rendering probe
conversations, here by whether a probe's marker reaches the output (llama.cpp also watches which
operations the template applies to a value; on the templates tested, tests/server/test_props.py,
the answers agree). POST /props (changing global properties) is llama-server's 501 without --props,
and bankml has no --props.
"""
from __future__ import annotations

import bankml
from bankml.runtime.chat import chat_template, template_caps
from bankml.server.api.native import generation_settings
from bankml.tokenizer import tokenizer_for

# llama_ftype_name (llama-model-loader.cpp), by general.file_type
FTYPE_NAMES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
               11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium",
               16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 19: "IQ2_XXS - 2.0625 bpw",
               20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small", 22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw",
               24: "IQ1_S - 1.5625 bpw", 25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
               28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw",
               32: "BF16", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary", 38: "MXFP4 MoE",
               39: "NVFP4", 40: "Q1_0", 41: "Q2_0"}
# the ggml type a file of no general.file_type mostly holds -> its ftype (llama_model_loader's guess)
_GUESS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 12,
          "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32, "Q1_0": 40, "Q2_0": 41}


def ftype_name(model) -> str:
    ftype = model.gguf.metadata.get("general.file_type")
    if ftype is not None:
        return FTYPE_NAMES.get(int(ftype), "unknown, may not work")
    from bankml.gguf.reader import ggml_type_name
    return "(guessed) " + FTYPE_NAMES.get(_GUESS.get(ggml_type_name(model.plan.matrix_type), -1), "unknown, may not work")


def default_params(job: dict, stream: bool = False, reasoning_format: str = "none") -> dict:
    """task_params::to_json(only_metrics) of a job (the defaults: fields.job_fields({})), in its order."""
    s = generation_settings(job, stream)
    lead = ("seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
            "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
            "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat",
            "mirostat_tau", "mirostat_eta")
    out = {k: s[k] for k in lead}
    out.update({"adaptive_target": -1.0, "adaptive_decay": 0.8999999761581421, "max_tokens": s["max_tokens"],
                "n_predict": s["n_predict"], "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": stream,
                "n_probs": s["n_probs"], "min_keep": s["min_keep"], "chat_format": "Content-only",
                "reasoning_format": reasoning_format, "reasoning_in_content": False, "generation_prompt": "",
                "samplers": s["samplers"], "speculative.types": "none", "timings_per_token": False,
                "post_sampling_probs": s["post_sampling_probs"], "backend_sampling": False, "lora": []})
    return out


def props(model, model_name: str, n_slots: int, default_job: dict, metrics: bool) -> dict:
    tok = tokenizer_for(model)

    def text(tid):
        return tok.piece(tid).decode("utf-8", "replace") if tid is not None else ""
    source = chat_template(model)
    return {"default_generation_settings": {"params": default_params(default_job), "n_ctx": model.n_ctx},
            "total_slots": n_slots, "model_alias": model_name, "model_ftype": ftype_name(model),
            "model_path": str(model.path), "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": metrics, "ui": True,
            "ui_settings": {}, "chat_template": source, "chat_template_caps": template_caps(source),
            "bos_token": text(tok.bos), "eos_token": text(tok.eos), "build_info": f"bankml-{bankml.__version__}",
            "is_sleeping": False, "cors_proxy_enabled": False}


def slot(s, n_ctx: int) -> dict:
    """One slot: a slot that never ran a task shows its id, size and state; after one, its task's
    id and settings, the tokens its cells hold, and the counters as a finished task leaves them
    (server_slot::reset: no next token, the statistics cleared)."""
    out = {"id": s.id, "n_ctx": n_ctx, "speculative": False, "is_processing": s.busy}
    if s.last is None:
        return out
    id_task, job, stream = s.last
    out.update({"id_task": id_task, "n_prompt_tokens": len(s.tokens), "n_prompt_tokens_processed": 0,
                "n_prompt_tokens_cache": 0, "params": default_params(job, stream, "deepseek"),
                "next_token": [{"has_next_token": s.busy, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]})
    return out
