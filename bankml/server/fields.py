"""Request fields as llama-server b11434 reads them (tools/server/server-schema.cpp).

    job_fields(body, vocab) -> dict(n_predict=..., params=SamplerParams(...), seed=..., stop=[...],
                                    n_probs=..., post_sampling_probs=..., cache_prompt=...)

A null field is absent. A field of the wrong type is a 400 naming it, with nlohmann::json's
message ("Field 'temperature': [json.exception.type_error.302] type must be number, but is
string"). Soft limits clamp (temperature >= 0, top_k >= 0, top_p, min_p, xtc_* in [0, 1],
mirostat in 0..2); hard limits refuse (n_predict -1..INT32_MAX, repeat_last_n, dry_allowed_length,
dry_penalty_last_n, min_keep 0..INT32_MAX). Integers take a float's integer part and wrap to
int32, as get<int32_t> does; floats are rounded to float32, as get<float> does. The table SAMPLING
lists every sampling field in the schema's order (the order its errors come in).

Each field lands in the SamplerParams field of the same meaning (bankml/runtime/sampler.py, the
interface in its docstring); make_params builds SamplerParams in one place.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bankml.runtime.sampler import (DEFAULT_SAMPLERS, LLAMA_DEFAULT_SEED, LLAMA_DEFAULTS, OTHER_SAMPLERS, SamplerParams,
                                    c_float)

INT32_MAX = 2**31 - 1
FLT_MAX = float(np.finfo(np.float32).max)


class BadRequest(Exception):
    """400 invalid_request_error (or `status`/`kind` given), with llama-server's message."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _type_error(name: str, want: str, v) -> BadRequest:
    return BadRequest(f"Field '{name}': [json.exception.type_error.302] type must be {want}, but is {_json_type(v)}")


def present(body: dict, *names: str):
    """The first of names that is present and not null: (name, value), or (None, None)."""
    for n in names:
        if body.get(n) is not None:
            return n, body[n]
    return None, None


def i32(v) -> int:
    """get<int32_t>: a float's integer part (static_cast), an integer wrapped to 32 bits."""
    v = int(v) if math.isfinite(v) else 0
    return (v + 2**31) % 2**32 - 2**31


def _std_to_string(v, kind) -> str:
    return f"{v:f}" if kind is c_float else str(v)


def num(body: dict, names, default, kind=float, lo=None, hi=None, hard=False):
    names = (names,) if isinstance(names, str) else names
    name, v = present(body, *names)
    if name is None:
        return default
    if not isinstance(v, (int, float)):         # bool is an int: nlohmann converts it too
        raise _type_error(name, "number", v)
    v = kind(v)
    if hard and ((lo is not None and v < lo) or (hi is not None and v > hi)):
        raise BadRequest(f"Field '{name}': Value must be between {_std_to_string(lo, kind)} <= value <= "
                         f"{_std_to_string(hi, kind)}, but got {_std_to_string(v, kind)}")
    if lo is not None:
        v = max(lo, v)
    if hi is not None:
        v = min(hi, v)
    return v


def boolean(body: dict, name: str, default: bool) -> bool:
    if body.get(name) is None:
        return default
    v = body[name]
    if not isinstance(v, bool):
        raise _type_error(name, "boolean", v)
    return v


def stop_words(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list):
        out = []
        for w in v:
            if not isinstance(w, str):
                raise _type_error("stop", "string", w)
            if w:
                out.append(w)
        return out
    return []


def seed_of(body: dict, name: str = "seed") -> int:
    """get<uint32_t>: -1 (or any negative) wraps; 0xFFFFFFFF is LLAMA_DEFAULT_SEED, a random seed."""
    v = num(body, name, LLAMA_DEFAULT_SEED, kind=int)
    return int(v) & 0xFFFFFFFF


# ---------------------------------------------------------------- the sampling fields

