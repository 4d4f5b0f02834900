"""Chat templates: `tokenizer.chat_template` rendered as llama-server --jinja renders it.

    prompt = render_chat(model, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = model.tokenize(prompt, add_special=True, parse_special=True)

A template is untrusted input: it runs in jinja2's ImmutableSandboxedEnvironment. The context
is llama.cpp's (common/chat.cpp, common_chat_template_direct_apply_impl): messages, bos_token and
eos_token (the pieces of the BOS/EOS ids), enable_thinking, add_generation_prompt, datetime and
date_string (today, common_chat_extra_context), a request's chat_template_kwargs over them, and
raise_exception / strftime_now; the lexer options are common/jinja/lexer.cpp's (trim_blocks and
lstrip_blocks on, one trailing newline of the template dropped). As llama.cpp does, a leading
BOS text is cut when the vocabulary adds BOS itself (and a trailing EOS when it adds EOS).
"""
from __future__ import annotations

import datetime
import json
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from bankml.errors import BankmlError
from bankml.tokenizer import tokenizer_for


class ChatTemplateError(BankmlError):
    """The chat template failed to render (raise_exception, a syntax error, a sandbox refusal)."""


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source.replace("\r\n", "\n").replace("\r", "\n"))


def check_template(source: str) -> str:
    """source, once it compiles (else ChatTemplateError naming the syntax error)."""
    try:
        _compile(source)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    return source


def render_template(source: str, messages: list[dict], bos_token: str = "", eos_token: str = "",
                    add_generation_prompt: bool = True, add_bos: bool = False, add_eos: bool = False,
                    **extra) -> str:
    """Render one template source with llama.cpp's variables."""
    now = datetime.datetime.now()           # common_chat_extra_context: today, two ways
    ctx = {"messages": [dict(m) for m in messages], "bos_token": bos_token, "eos_token": eos_token,
           "enable_thinking": True, "datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y"),
           **extra}
    if add_generation_prompt:
        ctx["add_generation_prompt"] = True
    try:
        out = _compile(source).render(**ctx)
    except ChatTemplateError:
        raise
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    if add_bos and bos_token and out.startswith(bos_token):
        out = out[len(bos_token):]
    if add_eos and eos_token and out.endswith(eos_token):
        out = out[:-len(eos_token)]
    return out


def has_chat_template(model) -> bool:
    """Whether the model's header has a `tokenizer.chat_template` (llama-cli then chats by default),
    or the model was given one (--chat-template-file)."""
    if getattr(model, "chat_template", None):
        return True
    src = model.gguf.metadata.get("tokenizer.chat_template")
    return isinstance(src, str) and bool(src)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading token ids a and b share: what a session holding a can keep for b."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# common/chat.cpp CHATML_TEMPLATE_SRC: what llama-server --jinja renders for a header without a template
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}")


def chat_template(model) -> str:
    """The model's `tokenizer.chat_template`; ChatML when the header has none (or says "chatml"),
    as llama-server's common_chat_templates_init does; a template file's given to the model
    (model.chat_template, --chat-template-file) over both."""
    if getattr(model, "chat_template", None):
        return model.chat_template
    gguf = model.gguf if hasattr(model, "gguf") else None
    if gguf is None:
        from bankml.gguf import read_gguf
        gguf = read_gguf(model)
    src = gguf.metadata.get("tokenizer.chat_template")
    if not isinstance(src, str) or not src or src == "chatml":
        return CHATML_TEMPLATE
    return src


