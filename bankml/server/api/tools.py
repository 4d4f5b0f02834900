"""Tool calls as llama-server b11434 --jinja makes them, for templates whose calls are JSON objects
between two markers (the differential autoparser's JSON_NATIVE format with per-call markers: the
Hermes 2 Pro / Qwen 2.5 family, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`).

    req = parse(body, parallel_default)       # tools, tool_choice, parallel_tool_calls; None without tools
    fmt = call_format(render)                 # the template's call markers, or None
    text = grammar(fmt, req, generation_prompt, json_rules)   # the grammar (lazy under "auto")
    content, calls = parse_reply(text, fmt, req)

What llama.cpp does (common/chat.cpp, chat-auto-parser-generator.cpp, chat-peg-parser.cpp):
- the template renders `tools` (common_chat_tools_to_json_oaicompat: type, function {name,
  description, parameters}); an assistant's tool_calls and a tool's tool_call_id reach it as
  common_chat_msg::to_json_oaicompat gives them, arguments as objects where the template reads them so;
- "required": a grammar from the generation prompt (prefilled): space, content up to the call
  marker, then one or more calls; "auto": a lazy grammar, free text until the call marker appears,
  then calls only; "none": no grammar, the template still renders the tools;
- the reply: content up to the first call marker (leading space skipped), then each call's name
  and its arguments as the model wrote them; finish_reason "tool_calls" when there are calls.
A template whose tool calls are not of this shape gets 501 for tools, naming it; a template that
renders no tool calls at all gets the tools rendered and plain text, as llama-server answers it.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from bankml.runtime.grammar.json_schema import SchemaError, add_schema, format_literal
from bankml.server.fields import BadRequest

CHOICES = ("auto", "none", "required")
_ID_CHARS = string.digits + string.ascii_uppercase + string.ascii_lowercase
_SPACE = " \t\n\v\f\r"                  # std::isspace: what the parser's space() skips


@dataclass(frozen=True)
class ToolRequest:
    tools: list                 # [{"type": "function", "function": {"name", "description", "parameters"}}]
    choice: str                 # "auto", "none" or "required"
    parallel: bool              # parallel_tool_calls


@dataclass(frozen=True)
class CallFormat:
    start: str                  # what opens each call ("<tool_call>\n")
    end: str                    # what closes it ("</tool_call>")


def _dump(v) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def parse(body: dict, parallel_default: bool) -> ToolRequest | None:
    """common_chat_tools_parse_oaicompat and the tool_choice / parallel_tool_calls of
    oaicompat_chat_params_parse; None when there are no tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):            # llama-server takes it for "auto"; OpenAI forces that function
        raise BadRequest("Field 'tool_choice': one named function is not served by bankml yet; "
                         "use \"required\" with that one tool", 501, "not_supported_error")
    if not isinstance(choice, str):         # json_value: not a string, the default
        choice = "auto"
    if choice not in CHOICES:
        raise BadRequest(f"Invalid tool_choice: {choice}")
    if tools is None or tools == []:
        return None
    out = []
    try:
        if not isinstance(tools, list):
            raise ValueError(f"Expected 'tools' to be an array, got {_dump(tools)}")
        for tool in tools:
            if not isinstance(tool, dict) or "type" not in tool:
                raise ValueError(f"Missing tool type: {_dump(tool)}")
            if tool["type"] != "function":
                raise ValueError(f"Unsupported tool type: {_dump(tool)}")
            fn = tool.get("function")
            if not isinstance(fn, dict):
                raise ValueError(f"Missing tool function: {_dump(tool)}")
            name, params = fn.get("name"), fn.get("parameters", {})
            if not isinstance(name, str) or not name:
                raise ValueError(f"Missing tool name: {_dump(tool)}")
            description = fn.get("description", "")
            if not isinstance(description, str):
                raise ValueError(f"Tool description must be a string: {_dump(tool)}")
            out.append({"type": "function", "function": {"name": name, "description": description,
                                                          "parameters": params}})
    except ValueError as e:
        raise BadRequest(f"Failed to parse tools: {e}; tools = {json.dumps(tools, indent=2, ensure_ascii=False)}",
                         500, "server_error") from None
    parallel = body.get("parallel_tool_calls", parallel_default)
    return ToolRequest(out, choice, parallel if isinstance(parallel, bool) else parallel_default)


