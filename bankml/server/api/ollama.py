"""The Ollama API (docs/api.md of ollama/ollama): /api/chat, /api/generate, /api/tags, /api/ps,
/api/show, /api/version, over the same slots and sampler as the OpenAI routes.

`options` take Ollama's names and types (api/types.go Options.FromMap: an integer option takes a
number's integer part, a float32 one a number, `stop` an array of strings; an unknown option is
ignored) and Ollama's defaults (DefaultOptions) for the options Ollama has; each maps onto the
llama-server field of the same meaning (num_predict -> n_predict, the rest by name), whose limits
apply; repeat_last_n -1 is the context size, as Ollama documents (llama.cpp has no such value).
Errors are Ollama's {"error": "message"}.
"""
from __future__ import annotations

import datetime
import hashlib
import json

from bankml.runtime.probs import logarithm
from bankml.server.engine import Prob, Result
from bankml.server.fields import BadRequest, c_float, job_fields
from bankml.server.api.openai import chat_prompt, token_text
from bankml.server.api.openai import chat_inputs as openai_chat_inputs

VERSION = "0.6.3"       # the Ollama API version these shapes follow (the ollama client tested against)

# Ollama option -> (llama-server field, Go type); num_keep and penalize_newline are read and unused
OPTIONS = {"num_predict": ("n_predict", "int"), "seed": ("seed", "int"), "temperature": ("temperature", "float32"),
           "top_k": ("top_k", "int"), "top_p": ("top_p", "float32"), "min_p": ("min_p", "float32"),
           "typical_p": ("typical_p", "float32"), "repeat_last_n": ("repeat_last_n", "int"),
           "repeat_penalty": ("repeat_penalty", "float32"), "presence_penalty": ("presence_penalty", "float32"),
           "frequency_penalty": ("frequency_penalty", "float32"), "mirostat": ("mirostat", "int"),
           "mirostat_tau": ("mirostat_tau", "float32"), "mirostat_eta": ("mirostat_eta", "float32"),
           "stop": ("stop", "[]string"), "num_keep": (None, "int"), "penalize_newline": (None, "bool")}

# api/types.go DefaultOptions, as llama-server fields (min_p: Go's zero value, Ollama has no default)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "typical_p": 1.0, "repeat_last_n": 64,
            "repeat_penalty": 1.1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0,
            "mirostat_tau": 5.0, "mirostat_eta": 0.1}
_PARAM = {"temperature": "temp"}


def sampler_defaults() -> dict:
    """DEFAULTS as SamplerParams kwargs (float32 values, as Ollama holds them)."""
    return {_PARAM.get(k, k): (c_float(v) if isinstance(v, float) else v) for k, v in DEFAULTS.items()}


def error_body(message: str) -> dict:
    return {"error": message}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _option(key: str, kind: str, v):
    """Options.FromMap's type check and conversion of one option."""
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadRequest(f'option "{key}" must be of type integer')
        return int(v)
    if kind == "float32":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadRequest(f'option "{key}" must be of type float32')
        return float(v)
    if kind == "bool":
        if not isinstance(v, bool):
            raise BadRequest(f'option "{key}" must be of type boolean')
        return v
    if not isinstance(v, list):
        raise BadRequest(f'option "{key}" must be of type array')
    if not all(isinstance(w, str) for w in v):
        raise BadRequest(f'option "{key}" must be of an array of strings')
    return v


def options_fields(body: dict, vocab=None, n_ctx: int = 4096) -> dict:
    """The job's fields from `options`: Ollama's names, types and defaults, llama-server's limits;
    repeat_last_n -1 is the context size (Ollama's num_ctx: the slot's)."""
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("options must be an object")
    mapped = {}
    for key, v in options.items():
        if key not in OPTIONS or v is None:
            continue
        name, kind = OPTIONS[key]
        v = _option(key, kind, v)
        if name is not None:
            mapped[name] = v
    if mapped.get("repeat_last_n") == -1:
        mapped["repeat_last_n"] = n_ctx
    return job_fields(mapped, vocab, defaults=sampler_defaults())


def streaming(body: dict) -> bool:
    v = body.get("stream")
    if v is None:
        return True
    if not isinstance(v, bool):
        raise BadRequest("stream must be a boolean")
    return v


def load_request(body: dict, kind: str) -> dict | None:
    """Ollama's answer to a request with nothing to generate (GenerateHandler: an empty prompt;
    ChatHandler: no messages): the model is loaded ("load"), or with keep_alive 0 unloaded
    ("unload"; bankml keeps it). `ollama run` sends one before its first prompt. None otherwise."""
    if kind == "generate":
        prompt = body.get("prompt")
        if prompt not in (None, "") or body.get("images"):
            return None
        payload = {"response": ""}
    else:
        messages = body.get("messages")
        if messages not in (None, []):
            return None
        payload = {"message": {"role": "assistant", "content": ""}}
    reason = "unload" if _zero_duration(body.get("keep_alive")) else "load"
    return {"created_at": now(), **payload, "done": True, "done_reason": reason}


