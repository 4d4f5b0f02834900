"""GBNF text that knows nothing of JSON schemas: literals, repetitions, integer ranges and regex
patterns, as common/json-schema-to-grammar.cpp (llama.cpp b11434) writes them.

A pattern is read byte by byte, as the C++ reads a std::string: a regex char is one UTF-8 byte.
"""
from __future__ import annotations

import re

INT_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
MAX_PATTERN_DEPTH = 100

GRAMMAR_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')
GRAMMAR_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "-": "\\-", "]": "\\]", "\\": "\\\\"}
NON_LITERAL_SET = set("|.()[]{}*+?^$")
ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = set("^$.[]()|{}*+?")
HEX_DIGITS = set("0123456789abcdefABCDEF")


def format_literal(literal: str) -> str:
    """gbnf_format_literal: a quoted GBNF literal."""
    return '"' + GRAMMAR_LITERAL_ESCAPE_RE.sub(lambda m: GRAMMAR_LITERAL_ESCAPES[m.group()], literal) + '"'


def build_repetition(item_rule: str, min_items: int, max_items: int, separator_rule: str = "") -> str:
    has_max = max_items != INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item_rule + "?"
    if not separator_rule:
        if min_items == 1 and not has_max:
            return item_rule + "+"
        if min_items == 0 and not has_max:
            return item_rule + "*"
        return item_rule + "{" + str(min_items) + "," + (str(max_items) if has_max else "") + "}"
    result = item_rule + " " + build_repetition("(" + separator_rule + " " + item_rule + ")",
                                                0 if min_items == 0 else min_items - 1,
                                                max_items - 1 if has_max else max_items)
    if min_items == 0:
        result = "(" + result + ")?"
    return result


# ---- integer ranges ----------------------------------------------------------------------------

def _digit_range(out: list, lo: str, hi: str) -> None:
    out.append("[" + (lo if lo == hi else lo + "-" + hi) + "]")


def _more_digits(out: list, min_digits: int, max_digits: int) -> None:
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append("{" + str(min_digits))
    if max_digits != min_digits:
        out.append("," + (str(max_digits) if max_digits != INT_MAX else ""))
    out.append("}")


def _uniform_range(out: list, lo: str, hi: str) -> None:
    """Digit strings of one length from `lo` to `hi`."""
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    if i > 0:
        out.append('"' + lo[:i] + '"')
    if not (i < len(lo) and i < len(hi)):
        return
    if i > 0:
        out.append(" ")
    sub_len = len(lo) - i - 1
    if sub_len <= 0:
        out.append("[" + lo[i] + "-" + hi[i] + "]")
        return
    lo_sub, hi_sub = lo[i + 1:], hi[i + 1:]
    sub_zeros, sub_nines = "0" * sub_len, "9" * sub_len
    to_reached = False
    out.append("(")
    if lo_sub == sub_zeros:
        _digit_range(out, lo[i], chr(ord(hi[i]) - 1))
        out.append(" ")
        _more_digits(out, sub_len, sub_len)
    else:
        out.append("[" + lo[i] + "] (")
        _uniform_range(out, lo_sub, sub_nines)
        out.append(")")
        if ord(lo[i]) < ord(hi[i]) - 1:
            out.append(" | ")
            if hi_sub == sub_nines:
                _digit_range(out, chr(ord(lo[i]) + 1), hi[i])
                to_reached = True
            else:
                _digit_range(out, chr(ord(lo[i]) + 1), chr(ord(hi[i]) - 1))
            out.append(" ")
            _more_digits(out, sub_len, sub_len)
    if not to_reached:
        out.append(" | ")
        _digit_range(out, hi[i], hi[i])
        out.append(" ")
        _uniform_range(out, sub_zeros, hi_sub)
    out.append(")")


class ConversionError(RuntimeError):
    """A std::runtime_error of the converter, which json_schema_to_grammar reports as a failure."""


def _neg(v: int) -> int:
    """-v on int64_t, where -INT64_MIN wraps to itself."""
    return INT64_MIN if v == INT64_MIN else -v