def message_calls(msg: dict) -> list[dict]:
    """An assistant message's tool_calls as llama.cpp hands them to the template (type, function
    {name, arguments as a string}, id when given), or its 400."""
    calls = msg.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise _bad_message("'tool_calls' must be an array")
    out = []
    for tc in calls:
        if not isinstance(tc, dict) or "type" not in tc:
            raise _bad_message(f"Missing tool call type: {_dump(tc)}")
        if tc["type"] != "function":
            raise _bad_message(f"Unsupported tool call type: {_dump(tc)}")
        fn = tc.get("function")
        if not isinstance(fn, dict):
            raise _bad_message(f"Missing tool call function: {_dump(tc)}")
        if not isinstance(fn.get("name"), str):
            raise _bad_message(f"Missing tool call name: {_dump(tc)}")
        if "arguments" not in fn:
            raise _bad_message("[json.exception.out_of_range.403] key 'arguments' not found")
        args = fn["arguments"]
        call = {"type": "function", "function": {"name": fn["name"],
                                                 "arguments": args if isinstance(args, str) else _dump(args)}}
        if isinstance(tc.get("id"), str) and tc["id"]:
            call["id"] = tc["id"]
        out.append(call)
    return out


def _bad_message(why: str) -> BadRequest:
    return BadRequest(f"Failed to parse messages: {why}", 500, "server_error")


def object_arguments(messages: list[dict]) -> list[dict]:
    """func_args_not_string: each call's arguments parsed into an object, for a template that reads
    them as one."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                try:
                    args = json.loads(tc["function"]["arguments"])
                except ValueError as e:
                    raise BadRequest(f"Failed to parse tool call arguments as JSON: {e}") from None
                calls.append({**tc, "function": {**tc["function"], "arguments": args}})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def call_format(render) -> CallFormat | None:
    """The call markers of a template, found as the autoparser finds them, by rendering: a
    conversation whose assistant turn is one call against the same turn empty.
    render(messages, add_generation_prompt) -> text. None: the template renders no tool call
    (llama-server then answers plain text); BadRequest 501: it renders one bankml cannot parse."""
    user = {"role": "user", "content": "User message"}
    call = {"type": "function", "id": "call00001",
            "function": {"name": "foofoo", "arguments": {"first": "XXXX"}}}
    try:
        head = render([user], True)
        with_call = render([user, {"role": "assistant", "content": "", "tool_calls": [call]}], False)
        without = render([user, {"role": "assistant", "content": ""}], False)
    except Exception:               # a probe the template cannot render: it takes no tool calls
        return None
    if "foofoo" not in with_call:
        return None
    if not (with_call.startswith(head) and without.startswith(head)):
        raise _unsupported("the assistant's turn does not start with the generation prompt")
    tail = without[len(head):]
    if not with_call.endswith(tail):
        raise _unsupported("the assistant's turn does not end the same with and without a call")
    middle = with_call[len(head):len(with_call) - len(tail)]
    i = middle.find("{")
    try:
        obj, j = json.JSONDecoder().raw_decode(middle, i) if i >= 0 else (None, 0)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or list(obj) != ["name", "arguments"] or obj["name"] != "foofoo":
        raise _unsupported("its calls are not {\"name\": ..., \"arguments\": ...} objects between markers")
    start, end = middle[:i].lstrip(_SPACE), middle[j:].strip(_SPACE)
    if not start or not end:
        raise _unsupported("its calls have no markers around them")
    return CallFormat(start, end)


def _unsupported(why: str) -> BadRequest:
    return BadRequest(f"tools: bankml does not parse this chat template's tool calls ({why}); "
                      "llama-server's other tool formats are not served yet", 501, "not_supported_error")


def _rule_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9-]+", "-", name)


def until_rules(rules: dict, prefix: str, delimiter: str) -> str:
    """gbnf_excluding_grammar for one delimiter: text that does not contain it (the automaton's
    states, every one accepting). Returns the start rule's name."""
    cps = [ord(c) for c in delimiter]
    alphabet = sorted(set(cps))

    def state(s: int) -> str:
        return prefix if s == 0 else f"{prefix}-{s:02d}"

    def nxt(q: int, c: int) -> int:        # the longest prefix of the delimiter the text now ends in
        text = cps[:q] + [c]
        for k in range(min(len(text), len(cps)), 0, -1):
            if text[-k:] == cps[:k]:
                return k
        return 0

    for q in range(len(cps)):
        buckets: dict[int, list[int]] = {}
        specific = []
        for c in alphabet:
            d = nxt(q, c)
            if d == len(cps) or d != 0:
                specific.append(c)
                if d != len(cps):
                    buckets.setdefault(d, []).append(c)
        rhs = "|"
        for d in sorted(buckets):
            rhs += f" {_char_class(buckets[d], False)} {state(d)} |"
        rhs += f" {_char_class(specific, True)} {state(0)}"
        rules[state(q)] = rhs
    return state(0)


