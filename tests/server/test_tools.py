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
], ids=["choice", "not-array", "no-type", "type", "grammar", "call-type", "continue-call", "empty-grammar",
        "choice-not-a-string"])
def test_errors_are_llama_servers(pair, extra):
    body = {"messages": ASK, "max_tokens": 4, **extra}
    got, want = (post(url, "/v1/chat/completions", body) for url in pair)
    assert got.status_code == want.status_code and got.status_code >= 400, (got.text, want.text)
    assert got.json()["error"]["message"] == want.json()["error"]["message"]


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
    with pytest.raises(openai.APIStatusError) as e:         # streamed calls: not yet, said so
        clients[0].chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=4, stream=True)
    assert e.value.status_code == 501 and "Field 'stream'" in e.value.message


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