@dataclass(frozen=True)
class Num:
    """One field_num of make_llama_cmpl_schema: JSON name, SamplerParams field, type, limits."""
    name: str
    param: str
    kind: object = c_float          # c_float | i32
    lo: float | None = None
    hi: float | None = None
    hard: bool = False


SAMPLING = (
    Num("top_k", "top_k", i32, 0, INT32_MAX),
    Num("top_p", "top_p", c_float, 0.0, 1.0),
    Num("min_p", "min_p", c_float, 0.0, 1.0),
    Num("top_n_sigma", "top_n_sigma"),
    Num("xtc_probability", "xtc_probability", c_float, 0.0, 1.0),
    Num("xtc_threshold", "xtc_threshold", c_float, 0.0, 1.0),
    Num("typical_p", "typical_p"),
    Num("temperature", "temp", c_float, 0.0, math.inf),
    Num("dynatemp_range", "dynatemp_range"),
    Num("dynatemp_exponent", "dynatemp_exponent"),
    Num("repeat_last_n", "repeat_last_n", i32, 0, INT32_MAX, hard=True),
    Num("repeat_penalty", "repeat_penalty"),
    Num("frequency_penalty", "frequency_penalty"),
    Num("presence_penalty", "presence_penalty"),
    Num("dry_multiplier", "dry_multiplier"),
    Num("dry_base", "dry_base"),                # its handler: below 1.0 the default, no clamp
    Num("dry_allowed_length", "dry_allowed_length", i32, 0, INT32_MAX, hard=True),
    Num("dry_penalty_last_n", "dry_penalty_last_n", i32, 0, INT32_MAX, hard=True),
    Num("mirostat", "mirostat", i32, 0, 2),
    Num("mirostat_tau", "mirostat_tau"),
    Num("mirostat_eta", "mirostat_eta"),
)
MIN_KEEP = Num("min_keep", "min_keep", i32, 0, INT32_MAX, hard=True)

# common_sampler_types_from_names: the canonical names, kebab-case and no-dash aliases, and three more
_CANONICAL = DEFAULT_SAMPLERS + OTHER_SAMPLERS
SAMPLER_NAMES = {**{n.replace("_", "-"): n for n in _CANONICAL if "_" in n},
                 **{n.replace("_", ""): n for n in _CANONICAL if "_" in n},
                 "nucleus": "top_p", "temp": "temperature", "typ": "typ_p", **{n: n for n in _CANONICAL}}
# common_sampler_type_to_chr
SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                 "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}


class Vocab:
    """What the fields need of the model: its size, its end-of-generation ids, and
    common_tokenize(vocab, text, add_special=false, parse_special=false)."""

    def __init__(self, n_vocab: int, eog=(), tokenize=lambda text: []):
        self.n_vocab, self.eog, self.tokenize = n_vocab, tuple(sorted(eog)), tokenize

    @classmethod
    def of(cls, model) -> "Vocab":
        from bankml.tokenizer import tokenizer_for
        return cls(model.hparams.n_vocab, tokenizer_for(model).eog,
                   lambda text: model.tokenize(text, add_special=False, parse_special=False))


def _strtol(key: str) -> int | None:
    """strtol(key, &end, 10) when it reads the whole key (*end == 0), as a llama_token; else None.
    An empty key reads as 0, as strtol leaves end at its terminating NUL."""
    s = key.lstrip(" \t\n\v\f\r")
    digits = s[1:] if s[:1] in "+-" else s
    if not key:
        return 0
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    v = max(-2**63, min(2**63 - 1, int(s)))             # LONG_MIN / LONG_MAX on overflow
    return (v + 2**31) % 2**32 - 2**31                  # the int32 llama_token


def _bias(v):
    """parse_bias: a number (as float), `false` for -inf; anything else skips the entry."""
    if isinstance(v, bool):
        return None if v else -math.inf
    if isinstance(v, (int, float)):
        return c_float(v)
    return None


