"""GBNF text to the rules a grammar starts from, as llama_grammar_init_impl takes them (llama.cpp
b11434, src/llama-grammar.cpp): parsed by llama_grammar_parser (gbnf.py), then checked before it
builds stacks: a root symbol, and no left recursion.

    rules, start = load('root ::= "a"+', root="root", tokenize=None)   # id -> elements; root's id
"""
from __future__ import annotations

import sys

from bankml.runtime.grammar.gbnf import ALT, END, RULE_REF, Element, GrammarError, Parser, Tokenize


def is_end_of_sequence(kind: int) -> bool:
    """llama_grammar_is_end_of_sequence."""
    return kind == END or kind == ALT


def detect_left_recursion(rules, i: int, visited: list[bool], in_progress: list[bool], may_be_empty: list[bool]) -> bool:
    """llama_grammar_detect_left_recursion."""
    if in_progress[i]:
        return True
    in_progress[i] = True
    rule = rules[i]
    # first check if the rule might produce the empty string
    at_rule_start = True
    for kind, _ in rule:
        if is_end_of_sequence(kind):
            if at_rule_start:
                may_be_empty[i] = True
                break
            at_rule_start = True
        else:
            at_rule_start = False
    # second, recurse into leftmost nonterminals (or next-leftmost as long as the previous may be empty)
    recurse_into_nonterminal = True
    for kind, value in rule:
        if kind == RULE_REF and recurse_into_nonterminal:
            if detect_left_recursion(rules, value, visited, in_progress, may_be_empty):
                return True
            if not may_be_empty[value]:
                recurse_into_nonterminal = False
        elif is_end_of_sequence(kind):
            recurse_into_nonterminal = True
        else:
            recurse_into_nonterminal = False
    in_progress[i] = False
    visited[i] = True
    return False


def load(text: str, root: str = "root", tokenize: Tokenize | None = None) -> tuple[list[list[Element]], int]:
    """The rules and the start rule's id, or GrammarError with the message llama_grammar_init_impl
    logs before it returns NULL."""
    parser = Parser(tokenize)
    parser.parse(text)
    if not parser.rules:
        raise GrammarError("failed to parse grammar")
    if root not in parser.symbol_ids:
        raise GrammarError(f"grammar does not contain a '{root}' symbol")
    rules = parser.rules
    n = len(rules)
    visited, in_progress, may_be_empty = [False] * n, [False] * n, [False] * n
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2 * n + 1000))         # a chain of {m,n} rules nests this deep
    try:
        for i in range(n):
            if not visited[i] and detect_left_recursion(rules, i, visited, in_progress, may_be_empty):
                raise GrammarError(f"unsupported grammar, left recursion detected for nonterminal at index {i}")
    finally:
        sys.setrecursionlimit(limit)
    return rules, parser.symbol_ids[root]
