"""The OpenAI API as llama-server b11434 speaks it: request parsing and response shapes.

Shapes follow tools/server/server-task.cpp (to_json_oaicompat, to_json_oaicompat_chat and its
stream chunks); the prompt of a chat request is the model's chat template over `messages`
(oaicompat_chat_params_parse in server-common.cpp), tokenized with special tokens parsed.
"""
from __future__ import annotations

import time

import bankml
from bankml.runtime.chat import ChatTemplateError, chat_template, render_chat, template_caps
from bankml.runtime.probs import logarithm
from bankml.server.api import tools
from bankml.server.engine import Prob, Result, valid_utf8_len
from bankml.server.fields import BadRequest, _json_type, boolean

FINGERPRINT = f"bankml-{bankml.__version__}"


def error_body(message: str, status: int = 400, kind: str = "invalid_request_error") -> dict:
    """format_error_response inside {"error": ...}."""
    return {"error": {"code": status, "message": message, "type": kind}}


def joined(parts: list[str], delimiter: str) -> str:
    """Text parts joined as llama.cpp joins them: a delimiter only after some text."""
    text = ""
    for p in parts:
        if text:
            text += delimiter
        text += p
    return text


def message_parts(msg: dict) -> list[str] | None:
    """A message's text parts when its content is an array of {"type": "text"} parts, else None."""
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return None
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise BadRequest("bankml serves text only: content parts must be {\"type\": \"text\", \"text\": ...}")
            parts.append(p["text"])
        return parts
    raise BadRequest("Expected 'content' to be a string or an array")


def message_text(msg: dict) -> str:
    """A message's content as the template sees it: a string, or its text parts joined by
    newlines (common_chat_msg::to_json_oaicompat)."""
    parts = message_parts(msg)
    return (msg.get("content") or "") if parts is None else joined(parts, "\n")