def logit_bias(value, vocab: Vocab) -> list[tuple[int, float]]:
    """The logit_bias field's handler: [[id or text, bias], ...] or {"id or text": bias}; an id
    outside the vocabulary and a malformed entry are skipped, a text biases each of its tokens."""
    out: list[tuple[int, float]] = []
    if isinstance(value, list):
        for el in value:
            if not isinstance(el, list) or len(el) != 2:
                continue
            b = _bias(el[1])
            if b is None:
                continue
            if isinstance(el[0], int) and not isinstance(el[0], bool):
                if 0 <= el[0] < vocab.n_vocab:
                    out.append((el[0], b))
            elif isinstance(el[0], str):
                out.extend((t, b) for t in vocab.tokenize(el[0]))
    elif isinstance(value, dict):
        for key, v in value.items():
            b = _bias(v)
            if b is None:
                continue
            tok = _strtol(key)
            if tok is not None:
                if 0 <= tok < vocab.n_vocab:
                    out.append((tok, b))
            else:
                out.extend((t, b) for t in vocab.tokenize(key))
    return out


def _string_list(name: str, v) -> list[str]:
    if not isinstance(v, list):
        raise _type_error(name, "array", v)
    for s in v:
        if not isinstance(s, str):
            raise _type_error(name, "string", s)
    return v


MAX_SAMPLERS = 256      # bankml's own bound (llama-server has none): a chain is a dozen samplers


def samplers_field(v) -> tuple[str, ...] | None:
    """The samplers field: an array of names or a string of chars; unknown ones are skipped. A
    chain of more than MAX_SAMPLERS is refused: each sampler runs on every token, so a long one
    is only a way to make a server slow and large."""
    if isinstance(v, list):
        names = _string_list("samplers", v)
        chain = tuple(SAMPLER_NAMES[n.lower()] for n in names if n.lower() in SAMPLER_NAMES)
    elif isinstance(v, str):
        chain = tuple(SAMPLER_CHARS[c] for c in v if c in SAMPLER_CHARS)
    else:
        return None
    if len(chain) > MAX_SAMPLERS:
        raise BadRequest(f"Field 'samplers': a chain of {len(chain)} samplers; bankml takes at most {MAX_SAMPLERS}")
    return chain


def sampling_kwargs(body: dict, vocab: Vocab | None = None, defaults: dict | None = None) -> dict:
    """Every SamplerParams field from the request (defaults: LLAMA_DEFAULTS, over them the route's
    own)."""
    d = {**LLAMA_DEFAULTS, **(defaults or {})}
    kw = dict(d)
    for f in SAMPLING:
        v = num(body, f.name, None, f.kind, f.lo, f.hi, f.hard)
        if v is None:
            continue
        if f.name == "dry_base" and v < 1.0:
            v = d["dry_base"]
        kw[f.param] = v
    v = num(body, MIN_KEEP.name, None, MIN_KEEP.kind, MIN_KEEP.lo, MIN_KEEP.hi, MIN_KEEP.hard)
    if v is not None:
        kw["min_keep"] = v
    if body.get("dry_sequence_breakers") is not None:
        v = body["dry_sequence_breakers"]
        ok = isinstance(v, list) and v and all(isinstance(s, str) for s in v)
        if not ok:      # json_value gives an empty vector for the wrong type, then the handler refuses
            raise BadRequest("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a "
                             "non-empty array of strings")
        kw["dry_sequence_breakers"] = tuple(v)
    bias = list(kw["logit_bias"])
    if body.get("logit_bias") is not None:
        bias = logit_bias(body["logit_bias"], vocab or Vocab(0))
    if boolean(body, "ignore_eos", False) and vocab is not None:
        bias += [(t, -math.inf) for t in vocab.eog]
    kw["logit_bias"] = tuple(bias)
    if body.get("samplers") is not None:
        s = samplers_field(body["samplers"])
        if s is not None:
            kw["samplers"] = s
    return kw


