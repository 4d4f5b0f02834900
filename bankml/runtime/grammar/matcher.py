"""Matching tokens against a GBNF grammar as llama.cpp b11434 does it (src/llama-grammar.cpp):
pushdown stacks from the root rule (llama_grammar_init_impl, llama_grammar_advance_stack), the
tokens a state allows (llama_grammar_apply_impl, llama_grammar_reject_candidates) and the state after
a token (llama_grammar_accept_impl, llama_grammar_accept_token), with llama_partial_utf8 carrying
an incomplete UTF-8 sequence from one token to the next.

    g = for_vocab(gbnf_text, tokenizer)     # or Grammar(text, pieces, eog)
    g.mask()          # bool per token id: True where the grammar sampler leaves the logit alone
    g.allows(t)       # the same for one token
    g.accept(t)       # GrammarError where llama.cpp throws (or aborts)

Lazy grammars (trigger words, tokens and patterns) are not here: a Grammar constrains from its
first token. An element's place in the rules laid end to end (an int) stands for its pointer, so a
stack is a tuple of ints, bottom first. What every clone shares (the rules, the decoded pieces and
the caches of stacks and masks) lives in `Rules` and `Pieces` (pieces.py).
"""
from __future__ import annotations

from itertools import accumulate

import numpy as np

from bankml.runtime.grammar.gbnf import (ALT, CHAR, CHAR_ALT, CHAR_ANY, CHAR_NOT, CHAR_RNG_UPPER, END, RULE_REF,
                                         TOKEN, TOKEN_NOT, GrammarError, Tokenize)
from bankml.runtime.grammar.load import load
from bankml.runtime.grammar.pieces import Decoded, Partial, Pieces, decode_utf8

Stack = tuple[int, ...]             # llama_grammar_stack: element places, top last

_CACHE_MAX = 200_000                # stacks remembered per grammar before the caches start over
_MASKS_MAX = 64                     # masks remembered per grammar (and its clones)