def chat_messages(body: dict) -> list[dict]:
    if "messages" not in body:
        raise BadRequest("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise BadRequest("Expected 'messages' to be an array")
    out = []
    for msg in messages:
        if not isinstance(msg, dict):
            raise BadRequest("Expected each message to be an object")
        role = msg.get("role") if isinstance(msg.get("role"), str) else ""
        if role != "assistant" and "content" not in msg:
            raise BadRequest("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in msg and "tool_calls" not in msg:
            raise BadRequest("Assistant message must contain either 'content' or 'tool_calls'!")
        parts = message_parts(msg)
        out.append({"role": role, "content": message_text(msg), **_passed(msg)})
        calls = tools.message_calls(msg)
        if calls:
            out[-1]["tool_calls"] = calls
        if parts is not None:       # a continued message's text: its parts joined by blank lines (render_content)
            out[-1]["_continued"] = joined(parts, "\n\n")
    return out


def _passed(msg: dict) -> dict:
    """A message's reasoning_content, name and tool_call_id, as llama.cpp hands them to the template
    (common_chat_msg::to_json_oaicompat: each when not empty)."""
    out = {}
    for key in ("reasoning_content", "name", "tool_call_id"):
        if key in msg:
            v = msg[key]
            if not isinstance(v, str):
                raise BadRequest("Failed to parse messages: [json.exception.type_error.302] type must be string, "
                                 f"but is {_json_type(v)}")
            if v:
                out[key] = v
    return out


def generation_prompt(body: dict) -> bool:
    """add_generation_prompt (json_value: true unless a boolean says otherwise)."""
    v = body.get("add_generation_prompt")
    return v if isinstance(v, bool) else True


def template_variables(body: dict) -> dict:
    """The template's variables a request sets (oaicompat_chat_params_parse): chat_template_kwargs
    (an object; each value as given), enable_thinking from its "enable_thinking" (a boolean; a
    string is refused), reasoning_effort "none" turning thinking off, another effort passed on."""
    kwargs = body.get("chat_template_kwargs")
    out = dict(kwargs) if isinstance(kwargs, dict) else {}
    thinking = out.get("enable_thinking")
    if isinstance(thinking, str):
        raise BadRequest('invalid type for "enable_thinking" (expected boolean, got string)')
    variables = {"enable_thinking": thinking} if isinstance(thinking, bool) else {}
    effort = body.get("reasoning_effort")
    if effort == "none":
        variables["enable_thinking"] = False
        out.pop("reasoning_effort", None)
    elif isinstance(effort, str) and effort:
        out["reasoning_effort"] = effort
    return {**variables, **out}


def chat_inputs(model, body: dict) -> tuple[list[dict], dict, tools.ToolRequest | None]:
    """A chat request's messages, template variables and tools, as common_chat_templates_apply
    hands them to the template: `tools` among the variables when there are some, each call's
    arguments an object where the template reads them so (func_args_not_string)."""
    messages, variables = chat_messages(body), template_variables(body)
    calls = any(m.get("tool_calls") for m in messages)
    if not calls and not body.get("tools") and body.get("tool_choice") in (None, "auto"):
        return messages, variables, None
    caps = template_caps(chat_template(model))
    if calls and caps["supports_object_arguments"]:
        messages = tools.object_arguments(messages)
    req = tools.parse(body, caps["supports_parallel_tool_calls"])
    if req is not None:
        variables = {**variables, "tools": req.tools}
    return messages, variables, req


def chat_text(model, messages: list[dict], add_generation_prompt: bool = True,
              continue_final: str | None = None, variables: dict | None = None) -> str:
    """The rendered conversation (a model without a template: ChatML, as llama-server); variables:
    template_variables of the request."""
    if continue_final is None and messages and messages[-1]["role"] == "assistant" and len(messages) >= 2 \
            and messages[-2]["role"] == "assistant":
        raise BadRequest("Cannot have 2 or more assistant messages at the end of the list.")
    if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
        raise BadRequest("Cannot continue an assistant message that contains tool calls.")
    try:
        return render_chat(model, messages, add_generation_prompt=add_generation_prompt, continue_final=continue_final,
                           **(variables or {}))
    except ChatTemplateError as e:
        raise BadRequest(str(e)) from None


def continuation(body: dict) -> str | None:
    """continue_final_message (common_chat_continuation_parse): true is "auto", "content" and
    "reasoning_content" themselves, anything else none; it needs add_generation_prompt false."""
    v = body.get("continue_final_message")
    mode = "auto" if v is True else v if v in ("content", "reasoning_content") else None
    if mode is not None and generation_prompt(body):
        raise BadRequest("Cannot set both add_generation_prompt and continue_final_message to true.")
    return mode


def chat_prompt(model, messages: list[dict], add_generation_prompt: bool = True,
                continue_final: str | None = None, variables: dict | None = None) -> list[int]:
    """The tokens of the rendered conversation."""
    return model.tokenize(chat_text(model, messages, add_generation_prompt, continue_final, variables),
                          add_special=True, parse_special=True)


def user_starts(model, prompt: list[int]) -> frozenset:
    """Where the chat prompt's user messages start (llama-server's message_spans, from the
    template autoparser's user_start): for ChatML (a file without a template) "<|im_start|>user".
    Another template's delimiter is not derived: no spans (server/checkpoints.py)."""
    from bankml.runtime.chat import has_chat_template
    from bankml.server.checkpoints import user_starts as starts
    if not model.hparams.n_swa or has_chat_template(model):
        return frozenset()
    return frozenset(starts(prompt, model.tokenize("<|im_start|>user", add_special=False, parse_special=True)))


def known_ids(model, ids: list[int], where: str = "") -> list[int]:
    """The ids, or 400 naming the first outside the vocabulary (llama-server answers 500 there);
    where: what holds them (" in the prompt")."""
    n_vocab = model.hparams.n_vocab
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise BadRequest(f"invalid token id {bad}{where} (vocabulary of {n_vocab})")
    return ids


def completion_prompt(model, body: dict) -> list[int]:
    """A /v1/completions prompt: a string, or a list of token ids (one prompt only)."""
    if "prompt" not in body:
        raise BadRequest("\"prompt\" is required", 500, "server_error")
    if boolean(body, "echo", False):
        raise BadRequest("Only no echo is supported", 500, "server_error")
    for p in ("best_of", "suffix"):
        if p in body:
            raise BadRequest(f"Unsupported param: {p}", 500, "server_error")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return model.tokenize(p, add_special=True, parse_special=True)
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return list(known_ids(model, p, " in the prompt"))
    raise BadRequest("\"prompt\" must be a string or a list of tokens (bankml serves one prompt per request)")


def token_text(b: bytes) -> dict:
    """A token as llama-server's probabilities show it: the text of its whole UTF-8 prefix, its bytes."""
    return {"token": b[:valid_utf8_len(b)].decode("utf-8", "replace"), "bytes": list(b)}


def probs_json(entries: list[Prob], post: bool, piece) -> list[dict]:
    """completion_token_output::probs_vector_to_json: each token's id, text, bytes, logprob (or prob
    with post_sampling_probs) and top_logprobs (top_probs) of id, text, bytes, logprob (prob);
    piece(id) is common_token_to_piece(id, special=false)."""
    key, top_key = ("prob", "top_probs") if post else ("logprob", "top_logprobs")
    value = (lambda p: p) if post else logarithm
    out = []
    for e in entries:
        top = [{"id": t, **token_text(piece(t)), key: value(p)} for t, p in e.probs.top]
        out.append({"id": e.probs.tok, **token_text(e.sent), key: value(e.probs.prob), top_key: top})
    return out


def logprobs(entries: list[Prob], post: bool, piece):
    """{"content": [...]} when there are any, else null (OpenAI's default)."""
    return {"content": probs_json(entries, post, piece)} if entries else None


def usage(r: Result) -> dict:
    return {"completion_tokens": len(r.tokens), "prompt_tokens": r.n_prompt,
            "total_tokens": len(r.tokens) + r.n_prompt,
            "prompt_tokens_details": {"cached_tokens": r.n_cached}}


def _head(obj: str, cid: str, model_name: str) -> dict:
    return {"created": int(time.time()), "model": model_name, "system_fingerprint": FINGERPRINT,
            "object": obj, "id": cid}


def chat_response(r: Result, cid: str, model_name: str, post: bool = False, piece=None,
                  calls: list[dict] | None = None) -> dict:
    """The answer; `calls`: the tool calls parsed out of it (r.text then the content before them)."""
    choice = {"finish_reason": r.finish, "index": 0, "message": {"role": "assistant", "content": r.text}}
    if calls:
        choice["message"]["tool_calls"] = calls
        if r.stop_type in ("eos", "word"):
            choice["finish_reason"] = "tool_calls"
    entries = r.final_probs(stream=False)
    if entries:
        choice["logprobs"] = logprobs(entries, post, piece)
    return {"choices": [choice], **_head("chat.completion", cid, model_name), "usage": usage(r),
            "timings": r.timings()}


def indexed(obj: dict, k: int) -> dict:
    """obj (a response or a chunk) as completion k's of n_cmpl: each choice's index is k."""
    for c in obj["choices"]:
        c["index"] = k
    return obj


def chat_chunk(cid: str, model_name: str, delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            **_head("chat.completion.chunk", cid, model_name)}


def chat_token_chunks(cid: str, model_name: str, first: bool, text: str | list[dict], prob: Prob | None,
                      post: bool, piece) -> list[dict]:
    """One token's stream chunks (to_json_oaicompat_chat of a partial result): the role first, the
    text when there is any (or each of a list of deltas: tools.ToolStream's), the token's logprobs
    on the last of them (none when there is none)."""
    out = []
    if first:
        out.append(chat_chunk(cid, model_name, {"role": "assistant", "content": None}))
    for delta in ([{"content": text}] if text else []) if isinstance(text, str) else text:
        out.append(chat_chunk(cid, model_name, delta))
    if out and prob is not None and prob.probs.top:
        out[-1]["choices"][0]["logprobs"] = logprobs([prob], post, piece)
    return out


def chat_final_chunks(r: Result, cid: str, model_name: str, include_usage: bool) -> list[dict]:
    out = [chat_chunk(cid, model_name, {}, r.finish)]
    if include_usage:
        out.append({"choices": [], **_head("chat.completion.chunk", cid, model_name), "usage": usage(r)})
    out[-1]["timings"] = r.timings()
    return out


def text_response(r: Result, cid: str, model_name: str, post: bool = False, piece=None) -> dict:
    choice = {"text": r.text, "index": 0, "logprobs": logprobs(r.final_probs(stream=False), post, piece),
              "finish_reason": r.finish}
    return {"choices": [choice], **_head("text_completion", cid, model_name), "usage": usage(r),
            "timings": r.timings()}


def text_chunk(cid: str, model_name: str, text: str, finish: str | None = None, prob: Prob | None = None,
               post: bool = False, piece=None) -> dict:
    lp = logprobs([prob], post, piece) if prob is not None and prob.probs.top else None
    return {"choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}],
            **_head("text_completion", cid, model_name)}


def models_list(model, model_name: str) -> dict:
    hp = model.hparams
    return {"object": "list", "data": [{
        "id": model_name, "aliases": [], "tags": [], "object": "model", "created": int(time.time()),
        "owned_by": "llamacpp",
        "meta": {"vocab_type": 2, "n_vocab": hp.n_vocab, "n_ctx": model.n_ctx, "n_embd": hp.n_embd,
                 "size": model.path.stat().st_size}}]}