def make_params(kw: dict) -> SamplerParams:
    """SamplerParams from the kwargs: what llama.cpp refuses is a 400;
    a sampler of llama.cpp's that bankml does not implement (infill, adaptive_p), a 501."""
    for name in kw["samplers"]:
        if name in OTHER_SAMPLERS:
            raise BadRequest(f"Field 'samplers': bankml has no {name} sampler", 501, "not_supported_error")
    try:
        return SamplerParams(**kw)
    except ValueError as e:
        raise BadRequest(f"Failed to initialize samplers: {e}") from None


def sampler_params(body: dict, vocab: Vocab | None = None) -> SamplerParams:
    return make_params(*sampling_kwargs(body, vocab))


def probs_fields(body: dict) -> dict:
    """n_probs (alias logprobs: a number, or a boolean as 0/1) and post_sampling_probs."""
    name, v = present(body, "n_probs", "logprobs")
    n = 0
    if name is not None:
        if not isinstance(v, (int, float)):
            raise _type_error(name, "number", v)
        n = i32(v)
    return dict(n_probs=n, post_sampling_probs=boolean(body, "post_sampling_probs", False))


def adaptive_p(body: dict) -> None:
    """adaptive_target (clamped to at most 1; negative: off) and adaptive_decay (0..0.99): parsed
    as llama-server does; the adaptive-p sampler itself bankml does not have."""
    target = num(body, "adaptive_target", -1.0, c_float, -FLT_MAX, 1.0)
    num(body, "adaptive_decay", 0.9, c_float, 0.0, c_float(0.99), hard=True)
    if target >= 0:
        raise BadRequest("Field 'adaptive_target': bankml has no adaptive-p sampler; leave adaptive_target "
                         "negative (off)", 501, "not_supported_error")


def job_fields(body: dict, vocab: Vocab | None = None, defaults: dict | None = None) -> dict:
    """n_predict (max_completion_tokens, max_tokens), sampler, seed, n_probs, post_sampling_probs,
    stop, cache_prompt."""
    n_predict = num(body, ("n_predict", "max_completion_tokens", "max_tokens"), -1, i32, -1, INT32_MAX, hard=True)
    kw = sampling_kwargs(body, vocab, defaults)
    adaptive_p(body)
    seed = seed_of(body)
    probs = probs_fields(body)
    t_max = num(body, "t_max_predict_ms", -1, int, -1, 2**63 - 1, hard=True)
    return dict(n_predict=n_predict, params=make_params(kw), seed=seed, stop=stop_words(body),
                cache_prompt=boolean(body, "cache_prompt", True), t_max_predict_ms=t_max, **probs)


def response_fields(body: dict) -> list[str]:
    """response_fields (json_value: an array of strings, else none): the paths kept of /completion's answer."""
    v = body.get("response_fields")
    return v if isinstance(v, list) and all(isinstance(p, str) for p in v) else []


def nested_values(paths: list[str], obj: dict) -> dict:
    """json_get_nested_values: each path ("a/b" goes into a) that exists, under its path as key."""
    out = {}
    for path in paths:
        cur, ok = obj, True
        for k in path.split("/"):
            if ok and isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                ok = False
        if ok:
            out[path] = cur
    return out


def n_cmpl(body: dict, n_parallel: int) -> int:
    """n_cmpl (alias n): how many completions of the prompt, 1 to the server's slots (a hard limit);
    the k-th after the first samples with seed + k (server_task::add_child)."""
    return num(body, ("n_cmpl", "n"), 1, i32, 1, n_parallel, hard=True)


def child_seed(seed: int, k: int) -> int:
    """The seed of completion k (0: the request's own); a random seed (LLAMA_DEFAULT_SEED) stays random."""
    return seed if seed == LLAMA_DEFAULT_SEED else (seed + k) & 0xFFFFFFFF


def slot_asked(body: dict) -> int:
    """id_slot (json_value(data, "id_slot", -1)): the slot a request asks for, -1 any."""
    v = body.get("id_slot")
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else -1


def sse_ping(body: dict) -> float | None:
    """sse_ping_interval: seconds between SSE comment lines on a quiet stream (-1: none); None: the
    server's --sse-ping-interval."""
    v = num(body, "sse_ping_interval", None, i32, -1, INT32_MAX, hard=True)
    return None if v is None else float(v)


