"""Request fields as llama-server b11434 reads them (tools/server/server-schema.cpp).

    job_fields(body) -> dict(n_predict=..., params=SamplerParams(...), seed=..., stop=[...], ...)

A null field is absent. A field of the wrong type is a 400 naming it, with nlohmann::json's
message ("Field 'temperature': [json.exception.type_error.302] type must be number, but is
string"). Soft limits clamp (temperature >= 0, top_k >= 0, top_p and min_p in [0, 1]); hard
limits refuse (n_predict -1..INT32_MAX). Integers take a float's integer part, as get<int> does.
"""
from __future__ import annotations

from bankml.runtime.sampler import LLAMA_DEFAULT_SEED, SamplerParams

INT32_MAX = 2**31 - 1


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


def num(body: dict, names, default, kind=float, lo=None, hi=None, hard=False):
    names = (names,) if isinstance(names, str) else names
    name, v = present(body, *names)
    if name is None:
        return default
    if not isinstance(v, (int, float)):         # bool is an int: nlohmann converts it too
        raise _type_error(name, "number", v)
    v = kind(v)
    if kind is int and v != v:                  # NaN cannot come from JSON; keep the branch simple
        v = 0
    if hard and ((lo is not None and v < lo) or (hi is not None and v > hi)):
        raise BadRequest(f"Field '{name}': Value must be between {lo} <= value <= {hi}, but got {v}")
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


# sampler settings bankml reproduces only at their off values (SamplerParams refuses others)
_OFF = {"typical_p": 1.0, "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
        "dry_multiplier": 0.0, "xtc_probability": 0.0}


def seed_of(body: dict, name: str = "seed") -> int:
    """get<uint32_t>: -1 (or any negative) wraps; 0xFFFFFFFF is LLAMA_DEFAULT_SEED, a random seed."""
    v = num(body, name, LLAMA_DEFAULT_SEED, kind=int)
    return int(v) & 0xFFFFFFFF


def sampler_params(body: dict) -> SamplerParams:
    d = SamplerParams()
    kw = dict(temp=num(body, "temperature", d.temp, float, 0.0),
              top_k=num(body, "top_k", d.top_k, int, 0, INT32_MAX),
              top_p=num(body, "top_p", d.top_p, float, 0.0, 1.0),
              min_p=num(body, "min_p", d.min_p, float, 0.0, 1.0),
              min_keep=num(body, "min_keep", d.min_keep, int, 0))
    for name, off in _OFF.items():
        v = num(body, name, off, float)
        if v != off:
            raise BadRequest(f"Field '{name}': bankml reproduces llama.cpp's sampler only with {name}={off} "
                             "(off); this server does not support other values", 501, "not_supported_error")
    sigma = num(body, "top_n_sigma", -1.0, float)
    if sigma > 0:
        raise BadRequest("Field 'top_n_sigma': bankml supports only top_n_sigma <= 0 (off)", 501,
                         "not_supported_error")
    return SamplerParams(**kw)


def job_fields(body: dict) -> dict:
    """n_predict (max_completion_tokens, max_tokens), sampler, seed, stop, stream, cache_prompt."""
    return dict(n_predict=num(body, ("n_predict", "max_completion_tokens", "max_tokens"), -1, int, -1, INT32_MAX,
                              hard=True),
                params=sampler_params(body), seed=seed_of(body), stop=stop_words(body),
                cache_prompt=boolean(body, "cache_prompt", True))
