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
  and its arguments as the model wrote them; finish_reason "tool_calls" when there are calls;
  streamed (ToolStream), the text parsed again every token and the message's growth sent.
A template whose tool calls are not of this shape gets 501 for tools, naming it; a template that
renders no tool calls at all gets the tools rendered and plain text, as llama-server answers it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from bankml.runtime.grammar.json_schema import SchemaError, add_schema, format_literal
from bankml.server.fields import BadRequest, _json_type
from bankml.server.ids import random_string   # gen_tool_call_id

CHOICES = ("auto", "none", "required")
SPACE = " \t\n\v\f\r"                   # std::isspace: what the parser's space() skips


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
            fn = _function(tool, "tool")
            if "name" not in fn:
                raise ValueError("[json.exception.out_of_range.403] key 'name' not found")
            name, description, params = fn["name"], fn.get("description", ""), fn.get("parameters", {})
            for v in (name, description):
                if not isinstance(v, str):
                    raise ValueError(f"[json.exception.type_error.302] type must be string, but is {_json_type(v)}")
            out.append({"type": "function", "function": {"name": name, "description": description,
                                                          "parameters": params}})
    except ValueError as e:
        raise BadRequest(f"Failed to parse tools: {e}; tools = {json.dumps(tools, indent=2, ensure_ascii=False)}",
                         500, "server_error") from None
    parallel = body.get("parallel_tool_calls", parallel_default)
    return ToolRequest(out, choice, parallel if isinstance(parallel, bool) else parallel_default)


def _function(item, kind: str) -> dict:
    """The "function" object of a tool or a tool call ({"type": "function", "function": {...}}),
    else ValueError as llama.cpp words it for that kind."""
    if not isinstance(item, dict) or "type" not in item:
        raise ValueError(f"Missing {kind} type: {_dump(item)}")
    if item["type"] != "function":
        raise ValueError(f"Unsupported {kind} type: {_dump(item)}")
    fn = item.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"Missing {kind} function: {_dump(item)}")
    return fn


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
        try:
            fn = _function(tc, "tool call")
        except ValueError as e:
            raise _bad_message(str(e)) from None
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
    start, end = middle[:i].lstrip(SPACE), middle[j:].strip(SPACE)
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
    while i < len(text) and text[i] in SPACE:
        i += 1
    return i


class _End(Exception):
    """The text stops inside what the parser was reading (lenient: what was read so far stands)."""


class _Reader:
    """The autoparser's PEG parser over a generated text, lenient at its end (COMMON_PEG_PARSE_FLAG_LENIENT):
    a literal the text stops inside of ends the parse, keeping what the mapper has taken so far."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def space(self) -> None:
        self.pos = _skip(self.text, self.pos)

    def literal(self, lit: str) -> bool:
        """Whether lit is next (then past it); the text ending inside it raises _End."""
        rest = self.text[self.pos:self.pos + len(lit)]
        if rest == lit:
            self.pos += len(lit)
            return True
        if lit.startswith(rest):
            raise _End
        return False


def parse_reply(text: str, fmt: CallFormat, req: ToolRequest) -> tuple[str, list[dict]]:
    """The generated text as the autoparser's PEG parser and the chat mapper read it (lenient, as
    llama-server parses every streamed prefix and the final text): leading space skipped, the
    content up to the first call marker (a marker's start the text ends in held back), then each
    call: its name once its quoted name is whole (arguments "{" until they start), its arguments
    as written so far (trailing space cut). Returns (content, [{"name", "arguments"}])."""
    r, calls = _Reader(text), []
    r.space()
    k = text.find(fmt.start, r.pos)
    if k < 0:
        cut = next((n for n in range(len(fmt.start) - 1, 0, -1) if text.endswith(fmt.start[:n])), 0)
        return text[r.pos:max(r.pos, len(text) - cut)], []
    content, r.pos = text[r.pos:k], k
    names = [t["function"]["name"] for t in req.tools]
    try:
        while r.literal(fmt.start):
            r.space()
            while True:
                _one_call(r, names, calls)
                r.space()
                if not (req.parallel and r.literal(",")):
                    break
                r.space()
            if not r.literal(fmt.end):
                break
            r.space()
    except _End:
        pass
    return content, calls


def _one_call(r: _Reader, names: list[str], calls: list[dict]) -> None:
    """{"name": "NAME", "arguments": {...}}: the call is the mapper's once its name is whole."""
    if not r.literal("{"):
        raise _End
    for lit in ('"name"', ":"):
        r.space()
        if not r.literal(lit):
            raise _End
    r.space()
    name = next((n for n in names if r.literal(f'"{n}"')), None)   # atomic: the whole quoted name
    if name is None:
        raise _End
    call = {"name": name, "arguments": "{"}
    calls.append(call)
    for lit in (",", '"arguments"', ":"):
        r.space()
        if not r.literal(lit):
            raise _End
    r.space()
    start = r.pos
    try:
        _, end = json.JSONDecoder().raw_decode(r.text, start)
    except ValueError:                      # arguments the text stops inside of: as written so far
        if r.text.startswith("{", start):
            call["arguments"] = r.text[start:].rstrip(SPACE)
        raise _End from None
    if r.text.startswith("{", start):
        call["arguments"] = r.text[start:end]
    r.pos = end
    r.space()
    if not r.literal("}"):
        raise _End


def response_calls(calls: list[dict]) -> list[dict]:
    """The calls as a chat message carries them, each with a fresh id (32 characters)."""
    return [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}, "id": random_string()}
            for c in calls]


