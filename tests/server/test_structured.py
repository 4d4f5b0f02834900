"""Structured output against llama-server b11434: "grammar" (GBNF), "json_schema", a chat's
response_format (json_object, json_schema) and Ollama's format give llama-server's tokens, greedy
and sampled with a seed (the chain samples, the grammar checks the token, and a rejected one is
drawn again from the row masked by the grammar: common_sampler_sample's order); bad grammars and
schemas get llama-server's status and message; the openai and ollama clients drive it."""
from __future__ import annotations

import json

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
LIST = {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}
CHAT = [{"role": "user", "content": "Give me a person as JSON."}]


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(MODEL, threads=1) as ours, LlamaServer(models.path(MODEL), threads=1) as theirs:
        yield ours.url, theirs.url


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=300)


def both(pair, path: str, body: dict) -> list[dict]:
    out = []
    for url in pair:
        r = post(url, path, body)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


SAMPLED = {"temperature": 0.8, "seed": 7}


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("constraint", [
    {"grammar": 'root ::= ("yes" | "no") "!" [ \\n]* "because " [a-z ]{3,20} "."'},
    {"grammar": 'root ::= [0-9]{1,4} ("," [0-9]{1,4})*'},
    {"json_schema": PERSON},
    {"json_schema": LIST},
    {"json_schema": {}},
])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, SAMPLED], ids=["greedy", "sampled"])
def test_completion_tokens_equal_llama_servers(pair, constraint, sampling):
    body = {"prompt": "Q: Is the sky blue? Answer in JSON or as asked.\nA:", "n_predict": 40,
            "return_tokens": True, **sampling, **constraint}
    got, want = both(pair, "/completion", body)
    assert got["tokens"] == want["tokens"] and got["content"] == want["content"]
    assert got["generation_settings"]["grammar"] == want["generation_settings"]["grammar"]
    assert got["stop_type"] == want["stop_type"]


@pytest.mark.oracle
@pytest.mark.server
def test_the_grammar_changes_the_answer(pair):
    """Without the grammar the model says something else: the constraint acts."""
    body = {"prompt": "Q: Is the sky blue?\nA:", "n_predict": 12, "temperature": 0, "return_tokens": True}
    free, = both(pair[:1], "/completion", body)
    held, = both(pair[:1], "/completion", {**body, "grammar": 'root ::= "maybe" [.!]'})
    assert held["content"] in ("maybe.", "maybe!") and free["content"] != held["content"]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_object", "schema": LIST}},
    {"json_schema": PERSON},
    {"grammar": 'root ::= "{" [a-z"]{1,12} "}"'},
    {"grammar": 'root ::= "x"', "response_format": {"type": "json_object"}},     # response_format wins
    {"response_format": {"type": "text"}},
])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, SAMPLED], ids=["greedy", "sampled"])
def test_chat_content_equals_llama_servers(pair, extra, sampling):
    body = {"messages": CHAT, "max_tokens": 40, **sampling, **extra}
    got, want = both(pair, "/v1/chat/completions", body)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]


def streamed_content(url: str, body: dict) -> str:
    text = ""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text += c["delta"].get("content") or ""
    return text


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("max_tokens", [3, 6, 12, 40])
def test_the_chat_parser_takes_the_json_out_of_its_fence(pair, max_tokens):
    """llama-server's chat parser gives a response format's JSON alone (no ```json fence, no space
    around it), all of a value the answer stops inside of, and the raw text when none has started
    (streaming nothing then): the same answers, whole and streamed."""
    body = {"messages": CHAT, "max_tokens": max_tokens, "temperature": 0, "json_schema": PERSON}
    got, want = both(pair, "/v1/chat/completions", body)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert streamed_content(pair[0], body) == streamed_content(pair[1], body)


BAD = [
    ("/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= foo"}),
    ("/completion", {"prompt": "x", "n_predict": 2, "grammar": 'root ::= [a-z'}),
    ("/completion", {"prompt": "x", "n_predict": 2, "json_schema": {"type": "string", "pattern": "^(abc$"}}),
    ("/completion", {"prompt": "x", "n_predict": 2,
                     "json_schema": {"type": "object", "properties": {"a": {"$ref": "#/definitions/nope"}}}}),
    ("/completion", {"prompt": "x", "n_predict": 2, "json_schema": "notaschema"}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "properties": {"a": {"$ref": "#/definitions/nope"}}}}}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "response_format": {"type": "xml"}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "grammar": "root ::= ["}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "grammar": 'root ::= "a"',
                              "json_schema": {"type": "string"}}),
]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("path,body", BAD, ids=range(len(BAD)))
def test_bad_grammars_and_schemas_get_llama_servers_error(pair, path, body):
    got, want = (post(url, path, body) for url in pair)
    assert want.status_code in (400, 500)
    assert got.status_code == want.status_code and got.json()["error"]["message"] == want.json()["error"]["message"]


