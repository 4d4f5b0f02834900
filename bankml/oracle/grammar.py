"""libllama's own grammar sampler through ctypes, the oracle for bankml/runtime/grammar.

    with Vocab("m.gguf") as v, GrammarSampler(v, text) as g:    # llama_sampler_init_grammar(vocab, text, "root")
        allowed = g.mask()                                      # llama_sampler_apply over every id (logit 0)
        g.accept(int(allowed.nonzero()[0][0]))                  # llama_sampler_accept

A grammar libllama refuses (NULL) raises OracleError carrying what libllama wrote: the parser's
"parse: error parsing grammar: ..." on stderr, and its LLAMA_LOG_ERROR lines. Accepting a token the
grammar rejects throws inside C++: accept only allowed tokens.
"""
from __future__ import annotations

import ctypes
import os
import re
import tempfile

import numpy as np

from bankml.errors import OracleError
from bankml.oracle.vocab import _LOG_CB, _P, _QUIET, Vocab

# struct llama_token_data {id, logit, p} and llama_token_data_array {data, size, selected, sorted}
# (include/llama.h, b11434)
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class _TokenDataArray(ctypes.Structure):
    _fields_ = [("data", _P), ("size", ctypes.c_size_t), ("selected", ctypes.c_int64), ("sorted", ctypes.c_bool)]


def _bind(lib) -> None:
    lib.llama_sampler_init_grammar.restype = _P
    lib.llama_sampler_init_grammar.argtypes = [_P, ctypes.c_char_p, ctypes.c_char_p]
    lib.llama_sampler_init_grammar_lazy_patterns.restype = _P
    lib.llama_sampler_init_grammar_lazy_patterns.argtypes = [
        _P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t]
    lib.llama_sampler_apply.argtypes = [_P, ctypes.POINTER(_TokenDataArray)]
    lib.llama_sampler_accept.argtypes = [_P, ctypes.c_int32]
    lib.llama_sampler_free.argtypes = [_P]


def regex_escape(word: str) -> str:
    """common/common.cpp regex_escape: a trigger word as the pattern common_sampler_init makes of it."""
    return re.sub(r"[.^$|()*+?\[\]{}\\]", lambda m: "\\" + m.group(0), word)


class GrammarSampler:
    """One llama_sampler_init_grammar over a loaded Vocab; with `triggers` (words) a lazy one,
    llama_sampler_init_grammar_lazy_patterns with each word's escaped pattern."""

    def __init__(self, vocab: Vocab, text: str, root: str = "root", triggers: tuple[str, ...] = ()):
        self.lib, self.n = vocab.lib, vocab.lib.llama_vocab_n_tokens(vocab.vocab)
        _bind(self.lib)
        lines: list[str] = []
        keep = _LOG_CB(lambda level, msg, data: lines.append(msg.decode("utf-8", "replace")))
        self.lib.llama_log_set(ctypes.cast(keep, _P), None)
        err_fd, saved = tempfile.TemporaryFile(), os.dup(2)
        try:
            os.dup2(err_fd.fileno(), 2)                 # the parser fprintf()s to stderr
            if triggers:
                patterns = (ctypes.c_char_p * len(triggers))(*[regex_escape(w).encode() for w in triggers])
                self.smpl = self.lib.llama_sampler_init_grammar_lazy_patterns(
                    vocab.vocab, text.encode(), root.encode(), patterns, len(triggers), None, 0)
            else:
                self.smpl = self.lib.llama_sampler_init_grammar(vocab.vocab, text.encode(), root.encode())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            self.lib.llama_log_set(ctypes.cast(_QUIET, _P), None)
        err_fd.seek(0)
        self.log = err_fd.read().decode("utf-8", "replace") + "".join(lines)
        err_fd.close()
        if not self.smpl:
            raise OracleError(f"llama_sampler_init_grammar refused the grammar: {self.log}")
        self.data = np.zeros(self.n, TOKEN_DATA)

    def mask(self) -> np.ndarray:
        """llama_sampler_apply on every id with logit 0: True where the logit stays finite."""
        self.data["id"] = np.arange(self.n, dtype=np.int32)
        self.data["logit"] = 0.0
        self.data["p"] = 0.0
        arr = _TokenDataArray(self.data.ctypes.data, self.n, -1, False)
        self.lib.llama_sampler_apply(self.smpl, ctypes.byref(arr))
        if arr.data != self.data.ctypes.data or arr.size != self.n:
            raise OracleError("the grammar sampler replaced the candidate array")
        return self.data["logit"] != -np.inf

    def accept(self, token: int) -> None:
        """llama_sampler_accept: only for a token mask() allows (libllama throws otherwise)."""
        self.lib.llama_sampler_accept(self.smpl, token)

    def close(self) -> None:
        if self.smpl:
            self.lib.llama_sampler_free(self.smpl)
            self.smpl = None

    def __enter__(self) -> "GrammarSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
