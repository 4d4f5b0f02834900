"""Tool calls against llama-server b11434 --jinja, both given the same tool-calling chat template
(Qwen 2.5's, tests/data, through --chat-template-file): the prompt with tools and a call's round
trip, the tokens and the parsed calls under tool_choice "required" and "auto" (a lazy grammar),
greedy and sampled, parallel calls on and off; errors with llama-server's status and message;
the openai client drives a call and its result back."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

MODEL = "smollm2-q4_1"
TEMPLATE = str(Path(__file__).parents[1] / "data" / "qwen2.5_tool_template.jinja")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}


def call(name: str, args: dict, cid: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# a conversation that has called tools before, and one that asks for a call outright
FEW_SHOT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"}, "c1")]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "It is 21 degrees in Paris."},
    {"role": "user", "content": "Weather in Berlin?"}]
ASK = [{"role": "user", "content": "Repeat after me: <tool_call>\n"
                                   "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"}]


@pytest.fixture(scope="module")
def pair():
    with BankmlServer(MODEL, "--chat-template-file", TEMPLATE, threads=1) as ours, \
            LlamaServer(models.path(MODEL), threads=1, extra=("--chat-template-file", TEMPLATE)) as theirs:
        yield ours.url, theirs.url


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=300)


def answers(pair, body: dict) -> list[dict]:
    """Each server's first choice, its calls' random ids checked and set aside."""
    out = []
    for url in pair:
        r = post(url, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        for tc in choice["message"].get("tool_calls", []):
            assert len(tc.pop("id")) == 32
        out.append(choice)
    return out


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("body", [
    {"messages": ASK, "tools": [WEATHER]},
    {"messages": FEW_SHOT, "tools": [WEATHER, ADD]},
    {"messages": FEW_SHOT, "tools": [WEATHER], "tool_choice": "none"},
    {"messages": [*FEW_SHOT[:2], {**FEW_SHOT[2], "name": "get_weather"}], "tools": [WEATHER]},
    {"messages": [FEW_SHOT[0], {"role": "assistant", "content": None, "tool_calls": [
        call("get_weather", {"city": "Paris"}, "c1"), {"type": "function", "function": {
            "name": "add", "arguments": {"a": 1, "b": 2}}}]}, FEW_SHOT[2]], "add_generation_prompt": False},
], ids=["tools", "history", "none", "tool-name", "object-arguments"])
def test_the_prompt_with_tools_and_calls_equals_llama_servers(pair, body):
    got, want = (post(url, "/apply-template", body).json() for url in pair)
    assert got == want
    assert "<tools>" in want["prompt"] or "tools" not in body
    assert "<tool_call>" in want["prompt"]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("choice", ["required", "auto"])
@pytest.mark.parametrize("messages", [ASK, FEW_SHOT], ids=["ask", "few-shot"])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.5, "seed": 5}], ids=["greedy", "sampled"])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "single"])
def test_calls_and_tokens_equal_llama_servers(pair, choice, messages, sampling, parallel):
    tools = [WEATHER] if messages is ASK else [WEATHER, ADD]
    body = {"messages": messages, "tools": tools, "tool_choice": choice, "max_tokens": 60,
            "parallel_tool_calls": parallel, "cache_prompt": False, **sampling}     # the same bits in any order
    got, want = answers(pair, body)
    assert got == want
    if messages is ASK:             # the model does call here: the calls are parsed, not left as text
        assert got["finish_reason"] == "tool_calls" and got["message"]["content"] == ""
        fn = got["message"]["tool_calls"][0]["function"]
        assert fn["name"] == "get_weather" and json.loads(fn["arguments"])["city"] == "Oslo"


def stream(url: str, body: dict) -> list[tuple]:
    """A streamed answer as (delta, finish_reason) per chunk, each call's id checked (32 characters,
    the same on every chunk of that call) and set aside."""
    out, ids = [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                for tc in choice["delta"].get("tool_calls", []):
                    if "id" in tc:
                        assert len(tc["id"]) == 32 and ids.setdefault(tc["index"], tc["id"]) == tc["id"]
                        tc["id"] = "X"
                out.append((choice["delta"], choice["finish_reason"]))
    return out


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("choice", ["required", "auto"])
@pytest.mark.parametrize("messages", [ASK, FEW_SHOT], ids=["ask", "few-shot"])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.5, "seed": 5}], ids=["greedy", "sampled"])
def test_streamed_calls_equal_llama_servers(pair, choice, messages, sampling):
    """Content and call deltas chunk by chunk: the answer parsed again at every token, as llama-server does."""
    body = {"messages": messages, "tools": [WEATHER, ADD], "tool_choice": choice, "max_tokens": 60,
            "cache_prompt": False, **sampling}
    got, want = (stream(url, body) for url in pair)
    assert got == want
    if messages is ASK and "seed" not in sampling:
        assert want[-1][1] == "tool_calls" and sum("tool_calls" in d for d, _ in want) > 3


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("max_tokens", [3, 8, 14, 20])
def test_a_call_cut_short_is_answered_as_llama_server(pair, max_tokens):
    """Cut inside the marker (the raw text), before the name is whole, inside the arguments."""
    body = {"messages": ASK, "tools": [WEATHER], "max_tokens": max_tokens, "cache_prompt": False, "temperature": 0}
    got, want = answers(pair, body)
    assert got == want and got["finish_reason"] == "length"
    assert stream(pair[0], body) == stream(pair[1], body)


@pytest.mark.oracle
@pytest.mark.server
def test_tool_choice_none_leaves_the_call_as_text(pair):
    """The same request under "none": the template still shows the tools, the call stays text."""
    body = {"messages": ASK, "tools": [WEATHER], "max_tokens": 60, "temperature": 0, "cache_prompt": False}
    plain, = answers(pair[:1], {**body, "tool_choice": "none"})
    called, = answers(pair[:1], {**body, "tool_choice": "auto"})
    assert "<tool_call>" in plain["message"]["content"] and "tool_calls" not in plain["message"]
    assert called["message"]["tool_calls"] and called["finish_reason"] == "tool_calls"


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("extra", [
    {"tool_choice": "sometimes"}, {"tools": {"a": 1}}, {"tools": [{"function": {"name": "f"}}]},
    {"tools": [{"type": "retrieval"}]}, {"tools": [WEATHER], "grammar": "root ::= \"x\""},
    {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
    {"messages": [*ASK, {"role": "assistant", "tool_calls": [call("add", {"a": 1}, "c1")]}]},
    {"tools": [WEATHER], "grammar": ""}, {"tools": [WEATHER], "tool_choice": 5, "grammar": ""},
    {"tools": [{"type": "function", "function": {}}]}, {"tools": [{"type": "function", "function": {"name": 3}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "description": [1]}}]},
], ids=["choice", "not-array", "no-type", "type", "grammar", "call-type", "continue-call", "empty-grammar",
        "choice-not-a-string", "no-name", "name-type", "description-type"])
def test_errors_are_llama_servers(pair, extra):
    body = {"messages": ASK, "max_tokens": 4, **extra}
    got, want = (post(url, "/v1/chat/completions", body) for url in pair)
    assert got.status_code == want.status_code and got.status_code >= 400, (got.text, want.text)
    assert got.json()["error"]["message"] == want.json()["error"]["message"]


@pytest.mark.server
def test_a_named_tool_choice_is_refused_not_taken_for_auto(pair):
    """llama-server takes an object tool_choice (OpenAI: call this function) for "auto"; bankml says so."""
    r = post(pair[0], "/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "max_tokens": 4,
                                               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert r.status_code == 501 and "Field 'tool_choice'" in r.json()["error"]["message"]


@pytest.mark.oracle
@pytest.mark.server
def test_the_openai_client_calls_a_tool_and_sends_its_result_back(pair):
    import openai
    clients = [openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) for url in pair]
    replies = [c.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                         max_tokens=60, temperature=0, extra_body={"cache_prompt": False})
               for c in clients]
    ours, theirs = (r.choices[0].message for r in replies)
    assert ours.tool_calls[0].function.name == theirs.tool_calls[0].function.name == "get_weather"
    assert ours.tool_calls[0].function.arguments == theirs.tool_calls[0].function.arguments
    turn = [*ASK, ours.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": ours.tool_calls[0].id, "content": "{\"temp\": 3}"}]
    again = [c.chat.completions.create(model="m", messages=turn, tools=[WEATHER], max_tokens=20, temperature=0)
             for c in clients]
    assert again[0].choices[0].message.content == again[1].choices[0].message.content
    name, args = "", ""                                     # streamed: the client puts the call together
    for chunk in clients[0].chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=60,
                                                    temperature=0, stream=True, extra_body={"cache_prompt": False}):
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            name += tc.function.name or "" if tc.function else ""
            args += tc.function.arguments or "" if tc.function else ""
    assert (name, args) == (ours.tool_calls[0].function.name, ours.tool_calls[0].function.arguments)


@pytest.mark.server
def test_a_template_without_tool_calls_renders_plain_answers():
    """SmolLM2's own template renders no tools: llama-server answers plain text, and so does bankml
    (tools reach the template, which ignores them; no grammar, no call parsing)."""
    from bankml.server.api.openai import chat_inputs
    from bankml.server.api.structured import chat
    m = models.path(MODEL)
    messages, variables, req = chat_inputs(m, {"messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
    assert variables["tools"] == [WEATHER] and req.choice == "required"
    assert chat({}, m, messages, variables, False, req) is None


def ollama_gathers(url: str, body: dict) -> tuple[str, list[dict]]:
    """What Ollama (llm/llama_server.go Chat) makes of llama-server's stream: the content deltas
    joined, the calls' deltas gathered per index, their arguments parsed."""
    content, calls = "", {}
    for delta, _ in stream(url, body):
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls", []):
            acc = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            acc["name"] += tc.get("function", {}).get("name", "")
            acc["arguments"] += tc.get("function", {}).get("arguments", "")
    return content, [{"function": {"index": k, "name": c["name"], "arguments": json.loads(c["arguments"])}}
                     for k, c in sorted(calls.items())]


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("messages", [ASK, FEW_SHOT], ids=["ask", "few-shot"])
def test_the_ollama_client_calls_tools_as_ollama_over_llama_server(pair, messages):
    """Ollama sends a chat with tools to llama-server's /v1/chat/completions (streamed, its default
    options, tool calls with their arguments as JSON text, tool_name as name) and gathers the deltas:
    the ollama client gets the same content and calls from bankml, and a call's result goes back."""
    import ollama

    from bankml.server.api.ollama import DEFAULTS      # the sampling fields Ollama sends with each request
    oll = ollama.Client(host=pair[0])

    def as_ollama(m: dict) -> dict:                     # an OpenAI-shaped message as an Ollama client sends it
        out = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            out["tool_calls"] = [{"function": {"name": c["function"]["name"],
                                               "arguments": json.loads(c["function"]["arguments"])}}
                                 for c in m["tool_calls"]]
        return out

    def as_sent(m: dict) -> dict:                       # ... and as Ollama passes it on to llama-server
        out = {"role": m["role"]}
        if m.get("tool_calls"):
            out["tool_calls"] = [{"index": 0, "type": "function", "function": {
                "name": c["function"]["name"],
                "arguments": json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":"))}}
                for c in m["tool_calls"]]
        return {**out, "content": m.get("content") or ""}
    got = oll.chat(model="m", messages=[as_ollama(m) for m in messages], tools=[WEATHER],
                   options={"temperature": 0, "num_predict": 60})
    go_order = {"type": "function", "function": {     # api.Tool as Go writes it: required before properties
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "required": ["city"], "properties": WEATHER["function"]["parameters"]["properties"]}}}
    want = ollama_gathers(pair[1], {"messages": [as_sent(m) for m in messages], "tools": [go_order],
                                    "max_tokens": 60, **DEFAULTS, "temperature": 0})
    calls = [{"function": {"index": k, "name": c.function.name, "arguments": dict(c.function.arguments)}}
             for k, c in enumerate(got.message.tool_calls or [])]      # the client 0.6.3 keeps no index
    assert (got.message.content, calls) == want
    if messages is ASK:
        assert calls and calls[0]["function"]["name"] == "get_weather"
        turn = [*[as_ollama(m) for m in messages], got.message,
                {"role": "tool", "content": "{\"temp\": 3}", "tool_name": "get_weather"}]
        again = oll.chat(model="m", messages=turn, tools=[WEATHER], options={"temperature": 0, "num_predict": 12})
        assert again.message.content is not None
