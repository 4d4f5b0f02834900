"""No field silently dropped (bankml/server/fields.py's tables, bankml/server/api/refused.py's check):
every field llama-server b11434's source reads, every field of the official `openai` and `ollama`
clients' requests, is in its route's table; a refused field is refused naming it, an unknown field is
a 400 naming it, and each served field is shown to act, here by parsing or by the test named for it.
Pure parsing, no model; the clients' view is in test_clients.py."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from bankml.oracle.paths import source_dir
from bankml.server import fields as F
from bankml.server.api import ollama, refused
from bankml.server.fields import BadRequest

TESTS = Path(__file__).resolve().parents[1]
MODEL = SimpleNamespace(n_ctx=4096, n_ubatch=512, threads=2)     # what num_ctx, num_batch, num_thread compare with


def _server_source(name: str) -> str:
    return (source_dir() / "tools" / "server" / name).read_text()


def _function(text: str, name: str) -> str:
    """The source of the function `name`, without comments and #if 0 blocks."""
    start = text.index(name)
    body = re.sub(r"#if 0\n.*?#endif\n", "", text[start:text.index("\n}\n", start)], flags=re.S)
    return re.sub(r"//[^\n]*", "", body)


def test_every_field_llama_server_reads_is_in_the_tables():
    """make_llama_cmpl_schema's fields and aliases, what oaicompat_*_params_parse read of the body,
    and the task's id_slot (server-context.cpp)."""
    schema = _function(_server_source("server-schema.cpp"), "make_llama_cmpl_schema")
    names = set(re.findall(r'new field_\w+\("([a-z_]+)"', schema)) | set(re.findall(r'add_alias\("([a-z_]+)"\)', schema))
    names -= {"include_usage"}                                   # stream_options' subfield
    assert {"n_predict", "max_tokens", "logprobs", "samplers", "lora"} <= names        # the reading itself
    common = _server_source("server-common.cpp")
    body = r'(?:json_value\(body, |body\.(?:contains|at)\()"([a-z_]+)"'
    chat = set(re.findall(body, _function(common, "json oaicompat_chat_params_parse")))
    completion = set(re.findall(body, _function(common, "json oaicompat_completion_params_parse")))
    assert "messages" in chat and "prompt" in completion
    assert not names - set(F.LLAMA_SERVER), sorted(names - set(F.LLAMA_SERVER))
    assert not chat - set(F.OPENAI_CHAT), sorted(chat - set(F.OPENAI_CHAT))
    assert not completion - set(F.OPENAI_COMPLETIONS), sorted(completion - set(F.OPENAI_COMPLETIONS))
    assert 'json_value(data, "id_slot"' in _server_source("server-context.cpp") and "id_slot" in F.LLAMA_SERVER


def test_every_field_the_openai_client_sends_is_in_the_tables():
    from openai.types import completion_create_params as cmpl
    from openai.types.chat import completion_create_params as chat

    def keys(*typed_dicts):
        return set().union(*(t.__annotations__ for t in typed_dicts))
    assert not keys(chat.CompletionCreateParamsBase) - set(F.OPENAI_CHAT)
    assert not keys(cmpl.CompletionCreateParamsBase) - set(F.OPENAI_COMPLETIONS)
    from openai.types import embedding_create_params as embd
    assert not keys(embd.EmbeddingCreateParams) - set(F.EMBEDDINGS)
    from openai.types.chat import (ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam,
                                   ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam,
                                   ChatCompletionUserMessageParam)
    messages = keys(ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam,
                    ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam, ChatCompletionUserMessageParam)
    assert not messages - set(F.OPENAI_MESSAGE), sorted(messages - set(F.OPENAI_MESSAGE))


