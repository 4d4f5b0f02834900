"""Fields bankml does not serve are refused naming the field (bankml/server/api/refused.py): pure
parsing, no model. The clients' view is in test_clients.py."""
from __future__ import annotations

import pytest

from bankml.server.api import refused
from bankml.server.fields import BadRequest


@pytest.mark.parametrize("body,field", [
    ({"n": 2}, "n"), ({"n": 0}, "n"), ({"n": True}, "n"), ({"n_cmpl": 3}, "n_cmpl"), ({"tools": [{}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"), ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"), ({"response_format": "json"}, "response_format"),
    ({"grammar": "root ::= \"a\""}, "grammar"), ({"json_schema": {}}, "json_schema")])
def test_openai_fields_that_ask_for_what_bankml_does_not_serve_are_501(body, field):
    with pytest.raises(BadRequest) as e:
        refused.openai_fields(body)
    assert e.value.status == 501 and e.value.kind == "not_supported_error" and f"Field '{field}'" in str(e.value)


@pytest.mark.parametrize("body", [{}, {"n": 1}, {"n": None}, {"tools": []}, {"tools": None}, {"tool_choice": "none"},
                                  {"tool_choice": "auto"}, {"response_format": {"type": "text"}},
                                  {"response_format": {}}, {"grammar": ""}, {"json_schema": None}])
def test_openai_fields_that_ask_for_nothing_are_served(body):
    refused.openai_fields(body)


@pytest.mark.parametrize("body,field", [
    ({"format": "json"}, "format"), ({"format": {"type": "object"}}, "format"), ({"tools": [{}]}, "tools"),
    ({"think": True}, "think"), ({"think": "high"}, "think"), ({"images": ["aGk="]}, "images"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images")])
def test_ollama_fields_that_ask_for_what_bankml_does_not_serve_are_501(body, field):
    with pytest.raises(BadRequest) as e:
        refused.ollama_fields(body)
    assert e.value.status == 501 and f"Field '{field}'" in str(e.value)


@pytest.mark.parametrize("body", [{}, {"format": ""}, {"think": False}, {"images": []}, {"messages": -2147483649},
                                  {"messages": "hi"}, {"messages": [1, {"images": None}]}])
def test_ollama_fields_that_ask_for_nothing_or_are_malformed_elsewhere_pass(body):
    """Messages of another type are the message parser's to refuse (400), never a 500 here."""
    refused.ollama_fields(body)
