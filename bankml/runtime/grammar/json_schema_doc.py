"""The parsed JSON schema document, as llama.cpp b11434 builds it (common/json-schema.h,
common/json-schema.cpp): a tree of typed nodes, which json_schema.py (common/json-schema-to-grammar.cpp)
turns into GBNF rules.

    doc = parse_schema({"type": "integer", "minimum": 0})   # common_chat_schema_from_json(schema)
    doc.root                                                 # IntegerSchema(minimum=0, maximum=INT64_MAX)

A JSON value is what json.loads gives (dict, list, str, int, float, bool, None); an int outside
int64/uint64 is a double, as nlohmann reads it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import ClassVar, NoReturn

from bankml.errors import BankmlError
from bankml.runtime.grammar.json_schema_pattern import INT64_MAX, INT64_MIN


class SchemaError(BankmlError, ValueError):
    """A schema llama.cpp refuses; the message is its exception text (e.what())."""


# ---- JSON as nlohmann::ordered_json sees it -----------------------------------------------------

def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**64


def _is_number(v) -> bool:
    return is_int(v) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _wrap(v: int, bits: int) -> int:
    """A C++ cast to a signed integer of `bits` bits."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


# ---- the schema document (common/json-schema.h) -------------------------------------------------

@dataclass(eq=False)
class Schema:
    kind: ClassVar[str] = "?"


@dataclass(eq=False)
class AnySchema(Schema):
    kind: ClassVar[str] = "any"


@dataclass(eq=False)
class RefSchema(Schema):
    """{"$ref": "#/..."}: only references into the same document."""
    kind: ClassVar[str] = "ref"
    ref: str
    target: Schema | None = field(default=None, repr=False)


@dataclass(eq=False)
class AnyOfSchema(Schema):
    """oneOf / anyOf, or a "type" array expanded to one alternative per type."""
    kind: ClassVar[str] = "anyOf"
    children: list = field(default_factory=list)


@dataclass(eq=False)
class AllOfSchema(Schema):
    kind: ClassVar[str] = "allOf"
    children: list = field(default_factory=list)


@dataclass(eq=False)
class ConstSchema(Schema):
    kind: ClassVar[str] = "const"
    value: object = None


@dataclass(eq=False)
class EnumSchema(Schema):
    kind: ClassVar[str] = "enum"
    values: list = field(default_factory=list)


@dataclass(eq=False)
class NullSchema(Schema):
    kind: ClassVar[str] = "null"


@dataclass(eq=False)
class BooleanSchema(Schema):
    kind: ClassVar[str] = "boolean"


@dataclass(eq=False)
class NumberSchema(Schema):
    kind: ClassVar[str] = "number"


@dataclass(eq=False)
class IntegerSchema(Schema):
    """Inclusive bounds, exclusiveMinimum / exclusiveMaximum folded in; INT64_MIN/MAX: unbounded."""
    kind: ClassVar[str] = "integer"
    minimum: int = INT64_MIN
    maximum: int = INT64_MAX


@dataclass(eq=False)
class StringSchema(Schema):
    kind: ClassVar[str] = "string"
    pattern: str = ""       # empty when absent
    format: str = ""        # "" | "uuid" | "date" | "time" | "date-time"
    min_length: int = 0
    max_length: int = -1    # -1 for unbounded


@dataclass(eq=False)
class ArraySchema(Schema):
    kind: ClassVar[str] = "array"
    items: Schema = field(default_factory=AnySchema)
    min_items: int = 0
    max_items: int = -1     # -1 for unbounded


@dataclass(eq=False)
class TupleSchema(Schema):
    kind: ClassVar[str] = "tuple"
    items: list = field(default_factory=list)


@dataclass(eq=False)
class Property:
    name: str
    schema: Schema
    required: bool = False


@dataclass(eq=False)
class ObjectSchema(Schema):
    kind: ClassVar[str] = "object"
    properties: list = field(default_factory=list)        # Property, in schema order
    additional_properties: Schema | None = None           # None when not allowed


@dataclass(eq=False)
class Document:
    root: Schema
    refs: dict = field(default_factory=dict)


# ---- JSON to document (common/json-schema.cpp) ------------------------------------------------------

def _fail(path: str, msg: str) -> NoReturn:
    raise SchemaError("JSON schema error at " + path + ": " + msg)