def chat_logprobs(body: dict) -> dict:
    """oaicompat_chat_params_parse's logprobs: `logprobs: true` asks for top_logprobs (default 20)
    as n_probs; top_logprobs without it is refused. The body to read the fields from, rewritten."""
    lp = body.get("logprobs")
    if isinstance(lp, bool) and lp:
        top = body.get("top_logprobs")
        n = i32(top) if isinstance(top, (int, float)) else 20      # json_value(body, "top_logprobs", 20)
        return {**body, "n_probs": n}                                 # over a request's own n_probs
    if body.get("top_logprobs") is not None and not (isinstance(lp, bool) and lp):
        raise BadRequest("top_logprobs requires logprobs to be set to true")
    return body


# ---------------------------------------------------------------- every field a client may send

SERVED, REFUSED, INERT = "served", "refused", "inert"


def absent(v, model=None) -> bool:
    """A value that asks for nothing: null, false, an empty string, array or object."""
    return v is None or v is False or (isinstance(v, (str, list, dict)) and not v)


def at_most(limit):
    """A number at most `limit` (off, in llama-server's schema) asks for nothing."""
    return lambda v, model=None: absent(v) or (isinstance(v, (int, float)) and not isinstance(v, bool) and v <= limit)


def _same(v, x) -> bool:
    """v is x as JSON: numbers by value (a boolean is not a number), the rest by type and value."""
    number = (int, float)
    if isinstance(x, number) and not isinstance(x, bool):
        return isinstance(v, number) and not isinstance(v, bool) and v == x
    return type(v) is type(x) and v == x


def one_of(*values):
    return lambda v, model=None: absent(v) or any(_same(v, x) for x in values)


@dataclass(frozen=True)
class Rule:
    """What bankml does with one request field: SERVED with llama-server's (or Ollama's) meaning;
    REFUSED unless `idle(value, model)` says it asks for nothing (501 naming it, or `status` with
    llama-server's own message `note`); INERT: without effect on the answer, in llama-server (or
    Ollama) as in bankml, `note` says why."""
    what: str
    note: str = ""
    idle: object = absent
    status: int = 501


def served(note: str = "") -> Rule:
    return Rule(SERVED, note)


def refused(note: str, idle=absent, status: int = 501) -> Rule:
    return Rule(REFUSED, note, idle, status)


def inert(note: str) -> Rule:
    return Rule(INERT, note)


NO_SHIFT = "acts only in a context shift: llama-server shifts with --context-shift (off by default), bankml never"
ONE_MODEL = "bankml serves one model, whatever the name (llama-server without a router does the same)"
ACCOUNT = "an OpenAI platform setting (accounts, storage, caching, routing): no effect on the answer, llama-server ignores it too"
TOOLS = "tool calling"
LAZY = "a grammar that waits for a trigger (tool calls)"
REASONING = "reasoning control (thinking budgets and tags)"

