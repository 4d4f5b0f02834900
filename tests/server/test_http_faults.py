"""`bankml serve` as a user's tools meet it: keys from the environment and a file (none on argv),
a whole-answer client that leaves stops its generation, SSE keep-alive comments, Ollama's load
request (what `ollama run` sends first), and no internal error text in an answer."""
from __future__ import annotations

import os
import socket
import time

import httpx
import ollama
import openai
import pytest

ENV_KEY, FILE_KEY = "env-key-1234", "file-key-5678"
H = {"Authorization": f"Bearer {ENV_KEY}"}


@pytest.fixture(scope="module")
def srv(bankml_server_factory, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"# comment\n{FILE_KEY}\n")
    os.environ["BANKML_API_KEY"] = ENV_KEY
    try:
        return bankml_server_factory("qwen3-small-q1_0", "--ctx", "4096", "--threads", "1",
                                     "--api-key-file", str(keys), "--sse-ping-interval", "0.002")
    finally:
        del os.environ["BANKML_API_KEY"]


def slot(srv) -> dict:
    return httpx.get(srv.url + "/slots", headers=H).json()[0]


@pytest.mark.server
def test_keys_from_the_environment_and_a_file_not_argv(srv):
    for key in (ENV_KEY, FILE_KEY):
        assert httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(srv.url + "/v1/models").status_code == 401
    cmdline = open(f"/proc/{srv.proc.pid}/cmdline", "rb").read()
    assert ENV_KEY.encode() not in cmdline and FILE_KEY.encode() not in cmdline


@pytest.mark.server
def test_a_whole_answer_client_that_leaves_stops_its_generation(srv):
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "temperature": 0,
            "cache_prompt": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, headers=H, timeout=httpx.Timeout(60, read=0.6))
    # the client is gone: within a few tokens the slot stops decoding and is free
    deadline = time.monotonic() + 5
    while slot(srv)["is_processing"] and time.monotonic() < deadline:
        time.sleep(0.02)
    s = slot(srv)
    assert not s["is_processing"], "the slot still generates for a client that left"
    assert s["n_prompt_tokens"] < 3000, s                  # stopped early: not run to max_tokens
    time.sleep(0.3)
    assert slot(srv)["n_prompt_tokens"] == s["n_prompt_tokens"]   # and no decode since
    r = httpx.post(srv.url + "/v1/completions", json={**body, "max_tokens": 4}, headers=H, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


@pytest.mark.server
def test_sse_keep_alive_comments_and_clients_read_through_them(srv):
    body = {"model": "m", "messages": [{"role": "user", "content": "Say hello. " * 150}], "max_tokens": 16,
            "temperature": 0, "stream": True, "cache_prompt": False}
    lines = []
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, headers=H, timeout=60) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    assert ":" in lines, "no keep-alive comment during a prefill longer than the ping interval"
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    body["stream"] = False
    whole = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=H, timeout=60).json()
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key=FILE_KEY, max_retries=0)
    text = "".join(c.choices[0].delta.content or "" for c in
                   oai.chat.completions.create(model="m", messages=body["messages"], max_tokens=16, temperature=0,
                                               stream=True, extra_body={"cache_prompt": False}) if c.choices)
    assert text == whole["choices"][0]["message"]["content"]


@pytest.mark.server
def test_a_request_sets_its_own_sse_ping_interval(srv):
    """sse_ping_interval -1 (llama-server's per-request field): no keep-alive comment, where the
    server's own 2 ms interval sends some during the same long prefill."""
    body = {"messages": [{"role": "user", "content": "Say hello. " * 150}], "max_tokens": 2, "temperature": 0,
            "stream": True, "cache_prompt": False}
    for interval, pings in ((None, True), (-1, False)):
        with httpx.stream("POST", srv.url + "/v1/chat/completions", headers=H, timeout=60,
                          json={**body, "sse_ping_interval": interval}) as r:
            assert r.status_code == 200
            assert (":" in list(r.iter_lines())) == pings, interval


@pytest.mark.server
def test_ollama_run_load_request(srv):
    # `ollama run MODEL` first asks /api/show, then generates with no prompt to load the model
    c = ollama.Client(host=srv.url, headers=H)
    assert c.show("smollm2").modelfile
    r = c.generate(model="smollm2")
    assert r.done and r.done_reason == "load" and r.response == "" and r.model == "smollm2"
    raw = httpx.post(srv.url + "/api/generate", json={"model": "smollm2"}, headers=H).json()
    assert set(raw) == {"model", "created_at", "response", "done", "done_reason"}
    r = c.chat(model="smollm2", messages=[])
    assert r.done_reason == "load" and r.message.role == "assistant" and r.message.content == ""
    assert c.generate(model="smollm2", keep_alive=0).done_reason == "unload"      # `ollama stop`
    # and then a real turn, as `ollama run` goes on
    r = c.chat(model="smollm2", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4})
    assert r.done and r.eval_count == 4


@pytest.mark.server
def test_cut_connection_mid_body_leaves_the_server_serving(srv):
    host, port = srv.url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"prompt\": \"")
    assert httpx.get(srv.url + "/health").status_code == 200
    assert not slot(srv)["is_processing"]


def test_internal_errors_name_no_internals(monkeypatch):
    from starlette.testclient import TestClient

    import bankml
    from bankml.server import app as server_app
    from bankml.server.guard import HttpOptions
    from bankml.testing import models

    def broken(*a, **k):
        raise RuntimeError("/very/secret/path: internal detail")
    monkeypatch.setattr(server_app, "run_job", broken)
    with bankml.load(models.path("qwen3-small-q1_0"), threads=1, n_ctx=256) as m:
        with TestClient(server_app.make_app(m, http=HttpOptions(host="0.0.0.0"))) as c:
            for path, body in (("/v1/completions", {"prompt": "a", "max_tokens": 2}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
                               ("/completion", {"prompt": "a"}), ("/api/generate", {"prompt": "a", "stream": False})):
                r = c.post(path, json=body)
                assert r.status_code == 500 and "secret" not in r.text and "log" in r.text, (path, r.text)
                r = c.post(path, json={**body, "stream": True})
                assert "secret" not in r.text and "generation failed" in r.text, (path, r.text)