def build_min_max_int(min_value: int, max_value: int, out: list, decimals_left: int = 16,
                      top_level: bool = True) -> None:
    """Integers in [min_value, max_value]; INT64_MIN / INT64_MAX stand for no bound."""
    has_min, has_max = min_value != INT64_MIN, max_value != INT64_MAX
    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            build_min_max_int(_neg(max_value), _neg(min_value), out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            build_min_max_int(0, _neg(min_value), out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            _uniform_range(out, min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        _uniform_range(out, min_s, max_s)
        return

    less_decimals = max(decimals_left - 1, 1)
    if has_min:
        if min_value < 0:
            out.append('"-" (')
            build_min_max_int(INT64_MIN, _neg(min_value), out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            _more_digits(out, 0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                _more_digits(out, 0, less_decimals)
            else:
                _more_digits(out, 1, decimals_left)
        elif min_value <= 9:
            c = chr(ord("0") + min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                _digit_range(out, range_start, chr(ord(c) - 1))
                out.append(" ")
                _more_digits(out, 1, less_decimals)
                out.append(" | ")
            _digit_range(out, c, "9")
            out.append(" ")
            _more_digits(out, 0, less_decimals)
        else:
            min_s = str(min_value)
            c = min_s[0]
            if c > "1":
                _digit_range(out, "1" if top_level else "0", chr(ord(c) - 1))
                out.append(" ")
                _more_digits(out, len(min_s), less_decimals)
                out.append(" | ")
            _digit_range(out, c, c)
            out.append(" (")
            build_min_max_int(int(min_s[1:]), INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                _digit_range(out, chr(ord(c) + 1), "9")
                out.append(" ")
                _more_digits(out, len(min_s) - 1, less_decimals)
        return

    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                _more_digits(out, 0, less_decimals)
                out.append(" | ")
            build_min_max_int(0, max_value, out, decimals_left, True)
        else:
            out.append('"-" (')
            build_min_max_int(_neg(max_value), INT64_MAX, out, decimals_left, False)
            out.append(")")
        return
    raise ConversionError("At least one of min_value or max_value must be set")


# ---- regex patterns ----------------------------------------------------------------------------

class UnsupportedPattern(RuntimeError):
    """A valid regex with no grammar equivalent: the string is left unconstrained."""


class InvalidPattern(RuntimeError):
    """Not a valid regex: the conversion fails."""


def gbnf_escape_length(pattern: str, pos: int) -> int:
    """Length of the GBNF escape at `pos`, 0 if none (parse_char() in src/llama-grammar.cpp)."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    nxt = pattern[pos + 1]
    if nxt in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(nxt)
    if n_hex is None or pos + 2 + n_hex > len(pattern):
        return 0
    if any(h not in HEX_DIGITS for h in pattern[pos + 2:pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


def _stoi(s: str) -> int:
    """std::stoi: leading blanks, a sign, digits; ValueError where it throws."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", s)
    if not m or not -2**31 <= int(m.group(1)) <= INT_MAX:
        raise ValueError(s)
    return int(m.group(1))


def _bytes(s: str) -> str:
    return s.encode("utf-8", "surrogateescape").decode("latin-1")


def _text(s: str) -> str:
    return s.encode("latin-1").decode("utf-8", "surrogateescape")


def pattern_to_rule(pattern: str, name: str, add_rule, dotall: bool) -> str:
    """_pattern_to_rule: the rule for a JSON string matching an anchored regex; raises
    UnsupportedPattern or InvalidPattern. `add_rule(name, rule)` adds a rule and returns its name."""
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        raise UnsupportedPattern("not anchored with '^' and '$'")
    sub = _bytes(pattern)[1:-1]
    length = len(sub)
    sub_rule_ids: dict[str, str] = {}
    pos, paren_depth = 0, 0

    def to_rule(ls: tuple[str, bool]) -> str:
        return '"' + ls[0] + '"' if ls[1] else ls[0]

    def get_dot() -> str:
        return add_rule("dot", "[\\U00000000-\\U0010FFFF]" if dotall else "[^\\x0A\\x0D]")

    def join_seq(seq: list) -> tuple[str, bool]:
        """Joins the sequence, merging consecutive literals together."""
        ret, literal = [], ""
        for item in seq:
            if item[1]:
                literal += item[0]
                continue
            if literal:
                ret.append((literal, True))
                literal = ""
            ret.append(item)
        if literal:
            ret.append((literal, True))
        return " ".join(to_rule(item) for item in ret), False

    def transform() -> tuple[str, bool]:
        nonlocal pos, paren_depth
        seq: list[tuple[str, bool]] = []
        while pos < length:
            c = sub[pos]
            if c == ".":
                seq.append((get_dot(), False))
                pos += 1
            elif c == "(":
                pos += 1
                if pos < length and sub[pos] == "?":
                    if pos + 1 < length and sub[pos + 1] == ":":
                        pos += 2  # non-capturing group, taken as a plain group
                    else:
                        raise UnsupportedPattern("unsupported group syntax")
                paren_depth += 1
                if paren_depth > MAX_PATTERN_DEPTH:
                    raise UnsupportedPattern("pattern nesting too deep")
                seq.append(("(" + to_rule(transform()) + ")", False))
            elif c == ")":
                pos += 1
                if paren_depth == 0:
                    raise InvalidPattern("unbalanced parentheses")
                paren_depth -= 1
                return join_seq(seq)
            elif c in "^$":
                raise UnsupportedPattern("anchor inside the pattern")
            elif c == "[":
                seq.append((_char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                pos += 1
            elif c in "*+?":
                if not seq:
                    raise InvalidPattern("nothing to repeat")
                seq[-1] = (to_rule(seq[-1]) + c, False)
                pos += 1
            elif c == "{":
                _curly_brackets(seq)
            else:
                seq.append((_literal(c), True))
        return join_seq(seq)

    def _char_class() -> str:
        nonlocal pos
        out = "["
        pos += 1
        while pos < length and sub[pos] != "]":
            if sub[pos] == "\\":
                n = gbnf_escape_length(sub, pos)
                if n == 0:
                    escape = _text(sub[pos:pos + 2])
                    raise UnsupportedPattern("unsupported escape in character class: " + escape)
                out += sub[pos:pos + n]
                pos += n
            else:
                out += sub[pos]
                pos += 1
        if pos >= length:
            raise InvalidPattern("unterminated character class")
        pos += 1
        return out + "]"

    def _curly_brackets(seq: list) -> None:
        nonlocal pos
        start = pos + 1
        pos += 1
        while pos < length and sub[pos] != "}":
            pos += 1
        if pos >= length:
            raise UnsupportedPattern("unterminated curly brackets")
        nums = sub[start:pos].split(",")
        pos += 1
        min_times, max_times = 0, INT_MAX
        if len(nums) not in (1, 2):
            raise UnsupportedPattern("wrong number of values in curly brackets")
        try:
            if len(nums) == 1:
                min_times = max_times = _stoi(nums[0])
            else:
                if nums[0]:
                    min_times = _stoi(nums[0])
                if nums[1]:
                    max_times = _stoi(nums[1])
        except ValueError:
            raise UnsupportedPattern("invalid number in curly brackets") from None
        if not seq:
            raise InvalidPattern("nothing to repeat")
        item, is_literal = seq[-1]
        if not is_literal:
            sub_rule_ids.setdefault(item, "")
            if not sub_rule_ids[item]:
                sub_rule_ids[item] = add_rule(name + "-" + str(len(sub_rule_ids)), _text(item))
            item = sub_rule_ids[item]
        item = '"' + item + '"' if is_literal else item
        seq[-1] = (build_repetition(item, min_times, max_times, ""), False)

    def _literal(c: str) -> str:
        nonlocal pos
        literal = ""
        while pos < length:
            if sub[pos] == "\\":
                if pos == length - 1:
                    raise InvalidPattern("trailing backslash")
                if sub[pos + 1] in ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                    literal += sub[pos + 1]
                    pos += 2
                else:
                    n = gbnf_escape_length(sub, pos)
                    if n == 0:
                        raise UnsupportedPattern("unsupported escape: " + _text(sub[pos:pos + 2]))
                    literal += sub[pos:pos + n]
                    pos += n
            elif sub[pos] == '"':
                literal += '\\"'
                pos += 1
            elif sub[pos] not in NON_LITERAL_SET and (pos == length - 1 or not literal or sub[pos + 1] == "."
                                                      or sub[pos + 1] not in NON_LITERAL_SET):
                literal += sub[pos]
                pos += 1
            else:
                break
        if not literal:  # nothing was consumed, ex. a stray ']' or '}'
            raise UnsupportedPattern("unsupported character: " + _text(c))
        return literal

    rule = to_rule(transform())
    if paren_depth != 0:
        raise InvalidPattern("unbalanced parentheses")
    return add_rule(name, _text('"\\"" (' + rule + ') "\\""'))
