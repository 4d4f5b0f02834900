"""bankml's JSON schema to GBNF (bankml/runtime/grammar/json_schema*.py) against llama-server b11434:
/completion's `generation_settings.grammar` is json_schema_to_grammar(schema), its 400 answer carries
the converter's exception text, and `-v` logs the chat path's grammar (common_grammar_builder)."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bankml.oracle.server import LlamaServer
from bankml.runtime.grammar.json_schema import (SchemaConverter, SchemaError, add_schema, build_grammar,
                                                format_grammar, parse_schema, to_grammar)

MODEL = Path.home() / ".cache/bankml/models/smollm2-q4_1.gguf"
ERROR_PREFIX = "Field 'json_schema': \"json_schema\": "

# tests/test-json-schema-to-grammar.cpp's cases that convert
LLAMA_CPP_CASES = [
    ("min 0", {"type": "integer", "minimum": 0}),
    ("min 1", {"type": "integer", "minimum": 1}),
    ("min 3", {"type": "integer", "minimum": 3}),
    ("min 9", {"type": "integer", "minimum": 9}),
    ("min 10", {"type": "integer", "minimum": 10}),
    ("min 25", {"type": "integer", "minimum": 25}),
    ("max 30", {"type": "integer", "maximum": 30}),
    ("min -5", {"type": "integer", "minimum": -5}),
    ("min -123", {"type": "integer", "minimum": -123}),
    ("max -5", {"type": "integer", "maximum": -5}),
    ("max 1", {"type": "integer", "maximum": 1}),
    ("max 100", {"type": "integer", "maximum": 100}),
    ("min 0 max 23", {"type": "integer", "minimum": 0, "maximum": 23}),
    ("min 15 max 300", {"type": "integer", "minimum": 15, "maximum": 300}),
    ("min 5 max 30", {"type": "integer", "minimum": 5, "maximum": 30}),
    ("min -123 max 42", {"type": "integer", "minimum": -123, "maximum": 42}),
    ("min -10 max 10", {"type": "integer", "minimum": -10, "maximum": 10}),
    ("empty schema (any value)", {}),
    ("exotic formats", {"items": [{"format": "date"}, {"format": "uuid"}, {"format": "time"},
        {"format": "date-time"}]}),
    ("string", {"type": "string"}),
    ("string w/ min length 1", {"type": "string", "minLength": 1}),
    ("string w/ min length 3", {"type": "string", "minLength": 3}),
    ("string w/ max length", {"type": "string", "maxLength": 3}),
    ("string w/ min & max length", {"type": "string", "minLength": 1, "maxLength": 4}),
    ("boolean", {"type": "boolean"}),
    ("integer", {"type": "integer"}),
    ("string const", {"const": "foo"}),
    ("non-string const", {"const": 123}),
    ("non-string enum", {"enum": ["red", "amber", "green", None, 42, ["foo"]]}),
    ("string array", {"type": "array", "prefixItems": {"type": "string"}}),
    ("nullable string array", {"type": ["array", "null"], "prefixItems": {"type": "string"}}),
    ("tuple1", {"prefixItems": [{"type": "string"}]}),
    ("tuple2", {"prefixItems": [{"type": "string"}, {"type": "number"}]}),
    ("array with empty items", {"type": "array", "items": {}}),
    ("array with empty items and prefixItems", {"type": "array", "items": {},
        "prefixItems": {"type": "string"}}),
    ("number", {"type": "number"}),
    ("minItems", {"items": {"type": "boolean"}, "minItems": 2}),
    ("maxItems 0", {"items": {"type": "boolean"}, "maxItems": 0}),
    ("maxItems 1", {"items": {"type": "boolean"}, "maxItems": 1}),
    ("maxItems 2", {"items": {"type": "boolean"}, "maxItems": 2}),
    ("min + maxItems", {"items": {"type": ["number", "integer"]}, "minItems": 3, "maxItems": 5}),
    ("min + max items with min + max values across zero", {"items": {"type": "integer", "minimum": -12,
        "maximum": 207}, "minItems": 3, "maxItems": 5}),
    ("min + max items with min + max values", {"items": {"type": "integer", "minimum": 12, "maximum": 207},
        "minItems": 3, "maxItems": 5}),
    ("simple regexp", {"type": "string", "pattern": "^abc?d*efg+(hij)?kl$"}),
    ("regexp escapes", {"type": "string", "pattern": "^\\[\\]\\{\\}\\(\\)\\|\\+\\*\\?$"}),
    ("regexp quote", {"type": "string", "pattern": "^\"$"}),
    ("regexp with top-level alternation", {"type": "string", "pattern": "^A|B|C|D$"}),
    ("regexp", {"type": "string", "pattern": "^(\\([0-9]{1,3}\\))?[0-9]{3}-[0-9]{4} a{3,5}nd...$"}),
    ("required props in original order", {"type": "object", "properties": {"b": {"type": "string"},
        "c": {"type": "string"}, "a": {"type": "string"}}, "required": ["a", "b", "c"],
        "additionalProperties": False, "definitions": {}}),
    ("1 optional prop", {"properties": {"a": {"type": "string"}}, "additionalProperties": False}),
    ("N optional props", {"properties": {"a": {"type": "string"}, "b": {"type": "string"},
        "c": {"type": "string"}}, "additionalProperties": False}),
    ("required + optional props each in original order", {"properties": {"b": {"type": "string"},
        "a": {"type": "string"}, "d": {"type": "string"}, "c": {"type": "string"}}, "required": ["a", "b"],
        "additionalProperties": False}),
    ("additional props", {"type": "object", "additionalProperties": {"type": "array",
        "items": {"type": "number"}}}),
    ("additional props (true)", {"type": "object", "additionalProperties": True}),
    ("additional props (implicit)", {"type": "object"}),
    ("empty w/o additional props", {"type": "object", "additionalProperties": False}),
    ("required + additional props", {"type": "object", "properties": {"a": {"type": "number"}},
        "required": ["a"], "additionalProperties": {"type": "string"}}),
    ("optional + additional props", {"type": "object", "properties": {"a": {"type": "number"}},
        "additionalProperties": {"type": "number"}}),
    ("required + optional + additional props", {"type": "object", "properties": {"and": {"type": "number"},
        "also": {"type": "number"}}, "required": ["and"], "additionalProperties": {"type": "number"}}),
    ("optional props with empty name", {"properties": {"": {"type": "integer"}, "a": {"type": "integer"}},
        "additionalProperties": {"type": "integer"}}),
    ("optional props with nested names", {"properties": {"a": {"type": "integer"}, "aa": {"type": "integer"}},
        "additionalProperties": {"type": "integer"}}),
    ("optional props with common prefix", {"properties": {"ab": {"type": "integer"},
        "ac": {"type": "integer"}}, "additionalProperties": {"type": "integer"}}),
    ("top-level $ref", {"$ref": "#/definitions/foo", "definitions": {"foo": {"type": "object",
        "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}}}),
    ("anyOf", {"anyOf": [{"$ref": "#/definitions/foo"}, {"$ref": "#/definitions/bar"}],
        "definitions": {"foo": {"properties": {"a": {"type": "number"}}},
        "bar": {"properties": {"b": {"type": "number"}}}}, "type": "object"}),
    ("anyOf $ref", {"properties": {"a": {"anyOf": [{"type": "string"}, {"type": "number"}]},
        "b": {"anyOf": [{"$ref": "#/properties/a/anyOf/0"}, {"type": "boolean"}]}}, "type": "object"}),
    ("mix of allOf, anyOf and $ref (similar to https://json.schemastore.org/tsconfig.json)",
        {"allOf": [{"$ref": "#/definitions/foo"}, {"$ref": "#/definitions/bar"},
        {"anyOf": [{"$ref": "#/definitions/baz"}, {"$ref": "#/definitions/bam"}]}],
        "definitions": {"foo": {"properties": {"a": {"type": "number"}}},
        "bar": {"properties": {"b": {"type": "number"}}}, "bam": {"properties": {"c": {"type": "number"}}},
        "baz": {"properties": {"d": {"type": "number"}}}}, "type": "object"}),
    ("allOf with enum schema", {"allOf": [{"$ref": "#/definitions/foo"}],
        "definitions": {"foo": {"type": "string", "enum": ["a", "b"]}}}),
    ("allOf with multiple enum schemas", {"allOf": [{"$ref": "#/definitions/foo"},
        {"$ref": "#/definitions/bar"}], "definitions": {"foo": {"type": "string", "enum": ["a", "b", "c"]},
        "bar": {"type": "string", "enum": ["b", "c", "d"]}}}),
    ("conflicting names", {"type": "object", "properties": {"number": {"type": "object",
        "properties": {"number": {"type": "object", "properties": {"root": {"type": "number"}},
        "required": ["root"], "additionalProperties": False}}, "required": ["number"],
        "additionalProperties": False}}, "required": ["number"], "additionalProperties": False,
        "definitions": {}}),
    ("description only (no type) treated as unconstrained",
        {"description": "The 0-based index of the last line to be retrieved (inclusive). If None, read "
                        "until the end of the file."}),
    ("literal string with escapes", {"properties": {"code": {"const": " \r \n \" \\ ",
        "description": "Generated code", "title": "Code", "type": "string"}}, "required": ["code"],
        "title": "DecoderResponse", "type": "object"}),
    ("regexp with non-capturing group", {"type": "string", "pattern": "^(?:foo|bar)baz$"}),
    ("regexp with nested non-capturing groups", {"type": "string", "pattern": "^(?:(?:ab)+c)?d$"}),
    ("unanchored regexp", {"type": "string", "pattern": "[0-9]+"}),
    ("regexp with unsupported shorthand", {"type": "string", "pattern": "^[0-9]{3}\\w$"}),
    ("regexp with escaped hyphen in a character class", {"type": "string", "pattern": "^[a-z\\-]+$"}),
    ("regexp with escaped hyphen outside a character class", {"type": "string", "pattern": "^a\\-b$"}),
    ("unsupported regexp in a property", {"type": "object", "properties": {"a": {"type": "string",
        "pattern": "^(?=a)a$"}}, "required": ["a"], "additionalProperties": False}),
]

# every branch of the converter, and the JSON it reads as nlohmann does
OWN_CASES = [
    # primitives and string formats
    ("null", {"type": "null"}),
    ("object without properties", {"type": "object", "properties": {}}),
    ("format date", {"type": "string", "format": "date"}),
    ("format time", {"type": "string", "format": "time"}),
    ("format date-time", {"type": "string", "format": "date-time"}),
    ("format uuid", {"type": "string", "format": "uuid"}),
    ("format uuid4", {"type": "string", "format": "uuid4"}),
    ("format uuid6 is plain", {"type": "string", "format": "uuid6"}),
    ("format email is plain", {"type": "string", "format": "email"}),
    ("format without type", {"format": "date-time"}),
    ("pattern wins over format", {"type": "string", "format": "date", "pattern": "^[0-9]+$"}),
    ("maxLength 0", {"type": "string", "maxLength": 0}),
    ("minLength without type", {"minLength": 2}),
    ("empty type is no type", {"type": "", "maxLength": 1}),
    # integers
    ("min 0 max 0", {"type": "integer", "minimum": 0, "maximum": 0}),
    ("min -1 max -1", {"type": "integer", "minimum": -1, "maximum": -1}),
    ("min -300 max -15", {"type": "integer", "minimum": -300, "maximum": -15}),
    ("min -9 max 1000000", {"type": "integer", "minimum": -9, "maximum": 1000000}),
    ("min 1234567", {"type": "integer", "minimum": 1234567}),
    ("min 95", {"type": "integer", "minimum": 95}),
    ("min -9876", {"type": "integer", "minimum": -9876}),
    ("max -123456", {"type": "integer", "maximum": -123456}),
    ("max 0", {"type": "integer", "maximum": 0}),
    ("max 999", {"type": "integer", "maximum": 999}),
    ("exclusive int bounds", {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 100}),
    ("exclusive float bounds", {"type": "integer", "exclusiveMinimum": 2.5, "exclusiveMaximum": 7.5}),
    ("float bounds", {"type": "integer", "minimum": -2.5, "maximum": 99.9}),
    ("inclusive beats exclusive", {"type": "integer", "minimum": 5, "exclusiveMinimum": 50, "maximum": 9}),
    ("min above max", {"type": "integer", "minimum": 50, "maximum": 7}),
    ("huge max", {"type": "integer", "minimum": 1, "maximum": 9223372036854775806}),
    ("uint64 max wraps", {"type": "integer", "maximum": 18446744073709551615}),
    ("min int64 is no bound", {"type": "integer", "minimum": -9223372036854775808, "maximum": 12}),
    ("number ignores bounds", {"type": "number", "minimum": 1.5, "maximum": 2}),
    # arrays and tuples
    ("items and min 0 max 1", {"type": "array", "items": {"type": "string"}, "minItems": 0, "maxItems": 1}),
    ("items min 1", {"type": "array", "items": {"type": "null"}, "minItems": 1}),
    ("minItems above maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}),
    ("minItems only", {"type": "array", "minItems": 2}),
    ("maxItems wraps to 32 bits", {"type": "array", "items": {"type": "boolean"}, "maxItems": 4294967297}),
    ("tuple ignores minItems", {"type": "array", "items": [{"type": "integer"}, {"const": "x"}], "minItems": 5}),
    ("items beat prefixItems", {"type": "array", "prefixItems": [{"type": "null"}], "items": {"type": "number"}}),
    ("nested arrays", {"type": "array", "items": {"type": "array", "items": {"type": "integer", "maximum": 3}}}),
    ("empty tuple", {"type": "array", "prefixItems": []}),
    # objects
    ("required order differs", {"properties": {"x": {}, "y": {"type": "null"}, "z": {"type": "boolean"}},
                                "required": ["z", "x"]}),
    ("required not in properties", {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "required": ["b", 3]}),
    ("additionalProperties false only", {"additionalProperties": False}),
    ("additionalProperties true with props", {"type": "object", "properties": {"k": {"type": "string"}},
                                              "additionalProperties": True}),
    ("additional schema object", {"type": "object", "additionalProperties": {"type": "object", "properties": {
        "v": {"enum": [1, 2]}}, "required": ["v"]}}),
    ("reserved property names", {"type": "object", "properties": {"string": {"type": "string"}, "root": {
        "type": "integer"}, "value": {}, "char": {"type": "string", "maxLength": 2}}, "required": ["root"]}),
    ("odd key characters", {"type": "object", "properties": {'a"b': {"type": "null"},
                            "back\\slash": {"type": "null"},
                            "tab\tnl\n": {"type": "null"}, "a b.c": {"type": "null"}}}),
    ("unicode keys", {"type": "object", "properties": {"名前": {"type": "string"}, "é": {"type": "integer"},
                      "ü": {"const": "ñ"}}, "required": ["é"],
                      "additionalProperties": {"type": "boolean"}}),
    ("type array with properties", {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}}),
    ("nested type array", {"type": [["string", "null"], "integer"]}),
    # enum and const of every JSON type
    ("const null", {"const": None}),
    ("const true", {"const": True}),
    ("const negative", {"const": -42}),
    ("const big uint", {"const": 18446744073709551615}),
    ("const beyond uint64", {"const": 18446744073709551621}),
    ("const floats", {"enum": [1.5, 0.1, 100.0, -0.0, 1e-07, 1e15, 1e16, 123456789012345.6, 1e300,
                               -2.5e-5, 0.0001]}),
    ("const object", {"const": {"b": [1, {"c": None}], "a": "x\"y"}}),
    ("const unicode and control", {"const": "é\u00e9\u0001\u001f\u007f\b\f\n\r\t/ 😀"}),
    ("enum of every type", {"enum": [None, False, 3, -1.25, "s", [], {}, [1, "2"], {"k": {"l": True}}]}),
    ("const wins over type", {"type": "integer", "const": "text"}),
    # anyOf / oneOf / allOf
    ("oneOf", {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0}]}),
    ("oneOf beats anyOf", {"oneOf": [{"type": "null"}], "anyOf": [{"type": "string"}]}),
    ("nested anyOf in property", {"properties": {"p": {"anyOf": [{"anyOf": [{"type": "null"}, {"const": 1}]},
                                                                 {"type": "boolean"}]}}}),
    ("allOf objects", {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                                 {"properties": {"b": {"type": "integer"}}},
                                 {"anyOf": [{"properties": {"c": {"type": "null"}}}]}]}),
    ("allOf disjoint enums", {"allOf": [{"enum": [1, 2]}, {"enum": [3]}]}),
    ("allOf on type string", {"type": "string", "allOf": [{"enum": ["y", "x", 3]},
                                                          {"enum": ["x", 3, "y", "z"]}]}),
    ("allOf ignored with properties", {"type": "object", "properties": {"q": {}}, "allOf": [{"enum": [1]}]}),
    # $ref
    ("nested $defs", {"$ref": "#/$defs/outer", "$defs": {"outer": {"type": "object", "properties": {
        "in": {"$ref": "#/$defs/inner/$defs/deep"}}, "required": ["in"]}, "inner": {"$defs": {
            "deep": {"type": "integer", "minimum": 10, "maximum": 20}}}}}),
    ("recursive tree", {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"], "additionalProperties": False}}}),
    ("ref to ref", {"properties": {"a": {"$ref": "#/$defs/b"}}, "$defs": {"b": {"$ref": "#/$defs/c"},
                    "c": {"type": "string", "format": "uuid"}}}),
    ("ref into array index", {"$defs": {"list": [{"type": "null"}, {"type": "boolean"}]},
                              "properties": {"x": {"$ref": "#/$defs/list/1"}}}),
    ("ref used twice", {"type": "array", "prefixItems": [{"$ref": "#/definitions/t"},
                                                         {"$ref": "#/definitions/t"}],
                        "definitions": {"t": {"type": "string", "pattern": "^[a-c]{2}$"}}}),
    ("ref with odd characters", {"$ref": "#/$defs/a b%c", "$defs": {"a b%c": {"type": "number"}}}),
    # patterns
    ("pattern class negated", {"type": "string", "pattern": "^[^a-z0-9_]+[A-Z]?$"}),
    ("pattern hex escapes", {"type": "string", "pattern": "^[\\x41-\\x5A\\u00e9]\\x2e\\t\\n\\\\$"}),
    ("pattern dot and groups", {"type": "string", "pattern": "^(a.b|(cd)*e)+.{2}f{3,}g{,4}$"}),
    ("pattern repeated subrule", {"type": "string", "pattern": "^([0-9]{2}|x){3}-([0-9]{2}|x){3}[a-f]{4}$"}),
    ("pattern literal quotes", {"type": "string", "pattern": "^say \"hi\"(!|\\?)$"}),
    ("pattern empty", {"type": "string", "pattern": "^$"}),
    ("pattern backslash escapes", {"type": "string", "pattern": "^\\.\\^\\$\\-a\\\"b$"}),
    ("pattern in array items", {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                "maxItems": 3}),
    ("pattern lookahead unsupported", {"type": "string", "pattern": "^(?!x)[a-z]$"}),
    ("pattern \\d unsupported", {"type": "string", "pattern": "^\\d+$"}),
    ("pattern class escape unsupported", {"type": "string", "pattern": "^[\\w.]+$"}),
    ("pattern bad curly unsupported", {"type": "string", "pattern": "^a{x}$"}),
    ("pattern curly three values", {"type": "string", "pattern": "^a{1,2,3}$"}),
    ("pattern unterminated curly", {"type": "string", "pattern": "^a{2$"}),
    ("pattern stray bracket", {"type": "string", "pattern": "^a]$"}),
    ("pattern inner anchor", {"type": "string", "pattern": "^a$|^b$"}),
    ("pattern unicode literal", {"type": "string", "pattern": "^héllo [α-ω]$"}),
    ("unsupported pattern reverts rules", {"type": "object", "properties": {"p": {"type": "string",
                                           "pattern": "^(a|b){2}.\\s$"},
                                           "q": {"type": "string", "pattern": "^.$"}}}),
    ("star property and additional", {"properties": {"*": {"type": "null"}},
                                      "additionalProperties": {"type": "null"}}),
    ("description only", {"description": "anything", "title": "t"}),
    ("property with empty schema", {"type": "object", "properties": {"any": {}}, "required": ["any"]}),
]

# schemas llama.cpp refuses, the first three from tests/test-json-schema-to-grammar.cpp
ERROR_CASES = [
    ("unknown type", {"type": "kaboom"}),
    ("invalid type", {"type": 123}),
    ("regexp with unbalanced parentheses", {"type": "string", "pattern": "^(a$"}),
    ("root is not an object", True),
    ("ref outside the document", {"$ref": "https://example.com/schema.json"}),
    ("ref not found", {"$ref": "#/definitions/missing"}),
    ("ref index out of range", {"$ref": "#/$defs/l/5", "$defs": {"l": [{}]}}),
    ("ref index not a number", {"$ref": "#/$defs/l/x", "$defs": {"l": [{}]}}),
    ("ref not a string", {"$ref": 3}),
    ("properties not an object", {"properties": []}),
    ("additionalProperties not a schema", {"type": "object", "additionalProperties": 1}),
    ("negative minItems", {"type": "array", "minItems": -1}),
    ("float maxLength", {"type": "string", "maxLength": 2.0}),
    ("minLength wraps negative", {"type": "string", "minLength": 2147483648}),
    ("format not a string", {"type": "string", "format": 1}),
    ("pattern not a string", {"type": "string", "pattern": None}),
    ("empty enum", {"enum": []}),
    ("enum not an array", {"enum": "a"}),
    ("empty anyOf", {"anyOf": []}),
    ("allOf not an array", {"allOf": {}}),
    ("empty type array", {"type": []}),
    ("type array with a number", {"type": ["string", 5]}),
    ("minimum not a number", {"type": "integer", "minimum": "3"}),
    ("boolean exclusiveMaximum", {"type": "integer", "exclusiveMaximum": True}),
    ("items not an object", {"type": "array", "items": True}),
    ("error path in anyOf", {"anyOf": [{}, {"properties": {"a": {"type": "wat"}}}]}),
    ("nothing to repeat", {"type": "string", "pattern": "^*a$"}),
    ("nothing to repeat in curly", {"type": "string", "pattern": "^{2}$"}),
    ("unterminated class", {"type": "string", "pattern": "^[abc$"}),
    ("trailing backslash", {"type": "string", "pattern": "^a\\$"}),
    ("close paren without open", {"type": "string", "pattern": "^a)$"}),
    ("two invalid patterns", {"properties": {"a": {"type": "string", "pattern": "^(x$"},
                                             "b": {"type": "string", "pattern": "^[y$"}}}),
    ("maximum beyond int64", {"type": "integer", "maximum": 1e30}),
]

# response_format schemas of a chat request, whose rules llama-server adds with add_schema
CHAT_CASES = [
    ("name and age", {"type": "object",
                      "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                      "required": ["name", "age"]}),
    ("ref and enum", {"$ref": "#/$defs/p", "$defs": {"p": {"type": "object", "properties": {
        "kind": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 1, "maximum": 12}},
        "required": ["kind"]}}}),
    ("pattern items", {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,4}$"},
                       "maxItems": 3}),
    ("additional numbers", {"type": "object", "additionalProperties": {"type": "number"}}),
    ("anyOf root", {"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]}),
]

WARNING_CASES = [
    ("lookahead", {"type": "string", "pattern": "^(?!x)[a-z]$"}),
    ("two unsupported", {"properties": {"a": {"type": "string", "pattern": "^\\d$"},
                                        "b": {"type": "string", "pattern": "a+"}}}),
]

GRAMMAR_LOG_RE = re.compile(r"Grammar \(tool_calls\): (.*?)\n\d+\.\d+\.\d+\.\d+ ", re.S)
WARNING_LOG = "WARNING: JSON schema conversion was incomplete: "


@pytest.fixture(scope="module")
def server():
    with LlamaServer(MODEL, extra=("-v",)) as srv:  # -v logs the chat path's grammar
        yield srv


def post(srv: LlamaServer, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def llama_conversion(srv: LlamaServer, schema) -> tuple[str, str]:
    """("grammar", text) or ("error", e.what()) as llama-server's /completion answers."""
    status, body = post(srv, "/completion", {"prompt": "x", "n_predict": 0, "json_schema": schema})
    if status == 200:
        return "grammar", body["generation_settings"]["grammar"]
    message = body["error"]["message"]
    assert status == 400 and message.startswith(ERROR_PREFIX), message
    return "error", message[len(ERROR_PREFIX):]