def _char_class(cps: list[int], negate: bool) -> str:
    out = "[^" if negate else "["
    for c in cps:
        ch = chr(c)
        out += {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "]": "\\]", "[": "\\[", "^": "\\^",
                "-": "\\-"}.get(ch, ch if 0x20 <= c <= 0x7E else (f"\\x{c:02X}" if c <= 0xFF else
                                                                   f"\\u{c:04X}" if c <= 0xFFFF else f"\\U{c:08X}"))
    return out + "]"


def grammar(fmt: CallFormat, req: ToolRequest, generation_prompt: str, json_rules: str) -> str:
    """The autoparser's grammar for the calls (standard_json_tools, build_grammar): under "required"
    the whole answer from the generation prompt on, under "auto" (lazy) the calls alone."""
    rules: dict[str, str] = {}
    names = []
    for tool in req.tools:
        fn = tool["function"]
        try:
            schema = add_schema(rules, f"tool-{fn['name']}-schema", fn["parameters"])
        except SchemaError as e:
            raise BadRequest("Unable to generate parser for this template. Automatic parser generation failed: "
                             f"{e}") from None
        name = f"tool-{_rule_name(fn['name'])}"
        rules[name] = (f'"{{" space {format_literal(json.dumps("name"))} space ":" space '
                       f'("\\"" {format_literal(fn["name"])} "\\"") space "," space '
                       f'{format_literal(json.dumps("arguments"))} space ":" space {schema} space "}}"')
        names.append(name)
    choice = "(" + " | ".join(names) + ")"
    calls = f"{choice} (space \",\" space {choice})*" if req.parallel else choice
    rules["tool-call"] = f"{format_literal(fmt.start)} space {calls} space {format_literal(fmt.end)}"
    if req.choice == "required":
        until = until_rules(rules, "until-0", fmt.start)
        rules["tool-calls"] = "(tool-call space)+"
        rules["root"] = f"{format_literal(generation_prompt)} space {until}? tool-calls"
    else:
        rules["tool-calls"] = "(tool-call? space)+"
        rules["root"] = "tool-call | tool-calls"
    lines = [f"{k} ::= {v}" for k, v in rules.items()] + json_rules.splitlines()
    return "\n".join(sorted(lines)) + "\n"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _call(text: str, i: int, names: set) -> tuple[dict, int] | None:
    """One {"name": ..., "arguments": ...} object at i: the call (arguments as written) and where it ends."""
    m = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*').match(text, i)
    if m is None or m.group(1) not in names:
        return None
    try:
        _, j = json.JSONDecoder().raw_decode(text, m.end())
    except ValueError:
        return None
    k = _skip(text, j)
    if not text.startswith("}", k):
        return None
    return {"name": m.group(1), "arguments": text[m.end():j]}, k + 1


def parse_reply(text: str, fmt: CallFormat, req: ToolRequest) -> tuple[str, list[dict]]:
    """The generated text as the autoparser's PEG parser reads it: leading space skipped, the
    content up to the first call marker (without a marker's start the text ends in), then each
    call. A text the parser does not take whole (a call cut short, text after the calls) is all
    content."""
    i = _skip(text, 0)
    k = text.find(fmt.start, i)
    if k < 0:                       # the text may end in the start of a marker: not content (yet)
        cut = next((n for n in range(len(fmt.start) - 1, 0, -1) if text.endswith(fmt.start[:n])), 0)
        return text[i:len(text) - cut] if len(text) - cut >= i else "", []
    content, pos, calls = text[i:k], k, []
    names = {t["function"]["name"] for t in req.tools}
    while text.startswith(fmt.start, pos):
        got = _call(text, _skip(text, pos + len(fmt.start)), names)
        while got is not None:
            call, pos = got
            calls.append(call)
            got = None
            if req.parallel:
                j = _skip(text, pos)
                if text.startswith(",", j):
                    got = _call(text, _skip(text, j + 1), names)
                    if got is None:
                        return text[i:], []
        pos = _skip(text, pos)
        if not calls or not text.startswith(fmt.end, pos):
            return text[i:], []
        pos = _skip(text, pos + len(fmt.end))
    if pos != len(text):
        return text[i:], []
    return content, calls


def response_calls(calls: list[dict]) -> list[dict]:
    """The calls as a chat message carries them: each with a fresh id (gen_tool_call_id: 32 characters)."""
    return [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]},
             "id": "".join(secrets.choice(_ID_CHARS) for _ in range(32))} for c in calls]


def reply(text: str, fmt: CallFormat, req: ToolRequest) -> tuple[str, list[dict] | None]:
    """A generated answer as llama-server returns it under tools: its content, and its calls (with ids) or None."""
    content, calls = parse_reply(text, fmt, req)
    return content, response_calls(calls) if calls else None
