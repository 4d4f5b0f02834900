"""JSON schema to GBNF, as llama.cpp b11434 does it: common/json-schema.cpp parses the schema into
a document of typed nodes (json_schema_doc.py), and common/json-schema-to-grammar.cpp, here, turns
the nodes into rules.

    to_grammar({"type": "integer", "minimum": 0})   # json_schema_to_grammar(schema)
    build_grammar(lambda b: b.add_schema("response-format-schema", schema))   # build_grammar(cb)

A JSON value is what json.loads gives (dict, list, str, int, float, bool, None); an int outside
int64/uint64 is a double, as nlohmann reads it.
"""
from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Callable

from bankml.runtime.grammar.json_schema_doc import (AllOfSchema, RefSchema, Schema, SchemaError, StringSchema,
                                                    is_int, parse_schema)
from bankml.runtime.grammar.json_schema_pattern import (INT64_MAX, INT64_MIN, INT_MAX, ConversionError,
                                                        InvalidPattern, UnsupportedPattern, build_min_max_int,
                                                        build_repetition, format_literal, pattern_to_rule)

__all__ = ["SchemaError", "SchemaConverter", "GrammarBuilder", "add_schema", "build_grammar", "dump_json",
           "format_grammar", "format_literal", "parse_schema", "to_grammar"]


# ---- JSON as common_json::dump writes it --------------------------------------------------------

def _dump_float(x: float) -> str:
    """nlohmann's dump of a double: shortest digits, decimal for exponents -4 < n <= 15."""
    if not math.isfinite(x):
        return "null"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    t = Decimal(repr(abs(x))).as_tuple()
    digits = "".join(map(str, t.digits)).rstrip("0")
    k, n = len(digits), len(t.digits) + t.exponent  # value = 0.digits * 10^n
    if k <= n <= 15:
        s = digits + "0" * (n - k) + ".0"
    elif 0 < n <= 15:
        s = digits[:n] + "." + digits[n:]
    elif -4 < n <= 0:
        s = "0." + "0" * -n + digits
    else:
        e = n - 1
        s = digits[0] + ("." + digits[1:] if k > 1 else "") + ("e-" if e < 0 else "e+") + f"{abs(e):02d}"
    return ("-" if x < 0 else "") + s