# make_llama_cmpl_schema (server-schema.cpp) and the task's id_slot: what /completion, /v1/completions
# and /v1/chat/completions all read
LLAMA_SERVER = {
    "verbose": served("with return_tokens: the __verbose object"),
    "timings_per_token": served(),
    "stream": served(), "stream_options": served("include_usage"), "cache_prompt": served(),
    "return_tokens": served(), "return_progress": refused("prompt progress events"),
    "sse_ping_interval": served(),
    "n_predict": served(), "max_completion_tokens": served(), "max_tokens": served(),
    "n_indent": refused("a minimum indentation (code infill)", at_most(0)),
    "n_keep": inert(NO_SHIFT), "n_discard": inert(NO_SHIFT),
    "n_cmpl": served(), "n": served(),
    "n_cache_reuse": refused("reusing cache chunks by shifting them (--cache-reuse)", at_most(0)),
    "t_max_predict_ms": served(), "response_fields": served("/completion's answer"),
    **{f.name: served() for f in SAMPLING}, "min_keep": served(),
    "adaptive_target": refused("the adaptive-p sampler", lambda v, model=None: absent(v) or (
        isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0)),
    "adaptive_decay": inert("tunes the adaptive-p sampler, which is off unless adaptive_target is set (refused)"),
    "seed": served(), "n_probs": served(), "logprobs": served(), "post_sampling_probs": served(),
    "backend_sampling": refused("sampling on the backend"),
    "lora": refused("LoRA adapters"),
    "dry_sequence_breakers": served(), "logit_bias": served(), "ignore_eos": served(), "stop": served(),
    "samplers": served(),
    "json_schema": served(), "grammar": served(),
    "grammar_type": refused("a grammar of the chat parser's (llama-server sets it itself)"),
    "grammar_lazy": refused(LAZY, one_of(False)), "grammar_triggers": refused(LAZY, one_of([])),
    "preserved_tokens": refused("tokens a chat parser keeps whole", one_of([])),
    "chat_format": refused("a chat output parser", one_of(0)),
    "reasoning_format": refused("reasoning extraction", one_of("none", "auto")),
    "generation_prompt": refused("a chat output parser"), "chat_parser": refused("a chat output parser"),
    "parse_tool_calls": refused(TOOLS),
    "continue_final_message": served(),
    "echo": refused("echoing the prompt"),
    "reasoning_control": refused(REASONING), "reasoning_budget_tokens": refused(REASONING, at_most(-1)),
    "reasoning_budget_start_tag": refused(REASONING), "reasoning_budget_end_tags": refused(REASONING),
    "reasoning_budget_end_tag": refused(REASONING), "reasoning_budget_message": refused(REASONING),
    "id_slot": served(),
    "model": inert(ONE_MODEL),
}

# oaicompat_chat_params_parse (server-common.cpp) and OpenAI's chat completion request
OPENAI_CHAT = {
    **LLAMA_SERVER,
    "messages": served(), "add_generation_prompt": served(),
    "tools": served("rendered by the template; calls parsed for Hermes-style templates (docs/SERVER.md)"),
    "tool_choice": served("\"auto\", \"none\" or \"required\""), "parallel_tool_calls": served(),
    "response_format": served(),
    "chat_template_kwargs": served("the template's variables"), "reasoning_effort": served("a template variable"),
    "thinking_budget_tokens": refused(REASONING, at_most(-1)),
    "top_logprobs": served(),
    "audio": refused("audio output"), "modalities": refused("output other than text", one_of(["text"])),
    "functions": refused(TOOLS), "function_call": refused(TOOLS, one_of("none", "auto")),
    "verbosity": refused("a verbosity setting"), "web_search_options": refused("web search"),
    "moderation": refused("moderation of the input and output"),
    "prediction": inert("a predicted output only speeds OpenAI up; the answer is the same"),
    **{k: inert(ACCOUNT) for k in ("user", "store", "metadata", "service_tier", "safety_identifier",
                                   "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention")},
}

# oaicompat_completion_params_parse and OpenAI's (legacy) completion request; /completion reads the same
OPENAI_COMPLETIONS = {
    **LLAMA_SERVER,
    "prompt": served(),
    "echo": refused("Only no echo is supported", status=500),
    "best_of": refused("Unsupported param: best_of", lambda v, model=None: False, status=500),
    "suffix": refused("Unsupported param: suffix", lambda v, model=None: False, status=500),
    "user": inert(ACCOUNT),
}

# one message of a chat (common_chat_msgs_parse_oaicompat; name, tool_call_id and
# reasoning_content reach the template as llama-server passes them)
OPENAI_MESSAGE = {
    "role": served(), "content": served(), "name": served(), "tool_call_id": served(),
    "reasoning_content": served(), "tool_calls": served(),
    "refusal": inert("an assistant's refusal text, which llama-server's templates do not render"),
    "audio": refused("audio input"), "function_call": refused(TOOLS),
}