def bankml_conversion(schema) -> tuple[str, str]:
    try:  # llama-server converts an empty object schema as {"type": "object"}
        return "grammar", to_grammar({"type": "object"} if schema == {} else schema)
    except SchemaError as e:
        return "error", str(e)


CONVERTED_CASES = LLAMA_CPP_CASES + OWN_CASES


def case_ids(cases):
    return [name for name, _ in cases]


@pytest.mark.oracle
@pytest.mark.parametrize("name,schema", CONVERTED_CASES, ids=case_ids(CONVERTED_CASES))
def test_grammar_equals_llama_server(server, name, schema):
    expected = llama_conversion(server, schema)
    assert expected[0] == "grammar", expected[1]
    assert bankml_conversion(schema) == expected


@pytest.mark.oracle
@pytest.mark.parametrize("name,schema", ERROR_CASES, ids=case_ids(ERROR_CASES))
def test_refused_schema_error_equals_llama_server(server, name, schema):
    expected = llama_conversion(server, schema)
    assert expected[0] == "error", expected[1]
    assert bankml_conversion(schema) == expected


@pytest.mark.oracle
@pytest.mark.parametrize("name,schema", WARNING_CASES, ids=case_ids(WARNING_CASES))
def test_unsupported_pattern_warning_equals_llama_server(server, name, schema):
    assert llama_conversion(server, schema)[0] == "grammar"
    logged = server._read_log().rsplit(WARNING_LOG, 1)[1].split("\n", 1)[0]
    converter = SchemaConverter()
    converter.visit(parse_schema(schema).root, "")
    assert "; ".join(converter.warnings) == logged