def test_every_field_the_ollama_client_sends_is_in_the_tables():
    from ollama import _types as T
    assert not set(T.ChatRequest.model_fields) - set(F.OLLAMA_CHAT)
    assert not set(T.GenerateRequest.model_fields) - set(F.OLLAMA_GENERATE)
    assert not set(T.Message.model_fields) - set(F.OLLAMA_MESSAGE)
    assert not set(T.Options.model_fields) - set(F.OLLAMA_OPTIONS)
    assert not set(T.EmbedRequest.model_fields) - set(F.OLLAMA_EMBED)


TABLES = {"/v1/chat/completions": F.OPENAI_CHAT, "/v1/completions": F.OPENAI_COMPLETIONS,
          "/api/chat": F.OLLAMA_CHAT, "/api/generate": F.OLLAMA_GENERATE, "/v1/embeddings": F.EMBEDDINGS,
          "/api/embed": F.OLLAMA_EMBED}


def _cases(what: str):
    return [(route, name) for route, table in TABLES.items() for name, rule in table.items() if rule.what == what]


@pytest.mark.parametrize("route,name", _cases(F.REFUSED))
def test_a_refused_field_that_asks_for_something_is_refused_naming_it(route, name):
    with pytest.raises(BadRequest) as e:
        refused.request(route, {name: "x"}, MODEL)
    rule = TABLES[route][name]
    if rule.status == 501:
        assert e.value.status == 501 and e.value.kind == "not_supported_error" and f"Field '{name}'" in str(e.value)
    else:                                              # llama-server's own refusal, its status and message
        assert (e.value.status, str(e.value)) == (rule.status, rule.note)


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"tools": []}), ("/v1/chat/completions", {"tool_choice": "none"}),
    ("/v1/chat/completions", {"tool_choice": "auto"}), ("/v1/chat/completions", {"response_format": {"type": "text"}}),
    ("/v1/chat/completions", {"response_format": {}}), ("/v1/chat/completions", {"grammar": ""}),
    ("/v1/chat/completions", {"json_schema": None}), ("/v1/chat/completions", {"modalities": ["text"]}),
    ("/v1/chat/completions", {"reasoning_budget_tokens": -1}),
    ("/v1/chat/completions", {"reasoning_format": "none"}),
    ("/v1/chat/completions", {"adaptive_target": -1}), ("/v1/completions", {"echo": False}),
    ("/api/chat", {"format": ""}), ("/api/chat", {"think": False}), ("/api/generate", {"images": []}),
    ("/api/chat", {"options": {"num_ctx": 4096, "num_batch": 512, "num_thread": 2, "tfs_z": 1.0}}),
    ("/api/chat", {"options": {"num_thread": 0}}), ("/api/chat", {"messages": [{"role": "user", "images": None}]}),
    ("/api/chat", {"messages": "hi"}), ("/api/chat", {"messages": [1]}), ("/api/chat", {"unknown_but_null": None})])
def test_a_value_that_asks_for_nothing_is_served_as_absent(route, body):
    refused.request(route, body, MODEL)


@pytest.mark.parametrize("route,body,field", [
    ("/v1/chat/completions", {"grammar_lazy": True}, "grammar_lazy"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images"),
    ("/api/chat", {"options": {"num_ctx": 8192}}, "options.num_ctx"),
    ("/api/chat", {"options": {"num_thread": 3}}, "options.num_thread"),
    ("/api/generate", {"options": {"num_batch": 64}}, "options.num_batch")])
def test_values_that_ask_for_more_are_refused(route, body, field):
    with pytest.raises(BadRequest) as e:
        refused.request(route, body, MODEL)
    assert e.value.status == 501 and f"Field '{field}'" in str(e.value)


@pytest.mark.parametrize("route,body,field", [
    ("/v1/chat/completions", {"temprature": 0.5}, "temprature"), ("/v1/completions", {"best_off": 2}, "best_off"),
    ("/api/chat", {"images": ["aGk="]}, "images"), ("/api/generate", {"options": {"top_kk": 3}}, "options.top_kk"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "weight": 2}]}, "messages[0].weight")])
