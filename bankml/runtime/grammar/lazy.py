"""A lazy grammar (llama_sampler_init_grammar_lazy_patterns with word triggers): every token goes
through untouched until a trigger word shows in the text generated so far; from there on the
grammar holds, starting with the text from the trigger's first byte (llama_grammar_accept_impl).

    g = LazyGrammar(Grammar(text, pieces), ["<tool_call>\\n"])
    g.allows(t), g.mask(), g.accept(t), g.clone()      # as Grammar's
"""
from __future__ import annotations

import numpy as np

from bankml.runtime.grammar.matcher import Grammar


class LazyGrammar:
    def __init__(self, grammar: Grammar, words: list[str]):
        self.grammar = grammar
        self.words = [w.encode() for w in words]    # regex_escape(word): a plain search for its bytes
        self.awaiting = True
        self.buffer = b""                           # trigger_buffer
        self.spans: list[tuple[int, int, int]] = [] # trigger_buffer_positions: (token, start, end)

    def clone(self) -> "LazyGrammar":
        g = object.__new__(LazyGrammar)
        g.__dict__.update(self.__dict__)
        g.grammar = self.grammar.clone()
        g.spans = list(self.spans)
        return g

    def allows(self, token: int) -> bool:
        return True if self.awaiting else self.grammar.allows(token)

    def mask(self) -> np.ndarray:
        if self.awaiting:
            return np.ones(len(self.grammar.pieces), bool)
        return self.grammar.mask()

    def accept(self, token: int) -> None:
        if not self.awaiting:
            self.grammar.accept(token)
            return
        piece = self.grammar.pieces[token]
        self.spans.append((token, len(self.buffer), len(self.buffer) + len(piece)))
        self.buffer += piece
        for word in self.words:
            start = self.buffer.find(word)
            if start < 0:
                continue
            self.awaiting = False
            for tok, tok_start, tok_end in self.spans:      # replay what overlaps [start, end)
                if tok_end <= start:
                    continue
                self.grammar.accept_piece(tok, self.buffer[max(tok_start, start):tok_end])
            self.buffer, self.spans = b"", []
            return
