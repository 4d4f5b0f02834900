"""Chat templates rendered in jinja2's sandbox against llama-server's /apply-template (--jinja)."""
from __future__ import annotations

import pytest

from bankml.runtime.chat import ChatTemplateError, render_chat, render_template
from bankml.runtime.tokenizer import tokenizer_for
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
