"""Every field of a request is checked against its route's table (bankml/server/fields.py): a field
bankml does not serve is refused naming it, never dropped (a client must not get free text where it
asked for JSON, or one choice where it asked for three, with a 200), and a field no API defines is a
400 naming it, as OpenAI answers ("Unrecognized request argument supplied").

A value that asks for nothing is served as if absent: `n` 1, `tools` empty, `tool_choice` "none" or
"auto" (without tools both mean plain text), `response_format` {"type": "text"}, an empty `grammar`,
Ollama's `format` "" and `think` false, `num_ctx` the server's own, and so on (each rule's `idle`).
Anything else is 501 not_supported_error (Ollama's {"error"} with 501), or llama-server's own
refusal where it has one (`echo`, `best_of`, `suffix` on /v1/completions: 500, its message).
"""
from __future__ import annotations

from bankml.server.fields import (OLLAMA_MESSAGE, OLLAMA_OPTIONS, OPENAI_MESSAGE, REFUSED, BadRequest, Rule,
                                  ROUTES)


def unserved(field: str, rule: Rule) -> BadRequest:
    if rule.status != 501:
        return BadRequest(rule.note, rule.status, "server_error")
    return BadRequest(f"Field '{field}': {rule.note} is not served by bankml yet; leave '{field}' out", 501,
                      "not_supported_error")


def check(table: dict, body: dict, model=None, where: str = "") -> None:
    """Each field of body against table: unknown (and not null) is a 400, refused (and not idle) a 501."""
    for key, v in body.items():
        rule = table.get(key)
        if rule is None:
            if v is not None:
                raise BadRequest(f"Unrecognized request argument supplied: {where}{key}")
        elif rule.what == REFUSED and not rule.idle(v, model):
            raise unserved(where + key, rule)


def request(route: str, body: dict, model=None) -> None:
    """The fields of a request to `route` (a key of ROUTES), its messages' and its options' too.
    Messages or options of the wrong shape are left to their parsers (a 400 of their own)."""
    check(ROUTES[route], body, model)
    message_table = OLLAMA_MESSAGE if route.startswith("/api/") else OPENAI_MESSAGE
    messages = body.get("messages")
    for k, m in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(m, dict):
            check(message_table, m, model, f"messages[{k}].")
    if route.startswith("/api/") and isinstance(body.get("options"), dict):
        check(OLLAMA_OPTIONS, body["options"], model, "options.")
