"""GBNF text to rules, as llama.cpp b11434 does it (src/llama-grammar.cpp): llama_grammar_parser
(parse, parse_rule, parse_alternates, parse_sequence and its repetition rewrite). The checks
llama_grammar_init_impl makes before it builds stacks (a root symbol, no left recursion) are load.py.

    p = Parser(tokenize=None)
    p.parse('root ::= "a"+')     # p.symbol_ids: name -> id; p.rules: id -> elements

A rule is a list of elements `(type, value)`, llama_grammar_element, ending in (END, 0); an
alternate starts after each (ALT, 0). The parser walks the grammar's UTF-8 bytes as llama.cpp walks
its C string: the text stops at its first NUL, and reading past the end reads NULs.
"""
from __future__ import annotations

from typing import Callable

from bankml.errors import BankmlError

# enum llama_gretype (src/llama-grammar.h)
END = 0             # end of rule definition
ALT = 1             # start of alternate definition for rule
RULE_REF = 2        # non-terminal element: reference to rule
CHAR = 3            # terminal element: character (code point)
CHAR_NOT = 4        # inverse char(s) ([^a], [^a-b] [^abc])
CHAR_RNG_UPPER = 5  # modifies a preceding CHAR or CHAR_ALT to be an inclusive range ([a-z])
CHAR_ALT = 6        # modifies a preceding CHAR or CHAR_RNG_UPPER to add an alternate char ([ab], [a-zA])
CHAR_ANY = 7        # any character (.)
TOKEN = 8           # terminal element: token (<[token-id]>)
TOKEN_NOT = 9       # inverse token (!<[token-id]>)

MAX_REPETITION_THRESHOLD = 2000
UINT64_MAX = (1 << 64) - 1

Element = tuple[int, int]
Tokenize = Callable[[str], list[int]]   # llama_vocab::tokenize(text, add_special=false, parse_special=true)


class GrammarError(BankmlError, ValueError):
    """A grammar llama.cpp refuses (llama_sampler_init_grammar returns NULL), or a token it does not
    accept. The message is one line; `what` keeps llama.cpp's full error text (parser errors quote
    the rest of the grammar, newlines and all)."""

    def __init__(self, message: str, what: str | None = None):
        self.what = message if what is None else what
        super().__init__(message)


class _Fail(Exception):
    """std::runtime_error inside llama_grammar_parser::parse; caught there."""


# ---------------------------------------------------------------- helpers (on bytes, as the C++ reads them)

NUL = "\0"     # the source is held as latin-1, one char per byte, ending in NULs


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _is_word(c: str) -> bool:
    return "a" <= c <= "z" or "A" <= c <= "Z" or c == "-" or _is_digit(c)


def _decode_utf8(s: str, pos: int) -> tuple[int, int]:
    """decode_utf8(const char *): one code point; assumes valid UTF-8 but stops at a NUL."""
    first = ord(s[pos])
    n = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[first >> 4]
    value = first & ((1 << (8 - n)) - 1)
    end, pos = pos + n, pos + 1
    while pos < end and s[pos] != NUL:
        value = (value << 6) + (ord(s[pos]) & 0x3F)
        pos += 1
    return value, pos


def _stoull(digits: str, fn: str) -> int:
    """std::stoull / std::stoul (64-bit) of a run of digits: out_of_range's what() is the name."""
    value = int(digits)
    if value > UINT64_MAX:
        raise _Fail(fn)
    return value


