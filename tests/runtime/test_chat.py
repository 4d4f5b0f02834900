"""Chat templates rendered in jinja2's sandbox against llama-server's /apply-template (--jinja)."""
from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from bankml.runtime.chat import ChatTemplateError, render_chat, render_template
from bankml.tokenizer import tokenizer_for
from bankml.testing import models

S = {"role": "system", "content": "You are terse."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [S, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [S, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "Multi\nline\n\n  message\twith tabs"}],
    [{"role": "user", "content": "Unicode: 日本語 😀 café مرحبا"}],
    [{"role": "user", "content": "Special text <|im_start|> and <|im_end|> inside"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "{{ not a template }} {% raw %}"}],
    [S, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}],
]


@pytest.mark.oracle
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_chat_prompt_equals_llama_server(servers, i, add_generation_prompt):
    name = "smollm2-q4_1"
    want = servers(name).apply_template(CONVERSATIONS[i], add_generation_prompt)
    assert render_chat(models.path(name), CONVERSATIONS[i], add_generation_prompt) == want


def test_rendered_prompt_tokenizes_with_special_tokens():
    p = models.path("smollm2-q4_1")
    ids = tokenizer_for(p).encode(render_chat(p, CONVERSATIONS[0]), parse_special=True)
    assert ids[0] == 1 and ids.count(2) == 2     # <|im_start|> first, two <|im_end|>


def test_raise_exception_raises_chat_template_error():
    src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    with pytest.raises(ChatTemplateError, match="user first"):
        render_template(src, [S])
    assert render_template(src, [{"role": "user", "content": "x"}]) == "ok"


def test_sandbox_refuses_attribute_escape():
    with pytest.raises(ChatTemplateError):
        render_template("{{ ''.__class__.__mro__[1].__subclasses__() }}", [])


def test_bos_eos_variables_and_trim_blocks():
    src = "{{ bos_token }}{% for m in messages %}\n  {{ m['content'] }}{{ eos_token }}\n{% endfor %}\n"
    out = render_template(src, [{"role": "user", "content": "x"}], bos_token="<s>", eos_token="</s>")
    assert out == "<s>  x</s>\n"              # lstrip_blocks leaves spaces before {{ }}


# Gemma-3-270M: its GGUF has no tokenizer.chat_template, so llama-server renders ChatML
# (common_chat_templates_init); Gemma's own template (tests/data) goes through --chat-template-file.
GEMMA = "gemma3-270m-q4_k_m"
GEMMA_TEMPLATE = Path(__file__).parents[1] / "data" / "gemma3_chat_template.jinja"


@pytest.fixture(scope="module")
def gemma_template_server():
    from bankml.oracle.server import LlamaServer
    with LlamaServer(models.path(GEMMA), threads=2, n_ctx=512,
                     extra=("--chat-template-file", str(GEMMA_TEMPLATE))) as srv:
        yield srv


@pytest.mark.oracle
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
def test_gemma_file_without_template_renders_chatml_as_llama_server(servers, add_generation_prompt):
    srv, p = servers(GEMMA), models.path(GEMMA)
    for conv in CONVERSATIONS:
        want = srv.apply_template(conv, add_generation_prompt)
        assert render_chat(p, conv, add_generation_prompt) == want, conv
    assert want.startswith("<|im_start|>system\n")


@pytest.mark.oracle
@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
def test_gemma3_template_equals_llama_server_chat_template_file(gemma_template_server, add_generation_prompt):
    """System folded into the first user turn, assistant as `model`, BOS cut (the vocabulary adds
    it), | trim; the rendered prompt's tokens equal llama-server's too."""
    srv, p, src = gemma_template_server, models.path(GEMMA), GEMMA_TEMPLATE.read_text()
    tok = tokenizer_for(p)
    for conv in CONVERSATIONS:
        want = srv.apply_template(conv, add_generation_prompt)
        got = render_chat(p, conv, add_generation_prompt, template=src)
        assert got == want, conv
        assert tok.encode(got, True, True) == srv.tokenize(want, True, True)
    assert "<start_of_turn>model\nA1<end_of_turn>\n<start_of_turn>user\nQ2" in want


@pytest.mark.oracle
def test_gemma3_template_refuses_roles_that_do_not_alternate(gemma_template_server):
    from bankml.errors import OracleError
    conv = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(OracleError, match="alternate"):
        gemma_template_server.apply_template(conv)
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        render_chat(models.path(GEMMA), conv, template=GEMMA_TEMPLATE.read_text())


def test_server_chats_in_chatml_when_the_header_has_no_template():
    """/v1/chat/completions on a model without tokenizer.chat_template: ChatML, as llama-server."""
    import dataclasses

    from bankml.gguf import read_gguf
    from bankml.runtime.chat import CHATML_TEMPLATE
    from bankml.server.api.openai import chat_prompt

    class Headerless:                               # SmolLM2's header less its template
        def __init__(self):
            self.path = models.path("smollm2-q4_1")
            g = read_gguf(self.path)
            self.gguf = dataclasses.replace(g, metadata={k: v for k, v in g.metadata.items()
                                                         if k != "tokenizer.chat_template"})

        def tokenize(self, text, add_special=True, parse_special=False):
            return tokenizer_for(self).encode(text, add_special, parse_special)
    m, msgs = Headerless(), CONVERSATIONS[0]        # no system message: SmolLM2 adds its own
    assert chat_prompt(m, msgs) == m.tokenize(render_template(CHATML_TEMPLATE, msgs), True, True)
    assert chat_prompt(m, msgs) != m.tokenize(render_chat(m.path, msgs), True, True)      # not SmolLM2's own


VARIABLES_TEMPLATE = Path(__file__).parents[1] / "data" / "variables_chat_template.jinja"


@pytest.mark.oracle
def test_template_variables_equal_llama_servers():
    """datetime and date_string (today), chat_template_kwargs and reasoning_effort
    reach the template as llama-server --chat-template-file hands them over; a string
    enable_thinking is its 400."""
    import httpx

    from bankml.oracle.server import LlamaServer
    from bankml.server.api import openai
    from bankml.server.fields import BadRequest
    p, src = models.path("smollm2-q4_1"), VARIABLES_TEMPLATE.read_text()
    conv = [{"role": "user", "content": "Hi"}]
    with LlamaServer(p, threads=1, n_ctx=512, extra=("--chat-template-file", str(VARIABLES_TEMPLATE))) as srv:
        for extra in ({}, {"chat_template_kwargs": {"custom": {"a": [1, 2]}, "enable_thinking": False}},
                      {"reasoning_effort": "high"}, {"reasoning_effort": "none", "chat_template_kwargs": {"custom": 3}},
                      {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "low"}}):
            want = srv.apply_template_body({"messages": conv, **extra})
            assert render_chat(p, conv, template=src, **openai.template_variables(extra)) == want, extra
        assert "[date " + datetime.datetime.now().strftime("%d %b %Y") in want
        r = httpx.post(srv.url + "/apply-template", json={"messages": conv,
                                                           "chat_template_kwargs": {"enable_thinking": "yes"}})
        with pytest.raises(BadRequest) as e:
            openai.template_variables({"chat_template_kwargs": {"enable_thinking": "yes"}})
        assert r.status_code == 400 and r.json()["error"]["message"] == str(e.value)