def dump_json(v) -> str:
    """common_json::dump(): compact, keys in insertion order, UTF-8 kept."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if is_int(v):
        return str(v)
    if isinstance(v, (int, float)):
        return _dump_float(float(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{" + ",".join(dump_json(str(k)) + ":" + dump_json(x) for k, x in v.items()) + "}"
    return "[" + ",".join(dump_json(x) for x in v) + "]"


# ---- document to GBNF (common/json-schema-to-grammar.cpp) -----------------------------------------

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

PRIMITIVE_RULES = {  # name: (rule, deps)
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} '
             '"-" [0-9a-fA-F]{12} "\\""', ()),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}

STRING_FORMAT_RULES = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}

RESERVED_NAMES = {"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES}
INVALID_RULE_CHARS_RE = re.compile(r"[^a-zA-Z0-9-]+")


def _not_strings(strings: list[str], char_rule: str) -> str:
    """A JSON string that is none of `strings`, from a trie of their code points:
    ["a"] -> ["] ( [a] char+ | [^"a] char* )? ["]"""
    root: dict = {}
    for word in strings:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True  # a word ends here
    out = ['["] ( ']

    def visit(node: dict) -> None:
        children = sorted((ch for ch in node if ch), key=ord)
        for i, ch in enumerate(children):
            out.append(("" if i == 0 else " | ") + "[" + ch + "]")
            if any(k for k in node[ch]):
                out.append(" (")
                visit(node[ch])
                out.append(")")
            else:
                out.append(" " + char_rule + "+")
        if children:
            out.append(' | [^"' + "".join(children) + "] " + char_rule + "*")

    visit(root)
    out.append(" )" + ("" if "" in root else "?") + ' ["]')
    return "".join(out)


class SchemaConverter:
    """common_chat_schema_converter: rules by name, shared by every schema and rule added."""

    def __init__(self, dotall: bool = False, rules: dict | None = None):
        self.dotall = dotall
        self.rules: dict[str, str] = {} if rules is None else rules
        self.rules["space"] = SPACE_RULE
        self.refs_being_resolved: set[str] = set()
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def add_rule(self, name: str, rule: str) -> str:
        esc_name = INVALID_RULE_CHARS_RE.sub("-", name)
        if esc_name not in self.rules or self.rules[esc_name] == rule:
            self.rules[esc_name] = rule
            return esc_name
        i = 0
        while esc_name + str(i) in self.rules and self.rules[esc_name + str(i)] != rule:
            i += 1
        self.rules[esc_name + str(i)] = rule
        return esc_name + str(i)

    def add_schema(self, name: str, schema) -> str:
        """The rule for `schema` (a Schema node, or JSON parsed here) named after `name`."""
        node = schema if isinstance(schema, Schema) else parse_schema(schema).root
        try:
            return self.visit(node, name)
        except ConversionError as e:
            raise SchemaError(str(e)) from None

    def check_errors(self) -> None:
        if self.errors:
            raise SchemaError("JSON schema conversion failed:\n" + "\n".join(self.errors))

    def _add_primitive(self, name: str, rule: tuple) -> str:
        n = self.add_rule(name, rule[0])
        for dep in rule[1]:
            dep_rule = PRIMITIVE_RULES.get(dep) or STRING_FORMAT_RULES.get(dep)
            if dep_rule is None:
                self.errors.append("Rule " + dep + " not known")
                continue
            if dep not in self.rules:
                self._add_primitive(dep, dep_rule)
        return n

    def _visit_primitive(self, rule_name: str, type_: str) -> str:
        return self._add_primitive("root" if rule_name == "root" else type_, PRIMITIVE_RULES[type_])

    def _visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self.rules)
        try:
            return pattern_to_rule(pattern, name, self.add_rule, self.dotall)
        except UnsupportedPattern as err:
            self.rules.clear()
            self.rules.update(snapshot)
            self.warnings.append(f"pattern {pattern} is not supported ({err}), accepting any string")
            return self.add_rule(name, self._add_primitive("string", PRIMITIVE_RULES["string"]))
        except InvalidPattern as err:
            self.rules.clear()
            self.rules.update(snapshot)
            self.errors.append(f"Invalid pattern {pattern}: {err}")
            return ""

    def _resolve_ref(self, schema: RefSchema) -> str:
        ref_fragment = schema.ref[schema.ref.find("#") + 1:]
        ref_name = "ref" + INVALID_RULE_CHARS_RE.sub("-", ref_fragment)
        if ref_name not in self.rules and schema.ref not in self.refs_being_resolved:
            if schema.target is None:
                self.errors.append("Unresolved $ref " + schema.ref)
                return ""
            self.refs_being_resolved.add(schema.ref)
            ref_name = self.visit(schema.target, ref_name)
            self.refs_being_resolved.discard(schema.ref)
        return ref_name

    def _build_object_rule(self, properties: list, required: set, name: str,
                           additional: Schema | None) -> str:
        dash = "-" if name else ""
        required_props, optional_props, prop_names = [], [], []
        kv_rule_names: dict[str, str] = {}
        for prop_name, prop_schema in properties:
            prop_rule_name = self.visit(prop_schema, name + dash + prop_name)
            kv_rule_names[prop_name] = self.add_rule(
                name + dash + prop_name + "-kv",
                format_literal(dump_json(prop_name)) + ' space ":" space ' + prop_rule_name)
            (required_props if prop_name in required else optional_props).append(prop_name)
            prop_names.append(prop_name)
        if additional is not None:
            sub_name = name + dash + "additional"
            if additional.kind != "any":
                value_rule = self.visit(additional, sub_name + "-value")
            else:
                value_rule = self._add_primitive("value", PRIMITIVE_RULES["value"])
            if prop_names:
                char_rule = self._add_primitive("char", PRIMITIVE_RULES["char"])
                key_rule = self.add_rule(sub_name + "-k", _not_strings(prop_names, char_rule))
            else:
                key_rule = self._add_primitive("string", PRIMITIVE_RULES["string"])
            kv_rule_names["*"] = self.add_rule(sub_name + "-kv", key_rule + ' ":" space ' + value_rule)
            optional_props.append("*")
        if not required_props and not optional_props:
            return '"{" space "}"'

        rule = '"{" space ' + ' "," space '.join(kv_rule_names[k] for k in required_props)
        if optional_props:
            rule += " (" + (' "," space ( ' if required_props else "")

            def recursive_refs(ks: list[str], first_is_optional: bool) -> str:
                kv_rule_name = kv_rule_names[ks[0]]
                comma_ref = '( "," space ' + kv_rule_name + " )"
                if first_is_optional:
                    res = comma_ref + ("*" if ks[0] == "*" else "?")
                else:
                    res = kv_rule_name + (" " + comma_ref + "*" if ks[0] == "*" else "")
                if len(ks) > 1:
                    res += " " + self.add_rule(name + dash + ks[0] + "-rest", recursive_refs(ks[1:], True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], False) for i in range(len(optional_props)))
            rule += (" )" if required_props else "") + " )?"
        return rule + ' space "}"'

    def _visit_all_of(self, schema: AllOfSchema, name: str, rule_name: str) -> str:
        required, properties, enum_values = set(), [], {}

        def add_component(comp: Schema, is_required: bool) -> None:
            if comp.kind == "ref":
                if comp.target is not None:
                    add_component(comp.target, is_required)
            elif comp.kind == "object":
                for prop in comp.properties:
                    properties.append((prop.name, prop.schema))
                    if is_required:
                        required.add(prop.name)
            elif comp.kind == "enum":
                for v in comp.values:
                    literal = format_literal(dump_json(v))
                    enum_values[literal] = enum_values.get(literal, 0) + 1

        for child in schema.children:
            if child.kind == "anyOf":
                for alt in child.children:
                    add_component(alt, False)
            else:
                add_component(child, True)
        intersection = [v for v in sorted(enum_values) if enum_values[v] == len(schema.children)]
        if intersection:
            return self.add_rule(rule_name, "(" + " | ".join(intersection) + ")")
        return self.add_rule(rule_name, self._build_object_rule(properties, required, name, None))

    def visit(self, schema: Schema, name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else (name or "root")
        sub_name = name + ("-" if name else "")
        kind = schema.kind
        if kind == "ref":
            return self.add_rule(rule_name, self._resolve_ref(schema))
        if kind == "anyOf":
            alt_name = name + ("-" if name else "alternative-")
            return self.add_rule(rule_name, " | ".join(self.visit(alt, alt_name + str(i))
                                                        for i, alt in enumerate(schema.children)))
        if kind == "allOf":
            return self._visit_all_of(schema, name, rule_name)
        if kind == "const":
            return self.add_rule(rule_name, format_literal(dump_json(schema.value)))
        if kind == "enum":
            values = [format_literal(dump_json(v)) for v in schema.values]
            return self.add_rule(rule_name, "(" + " | ".join(values) + ")")
        if kind == "object":
            extra = schema.additional_properties
            if not schema.properties and extra is not None and extra.kind == "any":
                return self.add_rule(rule_name, self._add_primitive("object", PRIMITIVE_RULES["object"]))
            properties = [(p.name, p.schema) for p in schema.properties]
            required = {p.name for p in schema.properties if p.required}
            return self.add_rule(rule_name, self._build_object_rule(properties, required, name, extra))
        if kind == "tuple":
            items = ' "," space '.join(self.visit(item, sub_name + "tuple-" + str(i))
                                       for i, item in enumerate(schema.items))
            return self.add_rule(rule_name, '"[" space ' + items + ' space "]"')
        if kind == "array":
            if schema.items.kind == "any" and schema.min_items == 0 and schema.max_items < 0:
                return self._visit_primitive(rule_name, "array")
            item_rule_name = self.visit(schema.items, sub_name + "item")
            max_items = INT_MAX if schema.max_items < 0 else schema.max_items
            return self.add_rule(rule_name, '"[" space ' + build_repetition(
                item_rule_name, schema.min_items, max_items, '"," space') + ' space "]"')
        if kind == "string":
            return self._visit_string(schema, rule_name)
        if kind == "integer":
            if schema.minimum == INT64_MIN and schema.maximum == INT64_MAX:
                return self._visit_primitive(rule_name, "integer")
            out = ["("]
            build_min_max_int(schema.minimum, schema.maximum, out)
            return self.add_rule(rule_name, "".join(out) + ")")
        if kind in ("number", "boolean", "null"):
            return self._visit_primitive(rule_name, kind)
        return self.add_rule(rule_name, self._add_primitive("value", PRIMITIVE_RULES["value"]))

    def _visit_string(self, schema: StringSchema, rule_name: str) -> str:
        if schema.pattern:
            return self._visit_pattern(schema.pattern, rule_name)
        if schema.format == "uuid":
            return self._visit_primitive(rule_name, "uuid")
        if schema.format:
            prim_name = schema.format + "-string"
            return self.add_rule(rule_name, self._add_primitive(prim_name, STRING_FORMAT_RULES[prim_name]))
        if schema.min_length > 0 or schema.max_length >= 0:
            char_rule = self._add_primitive("char", PRIMITIVE_RULES["char"])
            max_len = INT_MAX if schema.max_length < 0 else schema.max_length
            chars = build_repetition(char_rule, schema.min_length, max_len)
            return self.add_rule(rule_name, '"\\"" ' + chars + ' "\\""')
        return self._visit_primitive(rule_name, "string")


# ---- entry points -------------------------------------------------------------------------------

def format_grammar(rules: dict) -> str:
    """Rules as GBNF text, sorted by name as the converter's std::map keeps them."""
    return "".join(f"{name} ::= {rules[name]}\n" for name in sorted(rules))


def to_grammar(schema: dict | bool, *, prefix: str = "") -> str:
    """json_schema_to_grammar(schema): the GBNF text llama.cpp gives a JSON schema. A prefix names
    the schema's rules after it, as add_schema(prefix, schema) does, instead of root."""
    try:
        doc = parse_schema(schema)
        converter = SchemaConverter()
        converter.visit(doc.root, prefix)
    except (SchemaError, ConversionError) as e:
        raise SchemaError("JSON schema conversion failed:\n" + str(e)) from None
    converter.check_errors()
    return format_grammar(converter.rules)


class GrammarBuilder:
    """common_grammar_builder: what build_grammar's callback adds rules and schemas with."""

    def __init__(self, converter: SchemaConverter):
        self.converter = converter

    def add_rule(self, name: str, rule: str) -> str:
        return self.converter.add_rule(name, rule)

    def add_schema(self, name: str, schema) -> str:
        """The rule for a schema (a Schema node, or JSON); "root" names the schema's rule root."""
        return self.converter.add_schema("" if name == "root" else name, schema)


def build_grammar(callback: Callable[[GrammarBuilder], None], dotall: bool = False) -> str:
    """build_grammar(cb, options): one converter for every rule and schema the callback adds."""
    converter = SchemaConverter(dotall)
    callback(GrammarBuilder(converter))
    converter.check_errors()
    return format_grammar(converter.rules)


def add_schema(rules: dict, name: str, schema) -> str:
    """GrammarBuilder.add_schema into `rules` (rule name -> text; "space" is added): returns the
    schema's rule name, raises SchemaError as build_grammar's check would."""
    converter = SchemaConverter(rules=rules)
    rule_name = GrammarBuilder(converter).add_schema(name, schema)
    converter.check_errors()
    return rule_name
