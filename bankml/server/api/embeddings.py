"""Embeddings as llama-server --embeddings answers them (server-context.cpp handle_embeddings_impl,
format_embeddings_response_oaicompat), and Ollama's /api/embed shape over the same vectors.

    POST /v1/embeddings {"input": "text" | ["a", "b"] | [ids] | [[ids], "b"], "encoding_format": "float"}
      -> {"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
          "data": [{"embedding": [...] (or base64 of the f32 bytes), "index": i, "object": "embedding"}]}
    POST /embedding, /embeddings {"content": ..., "embd_normalize": 2}
      -> [{"index": i, "embedding": [[...]]}]        (pooling none: each token's row, not normalised)
    POST /api/embed {"input": "text" | ["a", "b"]} -> {"model", "embeddings": [[...]], "prompt_eval_count", ...}

Each input is tokenized with BOS and special tokens (tokenize_input_subprompt(..., true, true)); an
array of ids is one input, an array without ids is one input per element. The vectors: the pooled
final-norm row normalised by common_embd_normalize (runtime/embeddings.py).
"""
from __future__ import annotations

import base64

import numpy as np

from bankml.server.api.openai import known_ids
from bankml.server.api.utility import tokenize_mixed
from bankml.server.fields import BadRequest, _json_type, i32

POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}     # llama_pooling_type
NOT_STARTED = "This server does not support embeddings. Start it with `--embeddings`"


def model_pooling(model) -> str:
    """The header's {arch}.pooling_type (llama_model_loader's hparams.pooling_type); none if absent."""
    v = model.gguf.metadata.get(f"{model.plan.arch}.pooling_type")
    return POOLING_TYPES.get(int(v), "none") if v is not None else "none"


def _has_ids(v) -> bool:
    """json_is_array_and_contains_numbers: an array with an integer in it."""
    return isinstance(v, list) and any(isinstance(t, int) and not isinstance(t, bool) for t in v)


def inputs(model, prompt) -> list[list[int]]:
    """tokenize_input_prompts as the embeddings route calls it: each input's tokens."""
    parts = prompt if isinstance(prompt, list) and not _has_ids(prompt) else [prompt]
    out = []
    for p in parts:
        if isinstance(p, dict):
            raise BadRequest("bankml embeds text and token ids; content parts are not served")
        if not isinstance(p, (str, list)):
            raise BadRequest("\"input\" must be a string, an array of strings or of token ids")
        out.append(known_ids(model, tokenize_mixed(model, p, True, True), " in the input"))
    if not out:
        raise BadRequest("\"input\" must not be empty")
    if any(not ids for ids in out):
        raise BadRequest("Input content cannot be empty")
    return out


def request(model, body: dict) -> tuple[list[list[int]], bool, int | None]:
    """(each input's tokens, base64, embd_normalize or None) of an embeddings request."""
    if "input" in body:
        prompt = body["input"]
    elif "content" in body:
        prompt = body["content"]
    else:
        raise BadRequest("\"input\" or \"content\" must be provided")
    use_base64 = False
    if "encoding_format" in body:
        fmt = body["encoding_format"]
        if fmt == "base64":
            use_base64 = True
        elif fmt != "float":
            raise BadRequest("The format to return the embeddings in. Can be either float or base64")
    norm = None
    if "embd_normalize" in body:
        v = body["embd_normalize"]
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise BadRequest(f"[json.exception.type_error.302] type must be number, but is {_json_type(v)}", 500,
                             "server_error")
        norm = i32(v)
    return inputs(model, prompt), use_base64, norm


def oai_response(body: dict, model_name: str, vectors: list[np.ndarray], n_tokens: int, use_base64: bool) -> dict:
    def entry(i, v):
        if use_base64:
            return {"embedding": base64.b64encode(np.asarray(v, "<f4").tobytes()).decode(), "index": i,
                    "object": "embedding", "encoding_format": "base64"}
        return {"embedding": np.asarray(v).tolist(), "index": i, "object": "embedding"}
    data = [entry(i, v) for i, v in enumerate(vectors)]
    name = body["model"] if isinstance(body.get("model"), str) else model_name
    return {"model": name, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "data": data}


def native_response(vectors: list[np.ndarray]) -> list[dict]:
    """server_task_result_embd::to_json_non_oaicompat: a pooled vector as a list of one."""
    return [{"index": i, "embedding": (v if v.ndim == 2 else v[None, :]).tolist()} for i, v in enumerate(vectors)]


def ollama_inputs(model, body: dict) -> list[list[int]]:
    prompt = body.get("input")
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
        raise BadRequest("invalid input type")
    return inputs(model, prompt) if prompt else []


def ollama_response(model_name: str, vectors: list[np.ndarray], n_tokens: int, t_total_ns: int) -> dict:
    return {"model": model_name, "embeddings": [np.asarray(v).tolist() for v in vectors],
            "total_duration": t_total_ns, "load_duration": 0, "prompt_eval_count": n_tokens}
