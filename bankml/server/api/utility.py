"""llama-server's utility routes (tools/server/server-context.cpp): /tokenize, /detokenize and
/apply-template, in its shapes.

    POST /tokenize {"content": "text" | ["text", 42, ...], "add_special": false, "parse_special": true,
                    "with_pieces": false}  -> {"tokens": [ids]} or {"tokens": [{"id": 1, "piece": "a"}]}
    POST /detokenize {"tokens": [ids]}  -> {"content": "text"}
    POST /apply-template {"messages": [...]}  -> {"prompt": "the rendered chat template"}

The flags are read as json_value reads them: absent, null or of another type, the default. The
content is tokenize_mixed's (server-common.cpp): a string, or an array of strings and token ids
(only the first string gets the special tokens). A piece that is not whole UTF-8 is given as its
bytes. Errors where llama-server's JSON access throws are its 400 with nlohmann's message.
"""
from __future__ import annotations

from bankml.server.api import openai
from bankml.server.fields import BadRequest, _json_type, i32
from bankml.tokenizer import tokenizer_for


def json_value(body: dict, key: str, default):
    """json_value(body, key, default) for a bool or a str default: the field when it has that type."""
    v = body.get(key)
    return v if isinstance(v, type(default)) else default


def _get(v, want: str, check) -> object:
    """nlohmann's get<T> of a value that must be `want`: the value, or its type_error.302 (400)."""
    if not check(v):
        raise BadRequest(f"[json.exception.type_error.302] type must be {want}, but is {_json_type(v)}")
    return v


def _token_id(v) -> int:
    """get<llama_token>: a number's integer part (a float is cast), wrapped to int32."""
    return i32(_get(v, "number", lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)))


def tokenize_mixed(model, content, add_special: bool, parse_special: bool) -> list[int]:
    """A string, or an array whose strings are tokenized (only the first with the special tokens)
    and whose numbers are token ids as they are."""
    if not isinstance(content, list):
        text = _get(content, "string", lambda x: isinstance(x, str))
        return model.tokenize(text, add_special=add_special, parse_special=parse_special)
    out: list[int] = []
    for i, p in enumerate(content):
        if isinstance(p, str):
            out += model.tokenize(p, add_special=add_special and i == 0, parse_special=parse_special)
        else:
            out.append(_token_id(p))
    return out


def _piece_json(piece: bytes):
    """The piece as text when it is whole UTF-8, else its bytes (is_valid_utf8)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def tokenize(model, body: dict) -> dict:
    if "content" not in body:
        return {"tokens": []}
    ids = tokenize_mixed(model, body["content"], json_value(body, "add_special", False),
                         json_value(body, "parse_special", True))
    if not json_value(body, "with_pieces", False):
        return {"tokens": ids}
    tok = tokenizer_for(model)
    ids = openai.known_ids(model, ids)
    return {"tokens": [{"id": t, "piece": _piece_json(tok.piece(t, special=True))} for t in ids]}


def detokenize(model, body: dict) -> dict:
    """tokens_to_str: every token's piece (special tokens' text included), joined."""
    if "tokens" not in body:
        return {"content": ""}
    ids = [_token_id(t) for t in _get(body["tokens"], "array", lambda x: isinstance(x, list))]
    return {"content": tokenizer_for(model).decode(openai.known_ids(model, ids), special=True)}


def apply_template(model, body: dict) -> dict:
    """What /v1/chat/completions would generate from, without generating: the messages through
    the chat template (with the generation prompt unless add_generation_prompt is false)."""
    messages, variables, _ = openai.chat_inputs(model, body)
    return {"prompt": openai.chat_text(model, messages, openai.generation_prompt(body), openai.continuation(body),
                                       variables)}
