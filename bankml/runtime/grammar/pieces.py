"""The vocabulary's pieces decoded once, as llama_grammar_apply_impl decodes candidates
(src/llama-grammar.cpp): decode_utf8 with llama_partial_utf8 carrying an incomplete UTF-8 sequence
from one piece to the next, and every candidate's code points per partial state, laid flat for the
matcher (matcher.py) to test a grammar's char classes on all of them at once.

    p = Pieces(pieces, eog)       # pieces[id]: token_to_piece(id, special=True)
    t = p.decoded(None)           # Decoded: every candidate's code points from a fresh state
    t = p.decoded((3, 1))         # ... from a state one byte short of a code point
"""
from __future__ import annotations

import numpy as np

Partial = tuple[int, int]           # llama_partial_utf8: (value so far, bytes remaining; -1 = invalid)

_LEADS = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)


def decode_utf8(piece: bytes, partial: Partial) -> tuple[list[int], Partial]:
    """decode_utf8(std::string, llama_partial_utf8): the code points (without the terminating 0;
    an invalid sequence gives none) and the partial sequence at the end. Stops at a NUL byte."""
    value, n_remain = partial
    i, n = 0, len(piece)
    cps: list[int] = []
    while i < n and piece[i] and n_remain > 0:       # continue the previous decode, if applicable
        if piece[i] >> 6 != 2:
            return [], (0, -1)
        value = (value << 6) + (piece[i] & 0x3F)
        i += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        cps.append(value)
    while i < n and piece[i]:                        # then whole sequences, maybe ending in a partial one
        n_remain = _LEADS[piece[i] >> 4] - 1
        if n_remain < 0:
            return [], (0, n_remain)
        value = piece[i] & ((1 << (7 - n_remain)) - 1)
        i += 1
        while i < n and piece[i] and n_remain > 0:
            value = (value << 6) + (piece[i] & 0x3F)
            i += 1
            n_remain -= 1
        if n_remain == 0:
            cps.append(value)
    return cps, (value, n_remain)


class Decoded:
    """The pieces llama_grammar_apply_impl decodes, from one partial UTF-8 state: their ids, code
    point counts (up to a 0 code point, where reject_candidates sees the end), offsets into the
    flat code points, and the partial sequence each ends in (n_remain, value)."""

    def __init__(self, pieces: list[bytes], first: np.ndarray, ids: np.ndarray, partial: Partial | None):
        parts = []      # (ids, code point counts, code points, n_remain, value)
        if partial is None:
            # valid UTF-8 decodes as Python decodes it; the rest (where surrogate escapes show) and
            # pieces with a NUL go through decode_utf8
            texts = [pieces[i].decode("utf-8", "surrogateescape") for i in ids.tolist()]
            lens = np.fromiter(map(len, texts), np.int64, len(texts))
            flat = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), np.uint32)
            owner = np.repeat(np.arange(len(texts)), lens)
            slow = np.zeros(len(texts), bool)
            slow[owner[((flat >= 0xDC80) & (flat <= 0xDCFF)) | (flat == 0)]] = True
            parts.append((ids[~slow], lens[~slow], flat[~slow[owner]], 0, 0))
        else:
            # a piece that does not go on with a continuation byte decodes to nothing, invalid
            slow = first[ids] >> 6 == 2
            parts.append((ids[~slow], 0, [], -1, 0))
        ends, cut = [], []
        for tid in ids[slow].tolist():
            cps, end = decode_utf8(pieces[tid], partial or (0, 0))
            cut.append(cps[:cps.index(0)] if 0 in cps else cps)
            ends.append(end)
        parts.append((ids[slow], [len(c) for c in cut], [c for cps in cut for c in cps],
                      [e[1] for e in ends], [e[0] for e in ends]))

        def column(k: int, dtype) -> np.ndarray:
            return np.concatenate([np.broadcast_to(np.asarray(p[k], dtype), len(p[0])) for p in parts])
        self.ids, self.lens = column(0, np.int64), column(1, np.int64)
        self.n_remain, self.value = column(3, np.int64), column(4, np.int64)
        self.cps = np.concatenate([np.asarray(p[2], np.uint32) for p in parts])
        self.offs = np.cumsum(self.lens) - self.lens


class Pieces:
    """pieces[id] (llama_vocab::token_to_piece's cache, special=True) and the EOG ids, with the
    candidates decoded per partial state (None: a fresh one), shared by a grammar and its clones."""

    def __init__(self, pieces: list[bytes], eog):
        self.pieces, self.eog = pieces, frozenset(eog)
        self.eog_ids = np.array(sorted(i for i in self.eog if 0 <= i < len(pieces)), np.int64)
        self._decoded: dict[Partial | None, Decoded] = {}
        self._candidates: tuple[np.ndarray, np.ndarray] | None = None

    def decoded(self, partial: Partial | None) -> Decoded:
        got = self._decoded.get(partial)
        if got is None:
            if self._candidates is None:     # every id but EOG, empty pieces and pieces led by NUL
                first = np.frombuffer(b"".join(p[:1] or b"\0" for p in self.pieces), np.uint8)
                take = first != 0
                take[self.eog_ids] = False
                self._candidates = first, np.nonzero(take)[0]
            if len(self._decoded) > 16:
                self._decoded = {k: v for k, v in self._decoded.items() if k is None}
            got = self._decoded[partial] = Decoded(self.pieces, *self._candidates, partial)
        return got
