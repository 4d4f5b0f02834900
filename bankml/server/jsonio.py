"""JSON in and out as llama-server's nlohmann::json reads and writes it.

    body = await read_json(request)     # a dict, or BadRequest with the parser's message
    JSONResponse(obj); sse(obj); ndjson(obj)

In: no NaN or Infinity literals, no number that overflows a double, no lone surrogate escape
(each a parse error there); nesting too deep for Python's parser is a parse error too. Out: UTF-8
without escapes, NaN and infinities as null (how nlohmann dumps them).
"""
from __future__ import annotations

import json
import math
import re

from starlette.requests import Request
from starlette.responses import JSONResponse as StarletteJSON

from bankml.server.fields import BadRequest


def _no_constant(name: str):
    raise BadRequest(f"[json.exception.parse_error.101] parse error: syntax error: invalid literal '{name}'")


def _finite(text: str) -> float:
    v = float(text)
    if math.isinf(v):                           # nlohmann refuses what overflows a double
        raise BadRequest(f"[json.exception.out_of_range.406] number overflow parsing '{text}'")
    return v


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_lone_surrogates(body) -> None:
    """nlohmann refuses a \\uD800-\\uDFFF escape that is not half of a pair; Python keeps it as a
    character no UTF-8 can hold (and no answer could echo)."""
    stack = [body]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest("[json.exception.parse_error.101] parse error: syntax error: surrogate "
                                 "U+D800..U+DFFF must be part of a pair") from None


async def read_json(request: Request) -> dict:
    """The body as JSON as llama-server's parser takes it: no NaN or Infinity literals, no number
    that overflows a double; nesting too deep for Python's parser is a parse error too."""
    raw = await request.body()
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"[json.exception.parse_error.101] parse error: {e}") from None
    except RecursionError:
        raise BadRequest("[json.exception.parse_error.101] parse error: nesting too deep") from None
    if _SURROGATE_ESCAPE.search(raw):           # bytes that decode hold none: only an escape can
        _no_lone_surrogates(body)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)   # made once


def _finite_only(obj):
    """NaN and infinities as null, as nlohmann's dump writes them (a setting echoed back may be one)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_only(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_only(v) for v in obj]
    return obj


def dumps(obj) -> str:
    try:
        return _ENCODER.encode(obj)
    except ValueError:                          # a non-finite float somewhere: rare, so checked only then
        return _ENCODER.encode(_finite_only(obj))


class JSONResponse(StarletteJSON):
    def render(self, content) -> bytes:
        return dumps(content).encode("utf-8")


def sse(obj) -> bytes:
    return ("data: " + dumps(obj) + "\n\n").encode()


def ndjson(obj) -> bytes:
    return (dumps(obj) + "\n").encode()
