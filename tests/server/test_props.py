"""GET /props against llama-server b11434's: the default generation settings, the slots, the
model file and type, its chat template and the template's capabilities, the special tokens; POST
/props is llama-server's 501."""
from __future__ import annotations

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.runtime.chat import CHATML_TEMPLATE
from bankml.runtime.chat import template_caps
from bankml.testing import models
from bankml.testing.serve import BankmlServer

SAME = ("default_generation_settings", "total_slots", "model_ftype", "model_path", "modalities", "endpoint_slots",
        "endpoint_props", "endpoint_metrics", "chat_template", "chat_template_caps", "bos_token", "eos_token",
        "is_sleeping", "cors_proxy_enabled")


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("model", ["smollm2-q4_1", "gemma3-270m-q4_k_m"])
def test_props_answer_as_llama_server(model):
    with BankmlServer(model, "--metrics", threads=1) as ours, \
            LlamaServer(models.path(model), threads=1, extra=("--metrics",)) as theirs:
        got, want = httpx.get(ours.url + "/props").json(), httpx.get(theirs.url + "/props").json()
        assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
        assert set(got) == set(want) - {"media_marker"}          # bankml takes no media: no marker
        posted = [httpx.post(url + "/props", json={}) for url in (ours.url, theirs.url)]
        assert [(r.status_code, r.json()) for r in posted][0] == [(r.status_code, r.json()) for r in posted][1]


def test_template_caps_see_what_a_template_renders():
    assert template_caps(CHATML_TEMPLATE)["supports_system_role"] and not template_caps(CHATML_TEMPLATE)["supports_tools"]
    tools = ("{% for t in tools %}{{ t.function.name }}{% endfor %}{% for m in messages %}{{ m.role }}"
             "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}"
             "{% endif %}{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments }}{% endfor %}"
             "{% endfor %}")
    caps = template_caps(tools)
    assert caps["supports_tools"] and caps["supports_tool_calls"] and caps["supports_parallel_tool_calls"]
    assert caps["supports_typed_content"] and caps["supports_object_arguments"]
    assert not caps["supports_preserve_reasoning"] and not caps["supports_reasoning_effort"]


@pytest.mark.oracle
@pytest.mark.server
def test_slots_answer_as_llama_server():
    """After the same requests: each slot's fields, its task's settings, the tokens its cells
    hold and the counters a finished task leaves; not the task ids (llama-server counts its
    internal tasks too) nor a chat task's chat_format and generation_prompt (its template
    parser's name and the text it appended)."""
    model = "smollm2-q4_1"
    with BankmlServer(model, "--parallel", "2", threads=1) as ours, \
            LlamaServer(models.path(model), threads=1, extra=("-np", "2", "-c", "8192")) as theirs:
        def slots(url):
            out = httpx.get(url + "/slots").json()
            for s in out:
                s.pop("id_task", None)
                if "params" in s:
                    s["params"].pop("chat_format")
                    s["params"].pop("generation_prompt")
            return out
        assert slots(ours.url) == slots(theirs.url)
        for path, body in (("/completion", {"prompt": "Once upon a time", "n_predict": 5, "seed": 3,
                                            "temperature": 0.5, "top_k": 7}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                                    "stream": True, "seed": 1}),
                           ("/completion", {"prompt": "Once upon a time there", "n_predict": 2, "seed": 2})):
            for url in (ours.url, theirs.url):
                assert httpx.post(url + path, json=body, timeout=60).status_code == 200
            assert slots(ours.url) == slots(theirs.url), body
        assert [httpx.get(u + "/slots?fail_on_no_slot=1").status_code for u in (ours.url, theirs.url)] == [200, 200]
