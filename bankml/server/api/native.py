"""llama-server's own /completion API (tools/server/server-task.cpp to_json_non_oaicompat).

    POST /completion {"prompt": ..., "n_predict": 8, "n_probs": 3}
      -> {"content", "tokens", "stop": true, "completion_probabilities": [...], "generation_settings", ...}

The request takes the same fields as the OpenAI routes (server/fields.py). A streamed answer is
one `data:` object per token ({"content", "tokens": [id], "stop": false, ...} with that token's
completion_probabilities), then the final object with an empty content, and no [DONE].
"""
from __future__ import annotations

from bankml.runtime.sampler import c_float
from bankml.server.engine import Prob, Result
from bankml.server.api.openai import probs_json

_SETTINGS = (("temperature", "temp"), ("dynatemp_range", None), ("dynatemp_exponent", None), ("top_k", None),
             ("top_p", None), ("min_p", None), ("top_n_sigma", None), ("xtc_probability", None),
             ("xtc_threshold", None), ("typical_p", None), ("repeat_last_n", None), ("repeat_penalty", None),
             ("presence_penalty", None), ("frequency_penalty", None), ("dry_multiplier", None), ("dry_base", None),
             ("dry_allowed_length", None), ("dry_penalty_last_n", None), ("mirostat", None), ("mirostat_tau", None),
             ("mirostat_eta", None))


def generation_settings(job: dict, stream: bool) -> dict:
    """task_params::to_json: the sampling settings the request ran with (those bankml keeps);
    job: the request's fields (fields.job_fields)."""
    p = job["params"]
    out = {"seed": job["seed"]}
    for name, field in _SETTINGS:
        field = field or name
        v = getattr(p, field)
        out[name] = c_float(v) if isinstance(v, float) else v
    out.update({"max_tokens": job["n_predict"], "n_predict": job["n_predict"], "stream": stream,
                "n_probs": job["n_probs"], "min_keep": p.min_keep,
                "samplers": list(p.samplers),
                "post_sampling_probs": job["post_sampling_probs"], "grammar": job.get("grammar_text", "")})
    return out


def partial(r_tokens_so_far: int, n_prompt: int, text: str, tok: int, prob: Prob | None, post: bool, piece,
            index: int = 0, id_slot: int = 0) -> dict:
    """server_task_result_cmpl_partial::to_json_non_oaicompat (index: the completion's, of n_cmpl;
    id_slot: the slot that ran it)."""
    out = {"index": index, "content": text, "tokens": [tok], "stop": False, "id_slot": id_slot,
           "tokens_predicted": r_tokens_so_far, "tokens_evaluated": n_prompt}
    if prob is not None and prob.probs.top:
        out["completion_probabilities"] = probs_json([prob], post, piece)
    return out


def final(r: Result, job: dict, model_name: str, prompt_text: str, stream: bool, piece,
          return_tokens: bool = False, index: int = 0, id_slot: int = 0) -> dict:
    """server_task_result_cmpl_final::to_json_non_oaicompat (tokens with return_tokens; index: the
    completion's, of n_cmpl)."""
    out = {"index": index, "content": "" if stream else r.text,
           "tokens": list(r.tokens) if return_tokens and not stream else [],
           "id_slot": id_slot, "stop": True, "model": model_name, "tokens_predicted": len(r.tokens),
           "tokens_evaluated": r.n_prompt, "generation_settings": generation_settings(job, stream),
           "prompt": prompt_text, "has_new_line": "\n" in r.text, "truncated": False, "stop_type": r.stop_type,
           "stopping_word": r.stopping_word, "tokens_cached": r.n_prompt + max(len(r.tokens) - 1, 0),
           "timings": r.timings()}
    entries = r.final_probs(stream)
    if not stream and entries:
        out["completion_probabilities"] = probs_json(entries, job["post_sampling_probs"], piece)
    return out