def _get_count(schema: dict, key: str, path: str, default: int) -> int:
    if key not in schema:
        return default
    value = schema[key]
    if not is_int(value) or _wrap(value, 32) < 0:
        _fail(path, key + " must be a non-negative integer")
    return _wrap(value, 32)


def _get_bound(schema: dict, key: str, path: str, round_up: bool) -> int:
    """A fractional bound is rounded inwards, towards the integers it still admits."""
    value = schema[key]
    if is_int(value):
        return _wrap(value, 64)
    if not _is_number(value):
        _fail(path, key + " must be a number")
    d = (math.ceil if round_up else math.floor)(value) if math.isfinite(value) else None
    return d if d is not None and INT64_MIN <= d <= INT64_MAX else INT64_MIN  # cvttsd2si


def _get_format(schema: dict, path: str) -> str:
    if "format" not in schema:
        return ""
    fmt = schema["format"]
    if not isinstance(fmt, str):
        _fail(path, "format must be a string")
    if fmt in ("date", "time", "date-time"):
        return fmt
    if fmt == "uuid" or (len(fmt.encode()) == 5 and fmt[:4] == "uuid" and "1" <= fmt[4] <= "5"):
        return "uuid"
    return ""


def _stoull(s: str) -> int | None:
    """std::stoull; None where it throws."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)", s)
    if not m or int(m.group(2)) >= 2**64:
        return None
    return (-int(m.group(2)) if m.group(1) == "-" else int(m.group(2))) % 2**64


class _DocumentBuilder:
    def __init__(self, root):
        self.root = root
        self.refs: dict[str, Schema | None] = {}
        self.pending: list[RefSchema] = []  # ref nodes get their target once every $ref is built

    def build(self) -> Document:
        node = self.build_node(self.root, "#")
        doc = Document(node, dict(sorted(self.refs.items())))
        for ref in self.pending:
            ref.target = doc.refs[ref.ref]
        return doc

    def resolve_ref(self, ref: str, path: str):
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = _stoull(sel)
                if idx is None or idx >= len(target):
                    _fail(path, "cannot resolve $ref " + ref + ", " + sel + " is out of range")
                target = target[idx]
            else:
                _fail(path, "cannot resolve $ref " + ref + ", " + sel + " not found")
        return target

    def build_ref(self, value, path: str) -> Schema:
        if not isinstance(value, str):
            _fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            _fail(path, "unsupported $ref " + value + ", only references into the same document are "
                  "supported")
        if value not in self.refs:
            self.refs[value] = None  # reserve the key first, so that a cycle back to this $ref stops here
            self.refs[value] = self.build_node(self.resolve_ref(value, path), value)
        node = RefSchema(value)
        self.pending.append(node)
        return node

    def build_alternatives(self, cls, alts, path: str) -> Schema:
        if not isinstance(alts, list):
            _fail(path, "must be an array of schemas")
        if not alts:
            _fail(path, "must not be empty")
        return cls([self.build_node(alt, path + "/" + str(i)) for i, alt in enumerate(alts)])

    def build_object(self, schema: dict, path: str) -> Schema:
        node = ObjectSchema()
        required = set()
        if isinstance(schema.get("required"), list):
            required = {name for name in schema["required"] if isinstance(name, str)}
        if "properties" in schema:
            properties = schema["properties"]
            if not isinstance(properties, dict):
                _fail(path, "properties must be an object")
            for name, prop in properties.items():
                node.properties.append(Property(name, self.build_node(prop, path + "/properties/" + name),
                                                name in required))
        if "additionalProperties" in schema:
            additional = schema["additionalProperties"]
            if isinstance(additional, bool):
                node.additional_properties = AnySchema() if additional else None
            elif isinstance(additional, dict):
                node.additional_properties = self.build_node(additional, path + "/additionalProperties")
            else:
                _fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional_properties = AnySchema()  # {"type": "object"} on its own accepts any object
        return node

    def build_array(self, schema: dict, path: str) -> Schema:
        node = ArraySchema()
        if "items" in schema or "prefixItems" in schema:
            # "items" wins when both are present; a schema instead of an array is the item schema
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                return TupleSchema([self.build_node(item, path + "/" + key + "/" + str(i))
                                    for i, item in enumerate(items)])
            node.items = self.build_node(items, path + "/" + key)
        node.min_items = _get_count(schema, "minItems", path, 0)
        node.max_items = _get_count(schema, "maxItems", path, -1)
        return node

    def build_string(self, schema: dict, path: str) -> Schema:
        node = StringSchema()
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                _fail(path, "pattern must be a string")
            node.pattern = schema["pattern"]
        node.format = _get_format(schema, path)
        node.min_length = _get_count(schema, "minLength", path, 0)
        node.max_length = _get_count(schema, "maxLength", path, -1)
        return node

    def build_integer(self, schema: dict, path: str) -> Schema:
        node = IntegerSchema()
        if "minimum" in schema:
            node.minimum = _get_bound(schema, "minimum", path, True)
        elif "exclusiveMinimum" in schema:
            node.minimum = _wrap(_get_bound(schema, "exclusiveMinimum", path, False) + 1, 64)
        if "maximum" in schema:
            node.maximum = _get_bound(schema, "maximum", path, False)
        elif "exclusiveMaximum" in schema:
            node.maximum = _wrap(_get_bound(schema, "exclusiveMaximum", path, True) - 1, 64)
        return node

    def build_node(self, schema, path: str) -> Schema:
        if not isinstance(schema, dict):
            _fail(path, "schema must be an object")
        if "$ref" in schema:
            return self.build_ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self.build_alternatives(AnyOfSchema, schema[key], path + "/" + key)
        type_ = schema.get("type")
        if isinstance(type_, list):
            # {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}
            if not type_:
                _fail(path, "type must not be empty")
            return AnyOfSchema([self.build_node({**schema, "type": t}, path + "/type/" + str(i))
                                for i, t in enumerate(type_)])
        if "const" in schema:
            return ConstSchema(schema["const"])
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                _fail(path, "enum must be a non-empty array")
            return EnumSchema(list(schema["enum"]))
        if type_ is not None and not isinstance(type_, str):
            _fail(path, "type must be a string or an array of strings")

        type_name = type_ or ""
        has_properties = "properties" in schema or ("additionalProperties" in schema
                                                    and schema["additionalProperties"] is not True)
        if not type_name:
            # without a type the structural keywords decide, in the same order as the converter
            if has_properties:
                return self.build_object(schema, path)
            if "allOf" in schema:
                return self.build_alternatives(AllOfSchema, schema["allOf"], path + "/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self.build_array(schema, path)
            if ("pattern" in schema or "minLength" in schema or "maxLength" in schema
                    or _get_format(schema, path)):
                return self.build_string(schema, path)
            return AnySchema()
        if type_name == "object":
            if not has_properties and "allOf" in schema:
                return self.build_alternatives(AllOfSchema, schema["allOf"], path + "/allOf")
            return self.build_object(schema, path)
        if type_name == "string":
            if "allOf" in schema:
                return self.build_alternatives(AllOfSchema, schema["allOf"], path + "/allOf")
            return self.build_string(schema, path)
        if type_name == "array":
            return self.build_array(schema, path)
        if type_name == "integer":
            return self.build_integer(schema, path)
        simple = {"number": NumberSchema, "boolean": BooleanSchema, "null": NullSchema}
        if type_name in simple:
            return simple[type_name]()
        _fail(path, "unrecognized type " + type_name)


def _normalized(v):
    """The value as nlohmann parses it: an int beyond 64 bits is a double."""
    if isinstance(v, dict):
        return {k: _normalized(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_normalized(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and not is_int(v):
        return float(v)
    return v


def parse_schema(schema) -> Document:
    """common_chat_schema_from_json; raises SchemaError("JSON schema error at <path>: ...")."""
    return _DocumentBuilder(_normalized(schema)).build()


def may_be_string(s: Schema, visited: set | None = None) -> bool:
    """Whether a value matching the schema may be a string, through any branch of it."""
    visited = set() if visited is None else visited
    if s.kind == "string":
        return True
    if s.kind == "const":
        return isinstance(s.value, str)
    if s.kind == "enum":
        return any(isinstance(v, str) for v in s.values)
    if s.kind == "ref":  # a cycle is taken as not a string, to be safe
        if s.target is None or id(s.target) in visited:
            return False
        visited.add(id(s.target))
        result = may_be_string(s.target, visited)
        visited.discard(id(s.target))
        return result
    if s.kind == "anyOf":
        return any(may_be_string(c, visited) for c in s.children)
    if s.kind == "allOf":  # every child must allow a string, an any child constrains nothing
        constraining = [c for c in s.children if c.kind != "any"]
        for c in constraining:
            if not may_be_string(c, visited):
                return False
        return bool(constraining)
    return False