def test_an_unknown_field_is_a_400_naming_it(route, body, field):
    with pytest.raises(BadRequest) as e:
        refused.request(route, body, MODEL)
    assert e.value.status == 400 and str(e.value) == f"Unrecognized request argument supplied: {field}"


@pytest.mark.parametrize("route,name", _cases(F.INERT))
def test_an_inert_field_says_why_it_changes_nothing(route, name):
    assert len(TABLES[route][name].note) > 20
    refused.request(route, {name: "anything"}, MODEL)


# ---------------------------------------------------------------- each served field acts

# a value for each sampling-side field: the job parsed with it differs from the job without it
PROBES = {"top_k": 7, "top_p": 0.5, "min_p": 0.2, "top_n_sigma": 1.0, "xtc_probability": 0.5, "xtc_threshold": 0.2,
          "typical_p": 0.5, "temperature": 0.3, "dynatemp_range": 0.5, "dynatemp_exponent": 2.0, "repeat_last_n": 8,
          "repeat_penalty": 1.2, "frequency_penalty": 0.5, "presence_penalty": 0.5, "dry_multiplier": 0.8,
          "dry_base": 2.0, "dry_allowed_length": 3, "dry_penalty_last_n": 16, "mirostat": 2, "mirostat_tau": 4.0,
          "mirostat_eta": 0.2, "min_keep": 3, "seed": 5, "n_probs": 3, "logprobs": 3, "post_sampling_probs": True,
          "dry_sequence_breakers": ["\n"], "logit_bias": [[5, 1.0]], "ignore_eos": True, "stop": ["x"],
          "samplers": ["top_k"], "n_predict": 9, "max_tokens": 9, "max_completion_tokens": 9, "cache_prompt": False,
          "t_max_predict_ms": 5}
