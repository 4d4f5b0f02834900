"""Fields that llama-server or Ollama honour and bankml does not serve yet: refused, naming the
field, never dropped (a client must not get free text where it asked for JSON, or one choice where
it asked for three, with a 200).

A value that asks for nothing is served as it is: `n` 1, `tools` empty, `tool_choice` "none" or
"auto" (without tools both mean plain text), `response_format` {"type": "text"}, an empty
`grammar`, Ollama's `format` "" and `think` false. Anything else is 501 not_supported_error
(OpenAI routes) or Ollama's {"error"} with 501.
"""
from __future__ import annotations

from bankml.server.fields import BadRequest


def _unserved(field: str, what: str) -> BadRequest:
    return BadRequest(f"Field '{field}': {what} is not served by bankml yet; leave '{field}' out", 501,
                      "not_supported_error")


def _empty(v) -> bool:
    return v is None or v == [] or v == ""


def openai_fields(body: dict) -> None:
    """The OpenAI and llama-server fields of a completion or chat request (server-common.cpp:
    oaicompat_chat_params_parse, server-schema.cpp)."""
    for field in ("n", "n_cmpl"):
        v = body.get(field)
        if v is not None and not (v == 1 and not isinstance(v, bool)):
            raise _unserved(field, "more than one completion a request")
    if not _empty(body.get("tools")):
        raise _unserved("tools", "tool calling")
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise _unserved("tool_choice", "tool calling")
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") in (None, "text")):
        raise _unserved("response_format", "structured output (a JSON object or schema)")
    for field in ("grammar", "json_schema"):
        if not _empty(body.get(field)):
            raise _unserved(field, "constrained output (a grammar or JSON schema)")


def ollama_fields(body: dict) -> None:
    """Ollama's request fields beyond its options (api/types.go ChatRequest, GenerateRequest)."""
    if not _empty(body.get("format")):
        raise _unserved("format", "structured output (JSON or a schema)")
    if not _empty(body.get("tools")):
        raise _unserved("tools", "tool calling")
    if body.get("think") not in (None, False):
        raise _unserved("think", "thinking")
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    images = [body.get("images")] + [m.get("images") for m in messages if isinstance(m, dict)]
    if any(not _empty(i) for i in images):
        raise _unserved("images", "image input")