OLLAMA_SERVER = "Ollama keeps the model loaded for keep_alive; bankml keeps it for the server's life"
NO_CUT = "Ollama cuts or shifts a conversation that outgrows the context; bankml answers 400 instead, never silently"

# api/types.go ChatRequest and GenerateRequest (the ollama client 0.6.3's fields)
OLLAMA_COMMON = {
    "model": inert(ONE_MODEL), "stream": served(), "options": served(), "keep_alive": inert(OLLAMA_SERVER),
    "format": served(), "think": refused("thinking"),
    "truncate": inert(NO_CUT), "shift": inert(NO_CUT),
    "logprobs": served(), "top_logprobs": served(),
}
OLLAMA_CHAT = {**OLLAMA_COMMON, "messages": served(), "tools": served("as Ollama hands them to llama-server")}
OLLAMA_GENERATE = {
    **OLLAMA_COMMON, "prompt": served(), "system": served(), "raw": served(),
    "suffix": refused("a suffix (fill in the middle)"), "template": refused("a template other than the model's"),
    "context": refused("a conversation as the tokens of an earlier answer"), "images": refused("image input"),
    "width": refused("image generation"), "height": refused("image generation"), "steps": refused("image generation"),
}
OLLAMA_MESSAGE = {
    "role": served(), "content": served(), "images": refused("image input"), "thinking": refused("thinking"),
    "tool_calls": served(), "tool_name": served(), "tool_call_id": served(),
}

# api/types.go Options and Runner; mirostat* as the client 0.6.3 sends them
OLLAMA_OPTIONS = {
    **{k: served() for k in ("seed", "num_predict", "top_k", "top_p", "min_p", "typical_p", "repeat_last_n",
                             "temperature", "repeat_penalty", "presence_penalty", "frequency_penalty", "stop",
                             "mirostat", "mirostat_tau", "mirostat_eta")},
    "num_keep": inert(NO_SHIFT), "penalize_newline": inert("Ollama reads it and no longer acts on it"),
    "tfs_z": refused("tail-free sampling (llama.cpp has none)", one_of(1, 1.0)),
    "num_ctx": refused("a context size other than the server's (--ctx-size)",
                       lambda v, model=None: absent(v) or (model is not None and v == model.n_ctx)),
    "num_batch": refused("a micro-batch size other than the server's (512)",
                         lambda v, model=None: absent(v) or (model is not None and v == model.n_ubatch)),
    "num_thread": refused("a thread count other than the server's (--threads)",
                          lambda v, model=None: absent(v) or v == 0 or (model is not None and v == model.threads)),
    **{k: inert("where the weights live and how they are loaded: no effect on the answer on a CPU")
       for k in ("num_gpu", "main_gpu", "low_vram", "use_mmap", "use_mlock", "numa", "vocab_only", "f16_kv")},
    "logits_all": refused("every position's logits"), "embedding_only": refused("embeddings"),
}

# handle_embeddings_impl and OpenAI's embedding request
EMBEDDINGS = {
    "input": served(), "content": served(), "encoding_format": served(), "embd_normalize": served(),
    "model": inert("echoed in the answer; bankml serves one model, as llama-server without a router"),
    "dimensions": refused("fewer dimensions than the model's"), "user": inert(ACCOUNT),
}
# api/types.go EmbedRequest
OLLAMA_EMBED = {
    "model": inert(ONE_MODEL), "input": served(), "truncate": inert(NO_CUT), "options": served(),
    "keep_alive": inert(OLLAMA_SERVER), "dimensions": refused("fewer dimensions than the model's"),
}

ROUTES = {"/v1/chat/completions": OPENAI_CHAT, "/v1/completions": OPENAI_COMPLETIONS,
          "/completion": OPENAI_COMPLETIONS, "/api/chat": OLLAMA_CHAT, "/api/generate": OLLAMA_GENERATE,
          "/v1/embeddings": EMBEDDINGS, "/api/embed": OLLAMA_EMBED}