def _zero_duration(v) -> bool:
    """keep_alive 0 (a number of seconds, or a Go duration such as "0" or "0s")."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v == 0
    return isinstance(v, str) and v.strip().rstrip("hms").strip() in ("0", "0.0")


def chat_inputs(model, body: dict):
    """A chat's messages, template variables and tools as Ollama hands them to llama-server
    (llm/llama_server.go llamaServerChatRequest): each message's role and content (always there),
    tool_call_id, tool_name as "name", tool calls with their arguments as JSON text; the tools as
    Go re-encodes api.Tool (its fields only, in its order). Then as /v1/chat/completions takes them."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return openai_chat_inputs(model, body)          # its 400
    out = {"messages": [_message(m) for m in messages]}
    if body.get("tools"):
        out["tools"] = [_go_tool(t) for t in _list(body["tools"], "tools")]
    return openai_chat_inputs(model, out)


def _list(v, what: str) -> list:
    if not isinstance(v, list):
        raise BadRequest(f"json: cannot unmarshal {what} into a Go slice")
    return v


def _message(m: dict) -> dict:
    out = {"role": m.get("role", "")}
    for key, to in (("tool_call_id", "tool_call_id"), ("tool_name", "name")):
        if m.get(key):
            out[to] = m[key]
    calls = []
    for k, tc in enumerate(_list(m.get("tool_calls") or [], "tool_calls")):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            raise BadRequest("json: cannot unmarshal tool_calls: a tool call needs a \"function\" object")
        args = fn.get("arguments") if isinstance(fn.get("arguments"), dict) else {}
        call = {"index": fn.get("index", 0), "type": "function",
                "function": {"name": fn.get("name", ""), "arguments": _go_json(args)}}
        if tc.get("id"):
            call = {"id": tc["id"], **call}
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    out["content"] = m.get("content") or ""
    return out


def _go_json(v) -> str:
    """encoding/json.Marshal: compact, <, > and & escaped."""
    text = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _go_tool(t) -> dict:
    """api.Tool as encoding/json writes it back: type, items, function {name, description,
    parameters {type, $defs, items, required, properties}}, each property's anyOf, type, items,
    description, enum, properties, required; empty optional fields left out, others dropped."""
    if not isinstance(t, dict):
        raise BadRequest("json: cannot unmarshal tools: a tool must be an object")
    fn = t.get("function") if isinstance(t.get("function"), dict) else {}
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties")
    go_params = {"type": params.get("type") or "", **_some(params, "$defs", "items"),
                 **({"required": params["required"]} if params.get("required") else {}),
                 "properties": {k: _go_property(v) for k, v in props.items()} if isinstance(props, dict) else None}
    go_fn = {"name": fn.get("name") or "", **({"description": fn["description"]} if fn.get("description") else {}),
             "parameters": go_params}
    return {"type": t.get("type") or "", **_some(t, "items"), "function": go_fn}


def _some(d: dict, *keys: str) -> dict:
    return {k: d[k] for k in keys if d.get(k) is not None}


def _go_property(p) -> dict:
    p = p if isinstance(p, dict) else {}
    out = {}
    if p.get("anyOf"):
        out["anyOf"] = [_go_property(x) for x in p["anyOf"]]
    types = [p["type"]] if isinstance(p.get("type"), str) else p.get("type") or []
    if types:
        out["type"] = types[0] if len(types) == 1 else types
    out.update(_some(p, "items"))
    for key in ("description", "enum"):
        if p.get(key):
            out[key] = p[key]
    if isinstance(p.get("properties"), dict):
        out["properties"] = {k: _go_property(v) for k, v in p["properties"].items()}
    if p.get("required"):
        out["required"] = p["required"]
    return out


def tool_calls(calls: list[dict], ids: list[str]) -> list[dict]:
    """The calls Ollama gathers from llama-server's streamed deltas (accumulatedToolCalls): id,
    function {index, name, arguments as an object}."""
    out = []
    for k, (c, cid) in enumerate(zip(calls, ids)):
        try:
            args = json.loads(c["arguments"]) if c["arguments"].strip() else {}
        except ValueError as e:
            raise BadRequest(f"llama-server returned invalid tool call arguments for {json.dumps(c['name'])}: {e}",
                             500) from None
        out.append({"id": cid, "function": {"index": k, "name": c["name"], "arguments": args}})
    return out


def generate_ids(model, body: dict) -> list[int]:
    """raw: the prompt as text (as /v1/completions); else the template over [system], user prompt."""
    prompt = body.get("prompt")
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string")
    if not prompt:
        raise BadRequest("prompt must not be empty")
    if body.get("raw"):
        return model.tokenize(prompt, add_special=True, parse_special=True)
    messages = []
    if isinstance(body.get("system"), str) and body["system"]:
        messages.append({"role": "system", "content": body["system"]})
    messages.append({"role": "user", "content": prompt})
    return chat_prompt(model, messages)