class CharClass:
    """The char element at a place (CHAR, CHAR_NOT or CHAR_ANY and the CHAR_ALT / CHAR_RNG_UPPER
    after it): its items in order, (lo, hi) or None for `.`, and `end`, the place
    llama_grammar_match_char returns."""

    def __init__(self, types: list[int], values: list[int], pos: int):
        self.positive = types[pos] in (CHAR, CHAR_ANY)
        self.items: list[tuple[int, int] | None] = []
        while True:
            if types[pos + 1] == CHAR_RNG_UPPER:    # inclusive range, e.g. [a-z]
                self.items.append((values[pos], values[pos + 1]))
                pos += 2
            elif types[pos] == CHAR_ANY:            # any character matches "."
                self.items.append(None)
                pos += 1
            else:                                   # exact char match, e.g. [a] or "a"
                self.items.append((values[pos], values[pos]))
                pos += 1
            if types[pos] != CHAR_ALT:
                break
        self.end = pos
        self.any = None in self.items
        merged: list[list[int]] = []                # the same set as disjoint sorted ranges
        for lo, hi in sorted(r for r in self.items if r is not None and r[0] <= r[1]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.lo = np.array([r[0] for r in merged], np.uint32)
        self.hi = np.array([r[1] for r in merged], np.uint32)

    def match(self, chr_: int) -> bool:
        """llama_grammar_match_char(pos, chr).first"""
        found = any(r is None or r[0] <= chr_ <= r[1] for r in self.items)
        return found == self.positive

    def match_all(self, cps: np.ndarray) -> np.ndarray:
        """match() of each code point."""
        if self.any:
            found = np.ones(len(cps), bool)
        elif len(self.lo) <= 4:
            found = np.zeros(len(cps), bool)
            for lo, hi in zip(self.lo, self.hi):
                found |= (cps >= lo) & (cps <= hi)
        else:
            i = np.searchsorted(self.lo, cps, side="right") - 1
            found = (i >= 0) & (cps <= self.hi[np.maximum(i, 0)])
        return found if self.positive else ~found

    def match_partial(self, partial: Partial) -> bool:
        """llama_grammar_match_partial_char: could some continuation of the partial sequence match?"""
        value, n_remain = partial
        if n_remain < 0 or (n_remain == 1 and value < 2):   # invalid, or a 7-bit char split in 2 (overlong)
            return False
        low = value << (n_remain * 6)                       # the code points it could complete to
        high = low | ((1 << (n_remain * 6)) - 1)
        if low == 0:
            if n_remain == 2:
                low = 1 << 11
            elif n_remain == 3:
                low = 1 << 16
        for r in self.items:
            if r is None:
                return True
            if r[0] <= high and low <= r[1]:
                return self.positive
        return not self.positive


class Rules:
    """The rules laid end to end, the char class of each char element, and advance_stack's results."""

    def __init__(self, rules: list[list[tuple[int, int]]]):
        self.types = [t for rule in rules for t, _ in rule]
        self.values = [v for rule in rules for _, v in rule]
        self.start = list(accumulate((len(r) for r in rules[:-1]), initial=0))
        self.classes = {p: CharClass(self.types, self.values, p)
                        for p, t in enumerate(self.types) if t in (CHAR, CHAR_NOT, CHAR_ANY)}
        self._advanced: dict[Stack, tuple[Stack, ...]] = {}
        self._next: dict[Stack, tuple[Stack, ...]] = {}
        self._unions: dict[tuple[Stack, ...], frozenset] = {}

    def is_end(self, pos: int) -> bool:
        """llama_grammar_is_end_of_sequence"""
        return self.types[pos] in (END, ALT)

    def is_token(self, pos: int) -> bool:
        return self.types[pos] in (TOKEN, TOKEN_NOT)

    def match_token(self, pos: int, token: int) -> bool:
        """llama_grammar_match_token"""
        return (self.values[pos] == token) == (self.types[pos] == TOKEN)

    def advance_stack(self, stack: Stack) -> tuple[Stack, ...]:
        """llama_grammar_advance_stack into an empty list: the stacks, each empty or at a terminal."""
        got = self._advanced.get(stack)
        if got is not None:
            return got
        types, new_stacks, todo, seen = self.types, [], [stack], set()
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if not cur:
                if cur not in new_stacks:
                    new_stacks.append(cur)
                continue
            pos = cur[-1]
            if types[pos] == RULE_REF:
                subpos = self.start[self.values[pos]]
                while True:                             # each alternate of the referenced rule
                    next_stack = cur[:-1]
                    if not self.is_end(pos + 1):        # the element after the reference, if any
                        next_stack += (pos + 1,)
                    if not self.is_end(subpos):         # the alternate, if nonempty
                        next_stack += (subpos,)
                    todo.append(next_stack)
                    while not self.is_end(subpos):
                        subpos += 1
                    if types[subpos] != ALT:
                        break
                    subpos += 1
            elif types[pos] in (CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT):
                if cur not in new_stacks:
                    new_stacks.append(cur)
            else:
                raise GrammarError(f"grammar stack left on element type {types[pos]} (llama.cpp aborts here)")
        if len(self._advanced) > _CACHE_MAX:
            self._advanced.clear()
        self._advanced[stack] = got = tuple(new_stacks)
        return got

    def next_stacks(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks after the char element on top of `stack` matched: advance_stack of the stack
        with its top replaced by the element after the char class (or popped at a sequence's end)."""
        got = self._next.get(stack)
        if got is None:
            end = self.classes[stack[-1]].end
            after = stack[:-1] if self.is_end(end) else stack[:-1] + (end,)
            if len(self._next) > _CACHE_MAX:
                self._next.clear()
            got = self._next[stack] = self.advance_stack(after)
        return got

    def accept_chr(self, stack: Stack, chr_: int, new_stacks: list[Stack], seen: set[Stack]) -> None:
        """llama_grammar_accept_chr: add to new_stacks (unless there) the stacks after chr_."""
        if not stack or self.is_token(stack[-1]):
            return
        if self.classes[stack[-1]].match(chr_):
            for s in self.next_stacks(stack):
                if s not in seen:
                    seen.add(s)
                    new_stacks.append(s)

    # ------------------------------------------------------------ llama_grammar_reject_candidates
    def accepts(self, stacks, cps: list[int], k: int, partial: Partial, token: int) -> bool:
        """Not rejected by llama_grammar_reject_candidates(stacks, [candidate at code point k])."""
        return any(self._accepts_one(s, cps, k, partial, token) for s in stacks)

    def _accepts_one(self, stack: Stack, cps: list[int], k: int, partial: Partial, token: int) -> bool:
        """llama_grammar_reject_candidates_for_stack, for one candidate."""
        at_end = k == len(cps)
        if not stack:
            return at_end and partial[1] == 0
        pos = stack[-1]
        if self.is_token(pos):                      # a token rule checks only the token id
            return partial[1] == 0 if at_end else self.match_token(pos, token)
        cls = self.classes[pos]
        if at_end:                                  # a partial sequence must be able to match here
            return partial[1] == 0 or cls.match_partial(partial)
        return cls.match(cps[k]) and self.accepts(self.next_stacks(stack), cps, k + 1, partial, token)

    def accepted(self, stacks, t: "Decoded") -> np.ndarray:
        """accepts() of every row of t at once. reject_candidates_for_stack sends the candidates that
        match a stack's char on to the same next stacks, and a candidate survives when some stack
        takes it; so rows go code point by code point in groups that share their set of stacks."""
        ok = np.zeros(len(t.ids), bool)
        level = {frozenset(stacks): np.arange(len(t.ids))}
        depth = 0
        while level:
            nxt: dict[frozenset, list[np.ndarray]] = {}
            for group, rows in level.items():
                self._step(group, rows, depth, t, ok, nxt)
            level = {g: np.concatenate(r) if len(r) > 1 else r[0] for g, r in nxt.items()}
            depth += 1
        return ok

    def _step(self, group: frozenset, rows: np.ndarray, d: int, t: "Decoded", ok: np.ndarray, nxt: dict) -> None:
        chars = [s for s in group if s and not self.is_token(s[-1])]
        tokens = [s for s in group if s and self.is_token(s[-1])]
        ended = t.lens[rows] == d
        if ended.any():                             # at the candidate's end: ok on a whole code point,
            e, rows = rows[ended], rows[~ended]     # or on a partial one a char class could complete to
            rem = t.n_remain[e]
            ok[e[rem == 0]] = True
            part = e[rem != 0]
            if part.size and chars:
                keys = t.value[part].astype(np.int64) * 8 + t.n_remain[part] + 1
                uniq, inv = np.unique(keys, return_inverse=True)
                for i, key in enumerate(uniq.tolist()):
                    partial = (key // 8, key % 8 - 1)
                    if any(self.classes[s[-1]].match_partial(partial) for s in chars):
                        ok[part[inv == i]] = True
        if tokens and rows.size:                    # a token element takes the whole rest by id
            ids, hit = t.ids[rows], np.zeros(len(rows), bool)
            for s in tokens:
                hit |= (ids == self.values[s[-1]]) if self.types[s[-1]] == TOKEN else (ids != self.values[s[-1]])
            ok[rows[hit]] = True
            rows = rows[~hit]
        if not chars or not rows.size:
            return
        cps = t.cps[t.offs[rows] + d]
        matches = [self.classes[s[-1]].match_all(cps) for s in chars]
        for took, sel in _split(chars, matches, rows):
            group = self._union(took)
            if group:
                nxt.setdefault(group, []).append(sel)

    def _union(self, took: tuple[Stack, ...]) -> frozenset:
        got = self._unions.get(took)
        if got is None:
            if len(self._unions) > _CACHE_MAX:
                self._unions.clear()
            got = self._unions[took] = frozenset(s for st in took for s in self.next_stacks(st))
        return got


def _split(chars: list[Stack], matches: list[np.ndarray], rows: np.ndarray):
    """(the char stacks a row matched, those rows) for each such set but the empty one."""
    if len(chars) == 1:
        yield tuple(chars), rows[matches[0]]
        return
    if len(chars) <= 16:
        word = np.zeros(len(rows), np.int64)
        for j, m in enumerate(matches):
            word |= m.astype(np.int64) << j
        patterns = np.flatnonzero(np.bincount(word)).tolist()
        if len(patterns) <= 16:
            for u in patterns:
                if u:
                    yield tuple(s for j, s in enumerate(chars) if u >> j & 1), rows[word == u]
            return
    patterns, inv = np.unique(np.stack(matches, 1), axis=0, return_inverse=True)
    inv = inv.ravel()
    order = np.argsort(inv, kind="stable")
    ends = np.cumsum(np.bincount(inv, minlength=len(patterns))).tolist()
    for i, u in enumerate(patterns.tolist()):
        took = tuple(s for s, hit in zip(chars, u) if hit)
        if took:
            yield took, rows[order[ends[i - 1] if i else 0:ends[i]]]


# ---------------------------------------------------------------- the grammar's state

class Grammar:
    """One llama_grammar (not lazy): its stacks and partial UTF-8 sequence over shared rules and pieces.
    `tokenize` (text -> ids, llama_tokenize with parse_special) resolves `<token>` references.
    `pieces` may be a Pieces of the vocabulary (eog then unused), so that grammars share its decoding."""

    def __init__(self, text: str, pieces: list[bytes] | Pieces, eog=(), root: str = "root", *,
                 tokenize: Tokenize | None = None):
        rules, start = load(text, root, tokenize)
        self._rules = Rules(rules)
        self._pieces = pieces if isinstance(pieces, Pieces) else Pieces(pieces, eog)
        self._masks: dict[tuple, np.ndarray] = {}
        self.partial: Partial = (0, 0)
        # loop over alternates of the start rule to build the initial stacks
        r, pos, seen = self._rules, self._rules.start[start], set()
        self.stacks: list[Stack] = []
        while True:
            for s in r.advance_stack(() if r.is_end(pos) else (pos,)):
                if s not in seen:
                    seen.add(s)
                    self.stacks.append(s)
            while not r.is_end(pos):
                pos += 1
            if r.types[pos] != ALT:
                break
            pos += 1

    def clone(self) -> "Grammar":
        """llama_grammar_clone_impl: the same rules, pieces and caches; its own state."""
        g = object.__new__(Grammar)
        g.__dict__.update(self.__dict__)
        g.stacks = list(self.stacks)
        return g

    @property
    def pieces(self) -> list[bytes]:
        """The vocabulary's pieces, as the grammar reads them."""
        return self._pieces.pieces

    def _key(self) -> tuple:
        """What the mask depends on: the stacks, and the partial sequence only while one is open."""
        return frozenset(self.stacks), self.partial if self.partial[1] > 0 else None

    def mask(self) -> np.ndarray:
        """llama_grammar_apply_impl over every id in order: True where the logit is left alone."""
        key = self._key()
        got = self._masks.get(key)
        if got is None:
            v = self._pieces
            t = v.decoded(key[1])
            got = np.zeros(len(v.pieces), bool)
            got[t.ids[self._rules.accepted(self.stacks, t)]] = True
            got[v.eog_ids] = any(not s for s in self.stacks)     # EOG only where a stack is done
            if len(self._masks) >= _MASKS_MAX:
                del self._masks[next(iter(self._masks))]
            self._masks[key] = got
        return got.copy()

    def allows(self, token: int) -> bool:
        """llama_grammar_apply_impl on a one-candidate array: is the logit left alone?"""
        v = self._pieces
        if token in v.eog:
            return any(not s for s in self.stacks)
        piece = v.pieces[token]
        if not piece or piece[0] == 0:
            return False
        got = self._masks.get(self._key())
        if got is not None:
            return bool(got[token])
        cps, partial = decode_utf8(piece, self.partial)
        if 0 in cps:
            cps = cps[:cps.index(0)]
        return self._rules.accepts(self.stacks, cps, 0, partial, token)

    def accept(self, token: int) -> None:
        """llama_grammar_accept_impl (not lazy). Where llama.cpp throws (no stack survives the piece)
        or aborts (EOG while no stack is done), raises GrammarError and keeps the state."""
        self.accept_piece(token, self._pieces.pieces[token])

    def accept_piece(self, token: int, piece: bytes) -> None:
        """llama_grammar_accept_token: `piece` for `token` (a lazy grammar replays part of a piece)."""
        r = self._rules
        if token in self._pieces.eog:
            if any(not s for s in self.stacks):
                return
            raise GrammarError(f"end of generation token {token} while the grammar is not complete "
                               "(llama_grammar_accept_impl aborts here)")
        cps, partial = decode_utf8(piece, self.partial)
        stacks_new: list[Stack] = []
        seen: set[Stack] = set()
        for stack in self.stacks:
            if not stack:
                continue
            pos = stack[-1]
            if r.is_token(pos):
                if not r.match_token(pos, token):
                    continue
                current = r.advance_stack(stack[:-1] if r.is_end(pos + 1) else stack[:-1] + (pos + 1,))
            else:
                current = [stack]
                for chr_ in cps:
                    next_stacks: list[Stack] = []
                    next_seen: set[Stack] = set()
                    for cur in current:
                        r.accept_chr(cur, chr_, next_stacks, next_seen)
                    current = next_stacks
                    if not current:
                        break
            for s in current:
                if s not in seen:
                    seen.add(s)
                    stacks_new.append(s)
        if not stacks_new:
            what = f"Unexpected empty grammar stack after accepting piece: {piece.decode('utf-8', 'replace')} ({token})"
            raise GrammarError(what.replace("\r", "\\r").replace("\n", "\\n"), what)
        self.stacks, self.partial = stacks_new, partial


def for_vocab(text: str, vocab, root: str = "root") -> Grammar:
    """A Grammar over a bankml tokenizer (bankml.tokenizer.tokenizer_for): its pieces with
    special=True, its EOG ids, and its tokenize for `<token>` references."""
    pieces = [vocab.piece(i, True) for i in range(vocab.n_vocab)]
    return Grammar(text, pieces, vocab.eog, root,
                   tokenize=lambda s: vocab.encode(s, add_special=False, parse_special=True))
