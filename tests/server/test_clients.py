"""The real `openai` and `ollama` client packages drive `bankml serve` (with an API key),
streaming and not: chat, completion, model listing; and the refusals keep the server serving."""
from __future__ import annotations

import httpx
import ollama
import openai
import pytest

KEY = "test-key"
N = 12


@pytest.fixture(scope="module")
def srv(bankml_server_factory):
    return bankml_server_factory("qwen3-small-q1_0", "--api-key", KEY, "--ctx", "512", "--threads", "1")


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def oll(srv):
    return ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {KEY}"})


MSG = [{"role": "user", "content": "Name a color."}]


@pytest.mark.server
def test_openai_client_chat_streaming_equals_non_streaming(oai):
    r = oai.chat.completions.create(model="m", messages=MSG, max_tokens=N, temperature=0, extra_body={"cache_prompt": False})
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= N
    chunks = oai.chat.completions.create(model="m", messages=MSG, max_tokens=N, temperature=0, stream=True,
                                         extra_body={"cache_prompt": False})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content


@pytest.mark.server
def test_openai_client_completion_and_models(oai):
    r = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=N, temperature=0, seed=1)
    s = oai.completions.create(model="m", prompt="Once upon a time", max_tokens=N, temperature=0, stream=True,
                               extra_body={"cache_prompt": False})
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    assert [m.id for m in oai.models.list()] == ["qwen3-small-q1_0.gguf"]


@pytest.mark.server
def test_ollama_client_chat_generate_list_show(oll, oai):
    o = {"temperature": 0, "num_predict": N}
    r = oll.chat(model="m", messages=MSG, options=o, stream=False)
    assert r.done and r.done_reason in ("stop", "length") and r.eval_count <= N and r.total_duration > 0
    streamed = "".join(c.message.content for c in oll.chat(model="m", messages=MSG, options=o, stream=True))
    assert streamed == r.message.content
    g = oll.generate(model="m", prompt="Once upon a time", raw=True, options=o)
    gs = "".join(c.response for c in oll.generate(model="m", prompt="Once upon a time", raw=True, options=o, stream=True))
    assert gs == g.response and g.prompt_eval_count == 4
    assert [m.model for m in oll.list().models] == ["qwen3-small-q1_0.gguf"]
    assert oll.show("m").details.family == "qwen3"
    running = oll.ps().models
    assert [m.model for m in running] == ["qwen3-small-q1_0.gguf"] and running[0].size_vram == 0
    assert running[0].size > 0 and running[0].expires_at.year > 2100


@pytest.mark.server
def test_refusals_have_llama_server_status_and_shape(srv, oai):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSG}, headers={"Authorization": "Bearer x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(srv.url + "/health").status_code == 200            # public
    r = httpx.post(srv.url + "/v1/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "temperature": "hot"}, headers=auth)
    assert r.status_code == 400 and "Field 'temperature'" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "a " * 600, "max_tokens": 1}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": "hi"}, headers=auth)
    assert r.status_code == 400
    r = httpx.post(srv.url + "/api/chat", json={"messages": MSG, "options": {"num_predict": "x"}}, headers=auth)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    assert httpx.get(srv.url + "/nope", headers=auth).status_code == 404
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert oai.completions.create(model="m", prompt="Hi", max_tokens=2).choices[0].text is not None


@pytest.mark.server
def test_fields_bankml_does_not_serve_are_refused_not_dropped(srv, oai, oll):
    """Lazy grammars of one's own, n > the slots, images, thinking: 501 naming the field (n:
    llama-server's 400), through the clients users have; a value that asks for nothing (n 1, no
    tools, a text format) is served. (Structured output and tools are served:
    tests/server/test_structured.py, test_tools.py.)"""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    for kw, field in (({"extra_body": {"grammar_lazy": True}}, "grammar_lazy"),
                      ({"extra_body": {"grammar_triggers": [{"type": 1, "value": "x"}]}}, "grammar_triggers")):
        with pytest.raises(openai.APIStatusError) as e:
            oai.chat.completions.create(model="m", messages=MSG, max_tokens=2, **kw)
        assert e.value.status_code == 501 and f"Field '{field}'" in e.value.message, kw
    with pytest.raises(openai.BadRequestError) as e:      # n up to the slots (--parallel), as llama-server
        oai.completions.create(model="m", prompt="Hi", max_tokens=2, n=3)
    assert "Field 'n': Value must be between 1 <= value <= 1, but got 3" in e.value.message
    r = oai.chat.completions.create(model="m", messages=MSG, max_tokens=2, n=1, tools=[], tool_choice="none",
                                    response_format={"type": "text"})
    assert r.choices[0].message.content is not None
    for kw, field in (({"think": True}, "think"),):
        with pytest.raises(ollama.ResponseError) as e:
            oll.chat(model="m", messages=MSG, options={"num_predict": 2}, **kw)
        assert e.value.status_code == 501 and f"Field '{field}'" in e.value.error, kw
    with pytest.raises(ollama.ResponseError) as e:
        oll.generate(model="m", prompt="Hi", images=[b"\x89PNG\r\n"], options={"num_predict": 2})
    assert e.value.status_code == 501 and "Field 'images'" in e.value.error
    assert oll.chat(model="m", messages=MSG, options={"num_predict": 2}, format="", think=False).message is not None
    with pytest.raises(openai.BadRequestError) as e:                   # a field no API defines: 400 naming it
        oai.chat.completions.create(model="m", messages=MSG, max_tokens=2, extra_body={"temprature": 0.2})
    assert e.value.message.endswith("Unrecognized request argument supplied: temprature")
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="m", messages=MSG, options={"num_predict": 2, "num_ctx": 10**6})
    assert e.value.status_code == 501 and "Field 'options.num_ctx'" in e.value.error


@pytest.mark.server
def test_the_clients_read_logprobs(srv, oai, oll):
    """logprobs / top_logprobs through the clients: what they parse is what the server sent (whose
    bits tests/server/test_oracle_sampling.py and test_ollama_logprobs.py hold to llama-server's)."""
    body = {"model": "m", "messages": MSG, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    r = oai.chat.completions.create(**body)
    raw = httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                     timeout=120).json()["choices"][0]["logprobs"]["content"]
    got = r.choices[0].logprobs.content
    assert [(c.token, c.logprob, [t.logprob for t in c.top_logprobs]) for c in got] == \
        [(c["token"], c["logprob"], [t["logprob"] for t in c["top_logprobs"]]) for c in raw]
    assert len(got) == r.usage.completion_tokens and all(len(c.top_logprobs) == 3 for c in got)
    o = oll.chat(model="m", messages=MSG, options={"num_predict": 4, "temperature": 0}, logprobs=True, top_logprobs=2)
    assert len(o.logprobs) == o.eval_count and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in o.logprobs)