def render_chat(model, messages: list[dict], add_generation_prompt: bool = True,
                prefill_assistant: bool = True, template: str | None = None, continue_final: str | None = None,
                **extra) -> str:
    """The prompt text llama-server's /apply-template gives for `messages` on this model
    (with `template`: as llama-server --chat-template-file gives it).

    `continue_final` ("auto", "content" or "reasoning_content": a request's continue_final_message)
    continues the last message, whatever its role; with `prefill_assistant` (llama-server's
    default) a final assistant message is continued ("auto") unasked. A continuation is the
    earlier messages without the generation prompt, then, unless the last message is empty, the
    generation prompt and (in "content" mode) that message's content (common_chat_templates_apply
    and the autoparser's generate_parser). A "developer" message is a "system" one.
    """
    source = template or chat_template(model)
    if "<|channel|>" not in source:         # map_developer_role_to_system: all but GPT-OSS templates
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    if continue_final is None and prefill_assistant and messages and messages[-1].get("role") == "assistant":
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise ChatTemplateError("cannot continue after 2 or more assistant messages at the end")
        continue_final = "auto"
    if continue_final is not None and messages:
        last, head = messages[-1], messages[:-1]
        before = _render(model, source, head, False, extra)
        content, reasoning = str(last.get("content") or ""), str(last.get("reasoning_content") or "")
        content = last.get("_continued", content)           # content parts continue joined by blank lines
        if not content and not reasoning and not last.get("tool_calls"):
            return before                   # an empty message: nothing to continue
        if continue_final == "auto":
            continue_final = "reasoning_content" if reasoning and not content else "content"
        with_prompt = _render(model, source, head, True, extra)
        generation_prompt = with_prompt[common_prefix(before, with_prompt):]
        return before + generation_prompt + (content if continue_final == "content" else "")
    return _render(model, source, messages, add_generation_prompt, extra)


def generation_prompt(model, messages: list[dict], **extra) -> str:
    """What the template adds for the assistant's turn (common_chat_template_generation_prompt):
    the conversation rendered with add_generation_prompt, past where it parts from the one without."""
    without = render_chat(model, messages, add_generation_prompt=False, prefill_assistant=False, **extra)
    with_prompt = render_chat(model, messages, add_generation_prompt=True, prefill_assistant=False, **extra)
    return with_prompt[common_prefix(without, with_prompt):]


def _render(model, source: str, messages: list[dict], add_generation_prompt: bool, extra: dict) -> str:
    tok = tokenizer_for(model)
    messages = [{k: v for k, v in m.items() if not k.startswith("_")} for m in messages]

    def text(tid):
        return tok.piece(tid).decode("utf-8", "replace") if tid is not None else ""
    return render_template(source, messages, text(tok.bos), text(tok.eos), add_generation_prompt,
                           tok.add_bos, tok.add_eos, **extra)


def _renders(source: str, messages: list[dict], marker: str, **extra) -> bool:
    try:
        return marker in render_template(source, messages, **extra)
    except Exception:               # a probe the template cannot render: not supported (caps_try_execute)
        return False


def template_caps(source: str) -> dict:
    """jinja::caps_get's answers, by probe rendering (a dozen renders: kept with the compiled
    template, as llama-server computes them once when it loads the template)."""
    return dict(_caps(source))


@lru_cache(maxsize=16)
def _caps(source: str) -> tuple:
    user = {"role": "user", "content": "User message"}
    call = lambda name, args: {"type": "function", "id": name, "function": {"name": name, "arguments": args}}  # noqa: E731
    tool = {"type": "function", "function": {"name": "tool_marker", "description": "",
                                             "parameters": {"type": "object", "properties": {}}}}
    one_call = [user, {"role": "assistant", "content": "", "tool_calls": [call("call_marker", '{"a": 1}')]}]
    two_calls = [user, {"role": "assistant", "content": "",
                        "tool_calls": [call("first_marker", "{}"), call("second_marker", "{}")]}]
    object_args = [user, {"role": "assistant", "content": "", "tool_calls": [call("f", {"arg_marker": 1})]}]
    reasoning = [user, {"role": "assistant", "content": "A", "reasoning_content": "reasoning_marker"}, user]
    tool_calls = _renders(source, one_call, "call_marker")
    return tuple({
        "supports_object_arguments": tool_calls and _renders(source, object_args, "arg_marker"),
        "supports_parallel_tool_calls": tool_calls and _renders(source, two_calls, "second_marker"),
        "supports_preserve_reasoning": _renders(source, reasoning, "reasoning_marker"),
        "supports_reasoning_effort": "reasoning_effort" in source or "reasoning_strength" in source,
        "supports_string_content": _renders(source, [{"role": "user", "content": "STRING_MARKER"}], "STRING_MARKER"),
        "supports_system_role": _renders(source, [{"role": "system", "content": "System message"}, user],
                                         "System message"),
        "supports_tool_calls": tool_calls,
        "supports_tools": _renders(source, [user], "tool_marker", tools=[tool]),
        "supports_typed_content": _renders(source, [{"role": "user", "content": [{"type": "text", "text": "TYPED"}]}],
                                           "TYPED"),
    }.items())