@pytest.mark.oracle
@pytest.mark.parametrize("name,schema", CHAT_CASES, ids=case_ids(CHAT_CASES))
def test_chat_schema_rules_equal_llama_server(server, name, schema):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    status, answer = post(server, "/v1/chat/completions", body)
    assert status == 200, answer
    logged = GRAMMAR_LOG_RE.findall(server._read_log())[-1]
    rules = dict(line.split(" ::= ", 1) for line in logged.splitlines() if line)
    assert rules.pop("response-format") == "response-format-schema"
    schema_rules = {k: v for k, v in rules.items() if k != "root" and not k.startswith("json-")}

    mine: dict[str, str] = {}
    assert add_schema(mine, "response-format-schema", schema) == "response-format-schema"
    assert mine == schema_rules
    assert to_grammar(schema, prefix="response-format-schema") == format_grammar(mine)


def test_pattern_quantifier_after_multibyte_char_repeats_its_last_byte():
    # llama.cpp reads a pattern byte by byte: "é+" is "\xc3" "\xa9"+, a grammar its parser refuses
    grammar = to_grammar({"type": "string", "pattern": "^é+$"})
    assert grammar.encode("utf-8", "surrogateescape").startswith(b'root ::= "\\"" ("\xc3" "\xa9"+) "\\""\n')


def test_sub_schema_ref_names_its_ref_rule():
    # tests/test-json-schema-to-grammar.cpp, "sub-schema $ref"
    doc = parse_schema({"type": "object", "properties": {"item": {"$ref": "#/$defs/item"}},
                        "$defs": {"item": {"type": "object", "properties": {"a": {"type": "string"}},
                                           "required": ["a"], "additionalProperties": False}}})
    grammar = build_grammar(lambda b: b.add_schema("root", doc.root.properties[0].schema))
    assert grammar == (
        'char ::= [^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})\n'
        'ref-defs-item ::= "{" space ref-defs-item-a-kv space "}"\n'
        'ref-defs-item-a-kv ::= "\\"a\\"" space ":" space string\n'
        'root ::= ref-defs-item\n'
        'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}\n'
        'string ::= "\\"" char* "\\""\n')


def test_parsed_document_converts_as_its_json():
    # tests/test-json-schema-to-grammar.cpp, "parsed document"
    schema = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "next": {"$ref": "#/$defs/node"}, "leaf": {}}, "additionalProperties": False}}}
    assert build_grammar(lambda b: b.add_schema("root", parse_schema(schema).root)) == to_grammar(schema)