@pytest.mark.server
@pytest.mark.parametrize("body", [
    {"response_format": "json"},                                          # llama-server: ignored
    {"response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}},   # llama-server: ignored
])
def test_what_llama_server_drops_is_refused(pair, body):
    r = post(pair[0], "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, **body})
    assert r.status_code == 400 and "response_format" in r.json()["error"]["message"]


@pytest.mark.oracle
@pytest.mark.server
def test_ollama_format_is_what_ollama_sends_llama_server(pair):
    """Ollama (llm/llama_server.go) sends a chat's format as response_format and a generate's as its
    own JSON grammar or json_schema to /completion: the same tokens as llama-server given those."""
    from bankml.server.api.ollama import DEFAULTS        # the sampling fields Ollama sends with each request
    ours, theirs = pair
    for fmt, rf in (("json", {"type": "json_object"}),
                    (PERSON, {"type": "json_schema", "json_schema": {"name": "schema", "schema": PERSON}})):
        got = post(ours, "/api/chat", {"model": "m", "messages": CHAT, "stream": False, "format": fmt,
                                       "options": {"temperature": 0, "num_predict": 40}}).json()
        want = post(theirs, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 40, **DEFAULTS,
                                                    "temperature": 0, "response_format": rf}).json()
        assert got["message"]["content"] == want["choices"][0]["message"]["content"]
    from bankml.server.api.structured import OLLAMA_JSON
    prompt = "Describe a cat as JSON:"
    for fmt, native in (("json", {"grammar": OLLAMA_JSON}), (LIST, {"json_schema": LIST})):
        got = post(ours, "/api/generate", {"model": "m", "prompt": prompt, "raw": True, "stream": False,
                                           "format": fmt, "options": {"temperature": 0, "num_predict": 30}}).json()
        want = post(theirs, "/completion", {"prompt": prompt, "n_predict": 30, **DEFAULTS, "temperature": 0,
                                            **native}).json()
        assert got["response"] == want["content"]
    r = post(ours, "/api/chat", {"model": "m", "messages": CHAT, "stream": False, "format": "xml"})
    assert r.status_code == 400 and r.json()["error"].startswith('invalid format: "\\"xml\\""')


@pytest.mark.oracle
@pytest.mark.server
def test_clients_get_schema_conforming_json(pair):
    import ollama
    import openai
    client = openai.OpenAI(base_url=pair[0] + "/v1", api_key="none")
    r = client.chat.completions.create(
        model="m", messages=CHAT, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    person = json.loads(r.choices[0].message.content.strip().removeprefix("```json").removesuffix("```"))
    assert isinstance(person["name"], str) and isinstance(person["age"], int)
    out = ollama.Client(host=pair[0]).chat(model="m", messages=CHAT, format=PERSON,
                                           options={"temperature": 0, "num_predict": 60})
    person = json.loads(out.message.content)
    assert set(person) == {"name", "age"}


@pytest.mark.oracle
@pytest.mark.server
def test_gemma3_sampled_json_equals_llama_servers():
    """A 262,144-token SentencePiece vocabulary (byte pieces, partial UTF-8): /completion with a
    schema and a chat response format, sampled, give llama-server's tokens."""
    name = "gemma3-270m-q4_k_m"
    with BankmlServer(name, threads=1) as ours, LlamaServer(models.path(name), threads=1) as theirs:
        pair = (ours.url, theirs.url)
        body = {"prompt": "Une personne en JSON :", "n_predict": 32, "return_tokens": True, **SAMPLED,
                "json_schema": {"type": "object", "properties": {"nom": {"type": "string"},
                                                                 "ville": {"enum": ["Paris", "Lyon", "Zürich"]}}}}
        got, want = both(pair, "/completion", body)
        assert got["tokens"] == want["tokens"]
        chat = {"messages": CHAT, "max_tokens": 32, **SAMPLED, "response_format": {"type": "json_object"}}
        got, want = both(pair, "/v1/chat/completions", chat)
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
