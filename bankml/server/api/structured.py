"""Structured output: the grammar a request asks for, as llama-server b11434 builds it, and Ollama's
`format` as Ollama (llm/llama_server.go) hands it to llama-server.

    c = native(body)                          # /completion, /v1/completions: "json_schema" or "grammar"
    c = chat(body, model, messages, extra)    # /v1/chat/completions: also "response_format"
    g = c.start(pieces, tokenize)             # the Grammar a generation starts from (400 if invalid)

Where llama-server takes the text from:
- "json_schema" (when there is no "grammar"): json_schema_to_grammar (an empty or null schema is
  any object), a COMMON_GRAMMAR_TYPE_OUTPUT_FORMAT grammar; outside a chat its generation prompt is
  empty, so nothing is accepted before the first token.
- "grammar": the user's GBNF (COMMON_GRAMMAR_TYPE_USER), never prefilled.
- a chat's "response_format" (json_object: its "schema" or any object; json_schema: its
  json_schema.schema) or object "json_schema": the chat autoparser's grammar (chat-auto-parser-
  generator.cpp), the generation prompt, then the JSON bare or in a ```json fence, which
  common_sampler_init prefills with the generation prompt's tokens. It wins over "grammar".
Every such grammar is checked before the request is queued: a bad one is llama-server's 400.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from bankml.runtime.chat import chat_template, generation_prompt, render_chat, template_caps
from bankml.runtime.grammar.json_schema import SchemaError, add_schema, format_literal, to_grammar
from bankml.runtime.grammar.lazy import LazyGrammar
from bankml.runtime.grammar.matcher import Grammar, GrammarError
from bankml.runtime.grammar.pieces import Pieces
from bankml.server.api import tools
from bankml.server.fields import BadRequest

# Ollama's grammarJSON (llm/llama_server.go, ollama/ollama at fb30760, 2026-08-21): format "json"
OLLAMA_JSON = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
         string ":" ws value
    ("," ws string ":" ws value)*
  )? ws "}"
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? ws "]"
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]) # escapes
  )* "\""
number ::= ("-"? ([0-9] | [1-9] [0-9]*)) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= ([ \t\n] ws)?
'''

# common_peg_parser_builder::json()'s rules, as the chat grammar carries them (unreached from its
# root when a schema constrains the answer, but part of the text llama-server builds)
PEG_JSON = r'''json-array ::= "[" space ("]" | json-value (space "," space json-value)* space "]")
json-bool ::= "true" | "false"
json-null ::= "null"
json-number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? (("e" | "E") [+-]? [0-9]+)?
json-object ::= "{" space ("}" | json-string space ":" space json-value (space "," space json-string space ":" space json-value)* space "}")
json-string ::= "\"" ( [^"\\] | "\\" ( ["\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null'''

INVALID_GRAMMAR = "Failed to initialize samplers: failed to parse grammar"
# what the autoparser (common/chat-auto-parser) would give another root for: bankml builds the
# chat grammar of a template without reasoning markers only
REASONING_MARKERS = ("<think>", "reasoning_content", "enable_thinking", "<|channel|>", "<|START_THINKING|>")


@dataclass(frozen=True)
class Constraint:
    text: str               # the GBNF
    prefill: str = ""       # text the grammar accepts before the first token (a chat's generation prompt)
    triggers: tuple = ()    # lazy: the words that start it (then never prefilled)
    calls: object = None    # a tools.CallFormat and ToolRequest pair when the reply holds tool calls

    def start(self, pieces: Pieces, tokenize) -> Grammar | LazyGrammar:
        """The grammar a generation starts from: parsed, then the prefill's tokens accepted
        (common_sampler_init: common_tokenize(prefill, add_special=false, parse_special=true), a
        first token that is only the tokenizer's leading space left out). pieces: the vocabulary's
        (shared by every request's grammar); tokenize(text) -> ids."""
        try:
            grammar = Grammar(self.text, pieces, tokenize=tokenize)
        except GrammarError:
            raise BadRequest(INVALID_GRAMMAR) from None
        if self.triggers:
            return LazyGrammar(grammar, list(self.triggers))
        ids = tokenize(self.prefill) if self.prefill else []
        for i, t in enumerate(ids):
            if i == 0 and pieces.pieces[t][:1].isspace() and not self.prefill[:1].isspace():
                continue
            try:
                grammar.accept(t)
            except GrammarError as e:
                raise BadRequest(f"Failed to initialize samplers: {e}") from None
        return grammar


def _schema_grammar(schema) -> str:
    """params_from_json's json_schema: json_schema_to_grammar, its errors as llama-server words them."""
    if schema is None or (isinstance(schema, dict) and not schema):
        schema = {"type": "object"}         # json_value's default, then "an empty schema means any object"
    try:
        return to_grammar(schema)
    except SchemaError as e:
        raise BadRequest(f"Field 'json_schema': \"json_schema\": {e}") from None


def _user_grammar(body: dict) -> str:
    g = body.get("grammar")
    if g is not None and not isinstance(g, str):
        raise BadRequest("\"grammar\" must be a string of GBNF")
    return g or ""


def native(body: dict) -> Constraint | None:
    """/completion's and /v1/completions' grammar: "json_schema" unless a "grammar" is there."""
    if "json_schema" in body and "grammar" not in body:
        return Constraint(_schema_grammar(body["json_schema"]))
    text = _user_grammar(body)
    return Constraint(text) if text else None


def chat(body: dict, model, messages: list[dict], extra: dict, continued: bool,
         req: tools.ToolRequest | None = None) -> Constraint | None:
    """oaicompat_chat_params_parse's grammar for /v1/chat/completions: `continued` says the prompt
    continues the last message (continue_final_message, or a final assistant message); `req` the
    request's tools (extra then renders them)."""
    schema = body.get("json_schema")
    grammar = _user_grammar(body)
    if schema is not None and grammar:
        raise BadRequest("Cannot use both json_schema and grammar", 500, "server_error")
    if req is not None and req.choice != "none" and "grammar" in body:
        raise BadRequest("Cannot use custom grammar constraints with tools.")
    if "response_format" in body:
        rf = body["response_format"]
        if not isinstance(rf, dict):
            raise BadRequest("response_format must be an object with a \"type\" (llama-server ignores any other value)")
        kind = rf.get("type") if isinstance(rf.get("type"), str) else ""
        if kind == "json_object":
            if "schema" in rf or schema is None or schema == {} or schema == "" or schema == []:
                schema = rf.get("schema", {})
        elif kind == "json_schema":
            wrapper = rf.get("json_schema") if isinstance(rf.get("json_schema"), dict) else {}
            schema = wrapper.get("schema", {})
            if not isinstance(schema, dict):
                raise BadRequest("response_format.json_schema.schema must be a JSON object "
                                 "(llama-server ignores any other value)")
        elif kind not in ("", "text"):
            raise BadRequest(f'response_format type must be one of "text" or "json_object", but got: {kind}')
    if isinstance(schema, dict):
        prompt = generation_prompt(model, messages, **extra)
        return Constraint(chat_grammar(model, prompt, schema or {"type": "object"}, continued), prompt)
    if schema is not None:                  # not an object: the field handler converts it, and fails
        _schema_grammar(schema)
    if req is not None and req.choice != "none":
        calls = tool_calls(model, messages, extra, continued, req)
        if calls is not None:
            return calls
    return Constraint(grammar) if grammar else None


def tool_calls(model, messages: list[dict], extra: dict, continued: bool, req: tools.ToolRequest) -> Constraint | None:
    """The autoparser's tool-call grammar for a template that renders tool calls: under "required"
    prefilled with the generation prompt, under "auto" lazy, started by the call marker. None
    where the template renders no tool call (llama-server then parses plain content)."""
    source = chat_template(model)
    if not template_caps(source)["supports_tool_calls"]:
        return None
    marker = next((m for m in REASONING_MARKERS if m in source), None)
    if marker is not None:
        raise BadRequest(f"tools: the chat template has reasoning ({marker!r}), whose tool-call grammar bankml "
                         "does not build", 501, "not_supported_error")
    if continued:
        raise BadRequest("tools with a continued final message are not implemented", 501, "not_supported_error")
    prompt = generation_prompt(model, messages, **extra)

    def render(msgs: list[dict], add_generation_prompt: bool) -> str:
        return render_chat(model, msgs, add_generation_prompt=add_generation_prompt, prefill_assistant=False,
                           **extra)
    fmt = tools.call_format(render)
    if fmt is None:
        return None
    text = tools.grammar(fmt, req, prompt, PEG_JSON)
    if req.choice == "required":
        return Constraint(text, prompt, calls=(fmt, req))
    return Constraint(text, triggers=(fmt.start,), calls=(fmt, req))


def chat_grammar(model, generation_prompt: str, schema: dict, continued: bool) -> str:
    """The autoparser's grammar for a response format (autoparser::build_parser, no tools, no
    reasoning): root ::= generation prompt, space, then the schema's JSON alone or in a ```json fence."""
    source = chat_template(model)
    marker = next((m for m in REASONING_MARKERS if m in source), None)
    if marker is not None:
        raise BadRequest(f"response_format: the chat template has reasoning ({marker!r}), whose grammar bankml "
                         "does not build", 501, "not_supported_error")
    if continued:
        raise BadRequest("response_format with a continued final message is not implemented", 501,
                         "not_supported_error")
    rules: dict[str, str] = {}
    try:
        name = add_schema(rules, "response-format-schema", schema)
    except SchemaError as e:
        raise BadRequest("Unable to generate parser for this template. Automatic parser generation failed: "
                         f"{e}") from None
    rules["response-format"] = name
    rules["root"] = (f"{format_literal(generation_prompt)} space space (\"```json\" space response-format space \"```\" | "
                     "space response-format space)")
    lines = [f"{k} ::= {v}" for k, v in rules.items()] + PEG_JSON.splitlines()
    return "\n".join(sorted(lines)) + "\n"


_FENCE = "```json"


def response_content(text: str) -> str:
    """The content llama-server's chat parser takes from a response-format answer (the autoparser's
    PEG parser, lenient at the end of the text): the JSON value alone, out of its ```json fence and
    the space around it; a value the text stops inside of, from its start to the end; before a value
    starts, none ("": llama-server then answers the whole text, and streams nothing)."""
    i = len(text) - len(text.lstrip(tools.SPACE))
    rest = text[i:]
    if rest.startswith(_FENCE):
        rest = rest[len(_FENCE):].lstrip(tools.SPACE)
    elif _FENCE.startswith(rest):
        return ""
    if not rest:
        return ""
    try:
        _, end = json.JSONDecoder().raw_decode(rest)
    except ValueError:
        return rest
    return rest[:end]


def answer(text: str) -> str:
    """A response-format answer's content as llama-server answers it: the parsed content, or the
    whole text when the parser took none."""
    return response_content(text) or text


class ContentStream:
    """A streamed response-format answer's content deltas: each the parsed content's growth."""

    def __init__(self):
        self.text, self.sent = "", ""

    def push(self, piece: str) -> str:
        self.text += piece
        content = response_content(self.text)
        if not content.startswith(self.sent):
            return ""
        delta, self.sent = content[len(self.sent):], content
        return delta


def ollama(body: dict, kind: str) -> dict:
    """Ollama's `format` as the llama-server fields Ollama sends (llm/llama_server.go): for a generate,
    "json" -> its own JSON grammar and a schema -> "json_schema"; for a chat, response_format
    json_object or json_schema; "" or null -> none. Anything else is Ollama's error."""
    f = body.get("format")
    if f is None or f == "":
        return {}
    if f != "json" and not isinstance(f, dict):
        raw = json.dumps(f, separators=(",", ":"))
        raise BadRequest(f'invalid format: {json.dumps(raw)}; expected "json" or a valid JSON Schema object')
    if kind == "generate":
        return {"grammar": OLLAMA_JSON} if f == "json" else {"json_schema": f}
    if f == "json":
        return {"response_format": {"type": "json_object"}}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "schema", "schema": f}}}