def reply(text: str, fmt: CallFormat, req: ToolRequest) -> tuple[str, list[dict] | None]:
    """A generated answer as llama-server returns it under tools: (content, calls with ids or None);
    where the parser takes nothing (an empty message) the raw text is the content."""
    content, calls = parse_reply(text, fmt, req)
    if not content and not calls:
        return text, None
    return content, response_calls(calls) or None


class ToolStream:
    """A streamed answer under tools, as llama-server streams it (task_result_state::update_chat_msg):
    every token the whole text is parsed again and the message's growth sent as deltas
    (common_chat_msg_diff::compute_diffs, server_chat_msg_diff_to_json_oaicompat): the content's,
    the last call's arguments, then each new call with its id, name and arguments so far."""

    def __init__(self, fmt: CallFormat, req: ToolRequest):
        self.fmt, self.req = fmt, req
        self.text, self.content, self.calls, self.ids = "", "", [], []

    def push(self, piece: str) -> list[dict]:
        self.text += piece
        content, calls = parse_reply(self.text, self.fmt, self.req)
        if not content and not calls:       # an empty message: not an update
            return []
        while len(self.ids) < len(calls):
            self.ids.append(random_string())
        deltas = []
        if content != self.content and content.startswith(self.content):
            deltas.append({"content": content[len(self.content):]})
        if self.calls:
            k = len(self.calls) - 1
            old, new = self.calls[k], calls[k]
            grown = new["arguments"][len(old["arguments"]):] if new["arguments"].startswith(old["arguments"]) else ""
            if grown or old["name"] != new["name"]:
                deltas.append(_call_delta(k, None if old["name"] == new["name"] else self.ids[k], new["name"]
                                          if old["name"] != new["name"] else "", grown))
        for k in range(len(self.calls), len(calls)):
            deltas.append(_call_delta(k, self.ids[k], calls[k]["name"], calls[k]["arguments"]))
        self.content, self.calls = content, calls
        return deltas

    def message_calls(self) -> list[dict]:
        """The calls so far, as a whole answer carries them (their streamed ids)."""
        return [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}, "id": i}
                for c, i in zip(self.calls, self.ids)]


def _call_delta(index: int, cid: str | None, name: str, arguments: str) -> dict:
    call: dict = {"index": index}
    if cid:
        call.update(id=cid, type="function")
    if name or arguments:
        call["function"] = {**({"name": name} if name else {}), **({"arguments": arguments} if arguments else {})}
    return {"tool_calls": [call]}