OLLAMA_PROBES = {"seed": 5, "num_predict": 9, "top_k": 7, "top_p": 0.5, "min_p": 0.2, "typical_p": 0.5,
                 "repeat_last_n": 8, "temperature": 0.3, "repeat_penalty": 1.2, "presence_penalty": 0.5,
                 "frequency_penalty": 0.5, "stop": ["x"], "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2}

# the served fields that shape the prompt, the stream or the response: the test that shows each acting
ELSEWHERE = {
    "stream": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "n": "server/test_n_completions.py::test_native_completions_equal_llama_servers_and_each_lone_seed",
    "n_cmpl": "server/test_n_completions.py::test_more_completions_than_slots_is_llama_servers_400",
    "stream_options": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "verbose": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "return_tokens": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "sse_ping_interval": "server/test_http_faults.py::test_a_request_sets_its_own_sse_ping_interval",
    "messages": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "add_generation_prompt": "server/test_utility_routes.py::test_apply_template_answers_as_llama_server",
    "continue_final_message": "server/test_utility_routes.py::test_apply_template_answers_as_llama_server",
    "top_logprobs": "server/test_oracle_sampling.py::test_chat_logprobs_equal_llama_server",
    "prompt": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "options": "server/test_fields.py::test_ollama_options_map_to_llama_server_fields",
    "system": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "raw": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "role": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "content": "server/test_oracle_server.py::test_request_sequence_equals_llama_server",
    "input": "server/test_embeddings.py::test_embeddings_equal_llama_servers",
    "encoding_format": "server/test_embeddings.py::test_embeddings_equal_llama_servers",
    "embd_normalize": "server/test_embeddings.py::test_embeddings_equal_llama_servers",
    "response_fields": "server/test_native_fields.py::test_response_fields_keep_the_paths_asked",
    "id_slot": "server/test_native_fields.py::test_id_slot_runs_the_request_on_that_slot",
    "timings_per_token": "server/test_native_fields.py::test_timings_per_token_on_every_streamed_token",
    "chat_template_kwargs": "runtime/test_chat.py::test_template_variables_equal_llama_servers",
    "reasoning_effort": "runtime/test_chat.py::test_template_variables_equal_llama_servers",
    "name": "server/test_refused.py::test_message_fields_reach_the_template",
    "tool_call_id": "server/test_refused.py::test_message_fields_reach_the_template",
    "reasoning_content": "server/test_refused.py::test_message_fields_reach_the_template",
    "grammar": "server/test_structured.py::test_completion_tokens_equal_llama_servers",
    "json_schema": "server/test_structured.py::test_completion_tokens_equal_llama_servers",
    "response_format": "server/test_structured.py::test_chat_content_equals_llama_servers",
    "format": "server/test_structured.py::test_ollama_format_is_what_ollama_sends_llama_server",
    "tools": "server/test_tools.py::test_calls_and_tokens_equal_llama_servers",
    "tool_choice": "server/test_tools.py::test_tool_choice_none_leaves_the_call_as_text",
    "parallel_tool_calls": "server/test_tools.py::test_calls_and_tokens_equal_llama_servers",
    "tool_calls": "server/test_tools.py::test_the_prompt_with_tools_and_calls_equals_llama_servers",
    "tool_name": "server/test_tools.py::test_the_ollama_client_calls_tools_as_ollama_over_llama_server",
    "tool_call_id": "server/test_tools.py::test_the_prompt_with_tools_and_calls_equals_llama_servers",
}


@pytest.mark.parametrize("name", [n for n, r in F.LLAMA_SERVER.items() if r.what == F.SERVED and n in PROBES])
def test_a_served_sampling_field_changes_the_job(name):
    vocab = F.Vocab(100, eog=(2,))
    assert F.job_fields({name: PROBES[name]}, vocab) != F.job_fields({}, vocab)


@pytest.mark.parametrize("name", [n for n, r in F.OLLAMA_OPTIONS.items() if r.what == F.SERVED])
def test_a_served_ollama_option_changes_the_job(name):
    assert ollama.options_fields({"options": {name: OLLAMA_PROBES[name]}}) != ollama.options_fields({})


def test_every_served_field_is_shown_acting():
    tables = [*TABLES.values(), F.OPENAI_MESSAGE, F.OLLAMA_MESSAGE]
    served = {n for t in tables for n, r in t.items() if r.what == F.SERVED} - set(PROBES) - set(OLLAMA_PROBES)
    assert not served - set(ELSEWHERE), sorted(served - set(ELSEWHERE))
    for name in served:
        path, test = ELSEWHERE[name].split("::")
        assert re.search(rf"^(async )?def {test}\(", (TESTS / path).read_text(), re.M), ELSEWHERE[name]


def test_message_fields_reach_the_template():
    """name, tool_call_id and reasoning_content are handed to the template (when not empty), as
    common_chat_msg::to_json_oaicompat hands them; llama-server's own renders of them on the test
    models' templates are in test_utility_routes.py."""
    from bankml.runtime.chat import render_template
    from bankml.server.api import openai
    source = "{% for m in messages %}[{{ m.name }}|{{ m.tool_call_id }}|{{ m.reasoning_content }}]{% endfor %}"
    messages = openai.chat_messages({"messages": [
        {"role": "user", "content": "a", "name": "ann"}, {"role": "tool", "content": "b", "tool_call_id": "c1"},
        {"role": "assistant", "content": "c", "reasoning_content": "r", "name": ""}]})
    assert render_template(source, messages, add_generation_prompt=False) == "[ann||][|c1|][||r]"
    with pytest.raises(BadRequest, match="type must be string, but is number"):
        openai.chat_messages({"messages": [{"role": "user", "content": "a", "name": 3}]})


def test_docs_list_every_field():
    docs = (TESTS.parent / "docs" / "SERVER.md").read_text()
    section = docs[docs.index("## Every field a request may carry"):docs.index("## What differs from llama-server")]
    tables = [*TABLES.values(), F.OPENAI_MESSAGE, F.OLLAMA_MESSAGE, F.OLLAMA_OPTIONS]
    missing = sorted({n for t in tables for n in t if f"`{n}`" not in section})
    assert not missing, missing