class Parser:
    """llama_grammar_parser: `symbol_ids` (name -> id) and `rules` (id -> elements; [] = undefined)."""

    def __init__(self, tokenize: Tokenize | None = None):
        self.tokenize = tokenize
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[list[Element]] = []
        self.s = ""

    def rest(self, pos: int) -> str:
        """`std::string(...) + src`: the text from pos to the end."""
        return self.s[pos:self.s.index(NUL, pos)].encode("latin-1").decode("utf-8", "replace")

    def parse_space(self, pos: int, newline_ok: bool) -> int:
        s = self.s
        while s[pos] in " \t#" or (newline_ok and s[pos] in "\r\n"):
            if s[pos] == "#":                                   # comment to the end of the line
                while s[pos] not in "\0\r\n":
                    pos += 1
            else:
                pos += 1
        return pos

    def parse_name(self, pos: int) -> int:
        start = pos
        while _is_word(self.s[pos]):
            pos += 1
        if pos == start:
            raise _Fail("expecting name at " + self.rest(start))
        return pos

    def parse_int(self, pos: int) -> int:
        start = pos
        while _is_digit(self.s[pos]):
            pos += 1
        if pos == start:
            raise _Fail("expecting integer at " + self.rest(start))
        return pos

    def parse_hex(self, pos: int, size: int) -> tuple[int, int]:
        s, start, end, value = self.s, pos, pos + size, 0
        while pos < end and s[pos] != NUL:
            c = s[pos]
            value <<= 4
            if "a" <= c <= "f":
                value += ord(c) - ord("a") + 10
            elif "A" <= c <= "F":
                value += ord(c) - ord("A") + 10
            elif _is_digit(c):
                value += ord(c) - ord("0")
            else:
                break
            pos += 1
        if pos != end:
            raise _Fail(f"expecting {size} hex chars at " + self.rest(start))
        return value, pos

    def parse_char(self, pos: int) -> tuple[int, int]:
        s = self.s
        if s[pos] == "\\":
            esc = s[pos + 1]
            if esc in ("x", "u", "U"):
                return self.parse_hex(pos + 2, {"x": 2, "u": 4, "U": 8}[esc])
            if esc in ("t", "r", "n"):
                return {"t": 9, "r": 13, "n": 10}[esc], pos + 2
            if esc in ("\\", '"', "[", "]", "-"):
                return ord(esc), pos + 2
            raise _Fail("unknown escape at " + self.rest(pos))
        if s[pos] != NUL:
            return _decode_utf8(s, pos)
        raise _Fail("unexpected end of input")

    def parse_token(self, pos: int) -> tuple[int, int]:
        s, src = self.s, pos
        if s[pos] != "<":
            raise _Fail("expecting '<' at " + self.rest(pos))
        pos += 1
        if s[pos] == "[":                                       # <[id]>
            pos += 1
            int_end = self.parse_int(pos)
            tid = _stoull(s[pos:int_end], "stoul")
            if tid > 0xFFFFFFFF:
                raise _Fail("parsed token id is too big at " + self.rest(pos))
            pos = int_end
            for want in "]>":
                if s[pos] != want:
                    raise _Fail(f"expecting '{want}' at " + self.rest(pos))
                pos += 1
            return tid, pos
        if self.tokenize is None:
            raise _Fail("no vocab to parse token at " + self.rest(src))
        while s[pos] not in (NUL, ">"):                         # <token>: tokenized, with its brackets
            pos += 1
        if s[pos] != ">":
            raise _Fail("expecting '>' at " + self.rest(pos))
        pos += 1
        text = s[src:pos].encode("latin-1").decode("utf-8", "replace")
        ids = self.tokenize(text)
        if len(ids) != 1:                                       # must tokenize to exactly 1 token
            raise _Fail(f"invalid token '{text}'")
        return ids[0], pos

    def get_symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol_id(self, base_name: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base_name}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: list[Element]) -> None:
        if len(self.rules) <= rule_id:
            self.rules.extend([] for _ in range(rule_id + 1 - len(self.rules)))
        self.rules[rule_id] = list(rule)

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int, is_nested: bool) -> int:
        rule: list[Element] = []
        pos = self.parse_sequence(pos, rule_name, rule, is_nested)
        while self.s[pos] == "|":
            rule.append((ALT, 0))
            pos = self.parse_space(pos + 1, True)
            pos = self.parse_sequence(pos, rule_name, rule, is_nested)
        rule.append((END, 0))
        self.add_rule(rule_id, rule)
        return pos

    def parse_sequence(self, pos: int, rule_name: str, rule: list[Element], is_nested: bool) -> int:
        s = self.s
        last_sym_start = len(rule)
        n_prev_rules = 1
        while s[pos] != NUL:
            c = s[pos]
            if c == '"':                                        # literal string
                pos += 1
                last_sym_start, n_prev_rules = len(rule), 1
                while s[pos] != '"':
                    if s[pos] == NUL:
                        raise _Fail("unexpected end of input")
                    chr_, pos = self.parse_char(pos)
                    rule.append((CHAR, chr_))
                pos = self.parse_space(pos + 1, is_nested)
            elif c == "[":                                      # char range(s)
                pos += 1
                start_type = CHAR
                if s[pos] == "^":
                    pos += 1
                    start_type = CHAR_NOT
                last_sym_start, n_prev_rules = len(rule), 1
                while s[pos] != "]":
                    if s[pos] == NUL:
                        raise _Fail("unexpected end of input")
                    chr_, pos = self.parse_char(pos)
                    rule.append((CHAR_ALT if last_sym_start < len(rule) else start_type, chr_))
                    if s[pos] == "-" and s[pos + 1] != "]":
                        if s[pos + 1] == NUL:
                            raise _Fail("unexpected end of input")
                        end_chr, pos = self.parse_char(pos + 1)
                        rule.append((CHAR_RNG_UPPER, end_chr))
                pos = self.parse_space(pos + 1, is_nested)
            elif c in ("<", "!"):                               # token
                kind = TOKEN
                if c == "!":                                    # token inverse
                    kind = TOKEN_NOT
                    pos += 1
                tid, token_end = self.parse_token(pos)
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append((kind, tid))
                pos = self.parse_space(token_end, is_nested)
            elif _is_word(c):                                   # rule reference
                name_end = self.parse_name(pos)
                ref_rule_id = self.get_symbol_id(s[pos:name_end])
                pos = self.parse_space(name_end, is_nested)
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append((RULE_REF, ref_rule_id))
            elif c == "(":                                      # grouping: a synthesized rule
                pos = self.parse_space(pos + 1, True)
                n_rules_before = len(self.symbol_ids)
                sub_rule_id = self.generate_symbol_id(rule_name)
                pos = self.parse_alternates(pos, rule_name, sub_rule_id, True)
                n_prev_rules = max(1, len(self.symbol_ids) - n_rules_before)
                last_sym_start = len(rule)
                rule.append((RULE_REF, sub_rule_id))
                if s[pos] != ")":
                    raise _Fail("expecting ')' at " + self.rest(pos))
                pos = self.parse_space(pos + 1, is_nested)
            elif c == ".":                                      # any char
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append((CHAR_ANY, 0))
                pos = self.parse_space(pos + 1, is_nested)
            elif c in ("*", "+", "?"):
                pos = self.parse_space(pos + 1, is_nested)
                lo, hi = {"*": (0, UINT64_MAX), "+": (1, UINT64_MAX), "?": (0, 1)}[c]
                n_prev_rules = self.handle_repetitions(rule, last_sym_start, n_prev_rules, rule_name, lo, hi, pos)
            elif c == "{":                                      # {m}, {m,}, {m,n}
                pos = self.parse_space(pos + 1, is_nested)
                if not _is_digit(s[pos]):
                    raise _Fail("expecting an int at " + self.rest(pos))
                int_end = self.parse_int(pos)
                min_times = _stoull(s[pos:int_end], "stoull")
                pos = self.parse_space(int_end, is_nested)
                max_times = UINT64_MAX                          # default: no max limit
                if s[pos] == "}":
                    max_times = min_times
                    pos = self.parse_space(pos + 1, is_nested)
                elif s[pos] == ",":
                    pos = self.parse_space(pos + 1, is_nested)
                    if _is_digit(s[pos]):
                        int_end = self.parse_int(pos)
                        max_times = _stoull(s[pos:int_end], "stoull")
                        pos = self.parse_space(int_end, is_nested)
                    if s[pos] != "}":
                        raise _Fail("expecting '}' at " + self.rest(pos))
                    pos = self.parse_space(pos + 1, is_nested)
                else:
                    raise _Fail("expecting ',' at " + self.rest(pos))
                if min_times > MAX_REPETITION_THRESHOLD:
                    raise _Fail("number of repetitions exceeds sane defaults, please reduce the number of repetitions")
                if max_times != UINT64_MAX and max_times > MAX_REPETITION_THRESHOLD:
                    max_times = UINT64_MAX
                n_prev_rules = self.handle_repetitions(rule, last_sym_start, n_prev_rules, rule_name,
                                                        min_times, max_times, pos)
            else:
                break
        return pos

    def handle_repetitions(self, rule: list[Element], last_sym_start: int, n_prev_rules: int, rule_name: str,
                           min_times: int, max_times: int, pos: int) -> int:
        """parse_sequence's lambda: rewrite the last symbol S of `rule` (from last_sym_start on);
        returns the new n_prev_rules.
            S{m,n} --> S S S (m times) S'(n-m)      S'(x) ::= S S'(x-1) |   ...   S'(1) ::= S |
            S{m,}  --> S S S (m times) S'           S'    ::= S S' |
        """
        no_max = max_times == UINT64_MAX
        if last_sym_start == len(rule):
            raise _Fail("expecting preceding item to */+/?/{ at " + self.rest(pos))
        prev_rule = rule[last_sym_start:]
        total_rules = 1                     # the number of rules this repetition will generate
        if not no_max and max_times > 0:
            total_rules = max_times
        elif min_times > 0:
            total_rules = min_times
        if n_prev_rules * total_rules > MAX_REPETITION_THRESHOLD:
            raise _Fail("number of rules that are going to be repeated multiplied by the new repetition exceeds "
                        "sane defaults, please reduce the number of repetitions or rule complexity")
        if not no_max and max_times < min_times:
            # bankml only: llama.cpp's n_opt (max - min in uint64) wraps, and it allocates rules without end
            raise _Fail(f"repetition maximum {max_times} is below its minimum {min_times}")
        if min_times == 0:
            del rule[last_sym_start:]
        else:
            for _ in range(1, min_times):   # repeat the previous elements (min_times - 1) times
                rule.extend(prev_rule)
        last_rec_rule_id = 0
        n_opt = 1 if no_max else max_times - min_times
        for i in range(n_opt):
            rec_rule = list(prev_rule)
            rec_rule_id = self.generate_symbol_id(rule_name)
            if i > 0 or no_max:
                rec_rule.append((RULE_REF, rec_rule_id if no_max else last_rec_rule_id))
            rec_rule += [(ALT, 0), (END, 0)]
            self.add_rule(rec_rule_id, rec_rule)
            last_rec_rule_id = rec_rule_id
        if n_opt > 0:
            rule.append((RULE_REF, last_rec_rule_id))
        return n_prev_rules * total_rules

    def parse_rule(self, pos: int) -> int:
        s = self.s
        name_end = self.parse_name(pos)
        name = s[pos:name_end]
        pos = self.parse_space(name_end, False)
        rule_id = self.get_symbol_id(name)
        if s[pos:pos + 3] != "::=":
            raise _Fail("expecting ::= at " + self.rest(pos))
        pos = self.parse_space(pos + 3, True)
        pos = self.parse_alternates(pos, name, rule_id, False)
        if s[pos] == "\r":
            pos += 2 if s[pos + 1] == "\n" else 1
        elif s[pos] == "\n":
            pos += 1
        elif s[pos] != NUL:
            raise _Fail("expecting newline or end at " + self.rest(pos))
        return self.parse_space(pos, True)

    def parse(self, text: str) -> None:
        """llama_grammar_parser::parse; raises GrammarError where it returns false."""
        raw = text.encode("utf-8", "surrogatepass").decode("latin-1")
        self.s = raw.split(NUL, 1)[0] + NUL * 4                # a C string, and room to peek past its end
        try:
            pos = self.parse_space(0, True)
            while self.s[pos] != NUL:
                pos = self.parse_rule(pos)
            # validate the state to ensure that all rules are defined
            for rule in self.rules:
                if not rule:
                    raise _Fail("Undefined rule")
                for kind, value in rule:
                    if kind == RULE_REF and (value >= len(self.rules) or not self.rules[value]):
                        for name, sid in sorted(self.symbol_ids.items()):
                            if sid == value:
                                raise _Fail(f"Undefined rule identifier '{name}'")
        except _Fail as err:
            self.rules = []
            what = str(err)
            raise GrammarError("parse: error parsing grammar: " + (what.splitlines() or [""])[0], what) from None