def logprob_fields(body: dict) -> dict:
    """logprobs and top_logprobs as Ollama checks them (server/routes.go: 0 to 20) and sends them to
    llama-server (llm/llama_server.go: n_probs, or a chat's top_logprobs, max(top_logprobs, 1))."""
    top = body.get("top_logprobs")
    top = 0 if top is None else top
    if isinstance(top, bool) or not isinstance(top, int):
        raise BadRequest("top_logprobs must be an integer")
    if top < 0 or top > 20:
        raise BadRequest("top_logprobs must be between 0 and 20")
    return {"n_probs": max(top, 1), "post_sampling_probs": False} if body.get("logprobs") is True else {}


def logprobs(entries: list[Prob], piece, with_top: bool) -> list[dict]:
    """llama-server's token probabilities as Ollama gives them (convertLogprobs, then toAPILogprobs):
    token, logprob, the token text's bytes; top_logprobs when top_logprobs > 0 was asked."""
    def entry(token: str, logprob: float) -> dict:
        out = {"token": token, "logprob": logprob}
        if token:
            out["bytes"] = list(token.encode())
        return out
    out = []
    for e in entries:
        d = entry(token_text(e.sent)["token"], logarithm(e.probs.prob))
        if with_top and e.probs.top:
            d["top_logprobs"] = [entry(token_text(piece(t))["token"], logarithm(p)) for t, p in e.probs.top]
        out.append(d)
    return out


def chunk(model_name: str, kind: str, text: str) -> dict:
    payload = {"message": {"role": "assistant", "content": text}} if kind == "chat" else {"response": text}
    return {"model": model_name, "created_at": now(), **payload, "done": False}


def final(model_name: str, kind: str, r: Result, text: str, t_total_ns: int, prompt: list[int]) -> dict:
    """The last object: done, done_reason and the counts and durations (nanoseconds)."""
    payload = {"message": {"role": "assistant", "content": text}} if kind == "chat" else {"response": text}
    out = {"model": model_name, "created_at": now(), **payload, "done": True,
           "done_reason": r.finish, "total_duration": t_total_ns, "load_duration": 0,
           "prompt_eval_count": r.n_prompt, "prompt_eval_duration": int(r.t_prompt_ms * 1e6),
           "eval_count": len(r.tokens), "eval_duration": int(r.t_gen_ms * 1e6)}
    if kind == "generate":
        out["context"] = list(prompt) + list(r.tokens)
    return out


def _digest(path) -> str:
    h = hashlib.sha256()
    h.update(str(path.stat().st_size).encode() + str(path).encode())
    return h.hexdigest()


# general.file_type (include/llama.h llama_ftype) as ollama names it; the types bankml runs
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 14: "Q4_K_S",
              15: "Q4_K_M", 18: "Q6_K", 40: "Q1_0", 41: "Q2_0"}


def quantization_level(model) -> str:
    """The header's general.file_type (Q4_K_M for a per-tensor mix), else the most common matrix type."""
    from bankml.gguf.reader import ggml_type_name
    ftype = model.gguf.metadata.get("general.file_type")
    return FILE_TYPES.get(int(ftype), ggml_type_name(model.plan.matrix_type)) if ftype is not None \
        else ggml_type_name(model.plan.matrix_type)


def details(model) -> dict:
    return {"parent_model": "", "format": "gguf", "family": model.plan.arch, "families": [model.plan.arch],
            "parameter_size": "", "quantization_level": quantization_level(model)}


def tags(model, model_name: str) -> dict:
    st = model.path.stat()
    modified = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat()
    return {"models": [{"name": model_name, "model": model_name, "modified_at": modified, "size": st.st_size,
                        "digest": _digest(model.path), "details": details(model)}]}


def ps(model, model_name: str, n_slots: int) -> dict:
    """/api/ps: the one model, loaded for the server's life (as Ollama's keep_alive < 0, whose
    expires_at is now + the longest Go duration); size is the file and every slot's K/V cache, all
    in RAM (size_vram 0); context_length a slot's."""
    entry = tags(model, model_name)["models"][0]
    del entry["modified_at"]
    forever = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(microseconds=2**63 // 1000)
    return {"models": [{**entry, "size": entry["size"] + n_slots * model.cache_bytes(),
                        "expires_at": forever.isoformat().replace("+00:00", "Z"), "size_vram": 0,
                        "context_length": model.n_ctx}]}


def show(model, model_name: str) -> dict:
    from bankml.runtime.chat import has_chat_template
    hp = model.hparams
    arch = model.plan.arch
    info = {"general.architecture": arch, f"{arch}.block_count": hp.n_layer,
            f"{arch}.embedding_length": hp.n_embd, f"{arch}.attention.head_count": hp.n_head,
            f"{arch}.attention.head_count_kv": hp.n_head_kv, f"{arch}.context_length": model.n_ctx,
            "tokenizer.ggml.model": model.gguf.metadata.get("tokenizer.ggml.model", "gpt2"),
            "general.vocab_size": hp.n_vocab}
    template = model.gguf.metadata.get("tokenizer.chat_template", "") if has_chat_template(model) else ""
    return {"modelfile": f"FROM {model.path}\n", "parameters": "", "template": template, "details": details(model),
            "model_info": info, "capabilities": ["completion"],
            "modified_at": tags(model, model_name)["models"][0]["modified_at"]}
