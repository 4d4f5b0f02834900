"""llama_tokenize for SentencePiece vocabularies (`tokenizer.ggml.model = llama`), in Python.

    tok = tokenizer_for(model)           # an SpmTokenizer when the header says llama (Gemma, Llama 2, ...)
    ids = tok.encode("Hello", add_special=True, parse_special=True)
    text = tok.decode(ids)               # the pieces joined, as llama-server's /detokenize
    text = tok.detokenize(ids, remove_special=True)     # llama_detokenize, leading-space rule included

The steps are llama.cpp's (src/llama-vocab.cpp): special and user-defined token texts cut the
text first (tokenizer_st_partition, longest first in std::sort's order); each text fragment gets a
leading space when add_space_prefix is set and it starts the text or follows a special token,
its spaces become U+2581 (llama_escape_whitespace), and llm_tokenizer_spm_session merges it:
every UTF-8 character is a symbol, the adjacent pair whose joined text is a token with the
highest score merges first (equal scores: the leftmost), and a final symbol that is not a
token falls back to its bytes as <0xXX> tokens.
"""
from __future__ import annotations

import heapq
from typing import Iterable

from bankml.errors import ModelRefused
from bankml.gguf.reader import GGUF_ARRAY, GGUF_FLOAT32, GGUF_INT32, GGUF_STRING
from bankml.numerics.stdsort import std_sort
from bankml.tokenizer.vocab import EOG_TEXTS, FIM_TEXTS, FIMEOG_TEXTS, PieceVocab, st_partition

# llama_token_attr bits (include/llama.h)
A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER_DEFINED, A_BYTE = 1, 2, 4, 8, 16, 32
# gguf token_type -> attr (llama_vocab::impl::load); anything else is UNDEFINED (0)
_TYPE_ATTR = {1: A_NORMAL, 2: A_UNKNOWN, 3: A_CONTROL, 4: A_USER_DEFINED, 5: A_UNUSED, 6: A_BYTE}

# texts llama.cpp's vocab loader marks user-defined whatever their type
_ALWAYS_USER_DEFINED = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}   # the gpt-oss hack
_SPACE, _ESCAPED_SPACE = " ", "\u2581"


def _special_id(metadata: dict, key: str, default: int | None, n: int) -> int | None:
    """A special token id as llama.cpp resolves it: the header's when in range, else the default."""
    tid = metadata.get(key)
    if tid is not None and 0 <= tid < n:
        return int(tid)
    return default if default is not None and 0 <= default < n else None


def spm_vocab_refusal(metadata: dict, value_types: dict) -> str | None:
    """Why the header's SentencePiece vocabulary cannot be loaded (naming the key), or None."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if value_types.get("tokenizer.ggml.tokens") != (GGUF_ARRAY, GGUF_STRING) or not tokens:
        return "key tokenizer.ggml.tokens is missing, empty or not an array of strings"
    n = len(tokens)
    for key, elem in (("tokenizer.ggml.scores", (GGUF_FLOAT32, GGUF_INT32)),
                      ("tokenizer.ggml.token_type", (GGUF_INT32,))):
        vtype = value_types.get(key)
        if vtype is None:
            continue                                # llama.cpp: scores 0, every token normal
        if vtype[0] != GGUF_ARRAY or vtype[1] not in elem:
            return f"key {key} is not an array of {'f32 or i32' if len(elem) == 2 else 'i32'}"
        if len(metadata[key]) < n:
            return f"key {key} has {len(metadata[key])} entries for {n} tokens"
    for what, default, flag_default in (("bos", 1, True), ("eos", 2, False)):
        if metadata.get(f"tokenizer.ggml.add_{what}_token", flag_default) and \
                _special_id(metadata, f"tokenizer.ggml.{what}_token_id", default, n) is None:
            return f"key tokenizer.ggml.add_{what}_token is set but the vocabulary has no {what.upper()} token"
    name = str(metadata.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        return (f"general.name is {metadata['general.name']!r}: llama.cpp strips the spaces after Phi-3's "
                "special tokens (RSTRIP), which bankml's SentencePiece tokenizer does not")
    return None


class SpmTokenizer(PieceVocab):
    """One SentencePiece GGUF vocabulary: encode, decode, pieces, special ids."""

    def __init__(self, tokens: list[str], scores, token_types, bos: int | None = 1, eos: int | None = 2,
                 add_bos: bool = True, add_eos: bool = False, add_space_prefix: bool = True,
                 extra_eog: Iterable[int | None] = ()):
        n = len(tokens)
        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * n
        types = [int(t) for t in token_types] if token_types is not None else [1] * n
        self.attrs = [_TYPE_ATTR.get(t, 0) for t in types]
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}       # a repeated text: its last id
        self.bos, self.eos = bos, eos
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        # llama.cpp finds each EOT/FIM kind by text only when the header gives no id for it, and
        # takes the first match in hash order; bankml marks every match (one per kind in practice)
        eog = set()
        for text, tid in self.token_to_id.items():
            if text in EOG_TEXTS or text in FIMEOG_TEXTS or text in FIM_TEXTS:
                self.attrs[tid] |= A_CONTROL
                if text not in FIM_TEXTS:
                    eog.add(tid)
        for text, tid in self.token_to_id.items():
            if self.attrs[tid] & A_CONTROL and "unused" in text:
                self.attrs[tid] |= A_UNUSED
            if text in _ALWAYS_USER_DEFINED:
                self.attrs[tid] = A_USER_DEFINED
        if "<|tool_response>" in self.token_to_id and "</s>" in self.token_to_id:
            s_id = self.token_to_id["</s>"]             # gemma4's </s> is a normal token
            eog.discard(s_id)
            self.attrs[s_id] = A_NORMAL
        self.eog = frozenset(eog | {i for i in (self.eos, *extra_eog) if i is not None})
        # tokenizer_st_partition's order: longest text first, equal lengths as libstdc++'s std::sort
        # leaves them (it matters only where two special texts of one length can overlap)
        self.special = [i for i, a in enumerate(self.attrs) if a & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN)]
        std_sort(self.special, key=lambda i: len(self.tokens[i].encode()))
        self._pieces = [self._piece(i) for i in range(n)]
        self._bytes = [self._byte_token(b) for b in range(256)]

    refusal = staticmethod(spm_vocab_refusal)

    @classmethod
    def from_metadata(cls, md: dict, name: str) -> "SpmTokenizer":
        n = len(md["tokenizer.ggml.tokens"])
        return cls(md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.scores"), md.get("tokenizer.ggml.token_type"),
                   _special_id(md, "tokenizer.ggml.bos_token_id", 1, n),
                   _special_id(md, "tokenizer.ggml.eos_token_id", 2, n),
                   bool(md.get("tokenizer.ggml.add_bos_token", True)),
                   bool(md.get("tokenizer.ggml.add_eos_token", False)),
                   bool(md.get("tokenizer.ggml.add_space_prefix", True)),
                   [_special_id(md, f"tokenizer.ggml.{k}_token_id", None, n) for k in ("eot", "eom")])

    def _byte_token(self, b: int) -> int | None:
        """llama_vocab::byte_to_token: <0xXX>, else the byte itself as a token."""
        tid = self.token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.token_to_id.get(chr(b))
        return tid

    # -------------------------------------------------------------- encode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special)."""
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos)
        prev_special = True                         # the first fragment gets the space prefix too
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                frag = _SPACE + frag
            self._merge(frag.replace(_SPACE, _ESCAPED_SPACE), out)
            prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos)
        return out

    def encode_bytes(self, raw: bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize of bytes that need not be UTF-8: the SPM session splits symbols on bytes,
        so a byte outside a complete character is its own symbol, never merged, its byte token.
        Such bytes travel as U+DC80..U+DCFF (surrogateescape) through encode."""
        return self.encode(raw.decode("utf-8", "surrogateescape"), add_special, parse_special)

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        return st_partition(text, [(sid, self.tokens[sid]) for sid in self.special
                                   if parse_special or not self.attrs[sid] & (A_CONTROL | A_UNKNOWN)])

    def _merge(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session::tokenize of one escaped fragment."""
        syms = _symbols(text)                       # one symbol per UTF-8 character
        n = len(syms)
        prev, nxt = list(range(-1, n - 1)), [*range(1, n), -1]
        heap: list[tuple[float, int, int, int]] = []
        vocab, scores = self.token_to_id, self.scores

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            joined = syms[left] + syms[right]
            tid = vocab.get(joined)
            if tid is None:
                return
            # std::priority_queue top: the highest score, then the smallest left index
            heapq.heappush(heap, (-scores[tid], left, right, len(joined)))

        for i in range(1, n):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue                            # one side merged since: outdated
            syms[left], syms[right] = a + b, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        # resegment: a merged symbol is always a token (only token texts merge), so llama.cpp's
        # rev_merge split never happens; a single character that is no token becomes its bytes.
        i = 0 if n else -1
        while i != -1:
            tid = vocab.get(syms[i])
            if tid is not None:
                out.append(tid)
            else:
                for b in _raw_bytes(syms[i]):
                    if self._bytes[b] is None:
                        raise ModelRefused(f"the vocabulary has no token for byte 0x{b:02X} (<0x{b:02X}>)")
                    out.append(self._bytes[b])
            i = nxt[i]

    # -------------------------------------------------------------- decode

    def _piece(self, tid: int) -> bytes:
        """llama_token_to_piece(special=true) for an SPM vocabulary."""
        text, attr = self.tokens[tid], self.attrs[tid]
        if attr & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
            return text.encode("utf-8")
        if attr & A_NORMAL:
            return text.replace(_ESCAPED_SPACE, _SPACE).encode("utf-8")
        if attr & A_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def piece(self, tid: int, special: bool = True) -> bytes:
        if not special and self.attrs[tid] & (A_CONTROL | A_UNKNOWN):
            return b""
        return self._pieces[tid]

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """llama_detokenize: a leading BOS/EOS dropped on request, and (add_space_prefix) the
        first piece's leading space removed unless a BOS was dropped before it."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos:
            ids = ids[:-1]
        out = []
        for tid in ids:
            p = self.piece(tid, unparse_special)
            if remove_space and p.startswith(b" "):
                p = p[1:]
            remove_space = False
            out.append(p)
        return b"".join(out)                        # clean_spaces is off for SPM vocabularies

    def detokenize(self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        return self.detokenize_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")


def _raw_bytes(sym: str) -> bytes:
    """The bytes of a symbol: an escaped byte (U+DC80..U+DCFF, encode_bytes) is itself."""
    return b"".join(bytes([ord(c) - 0xDC00]) if 0xDC80 <= ord(c) <= 0xDCFF else c.encode("utf-8", "surrogatepass")
                    for c in sym)


_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)     # unicode_len_utf8, by the high nibble


def _symbols(text: str) -> list[str]:
    """The session's first split: one symbol per unicode_len_utf8 of its first byte (cut at the
    end). Over valid UTF-8 that is one per character; escaped bytes (encode_bytes) split on the
    raw bytes, so a bad lead byte takes the bytes after it along (they stay escaped)."""
    if not any(0xDC80 <= ord(c) <= 0xDCFF for c in text):
        return list(text)
    raw = b"".join(_raw_bytes(c) for c in text)
    syms, i = [], 0
    while i < len(raw):
        n = min(_UTF8_LEN[raw[i] >> 4], len(raw) - i)
        syms.append(raw[i:i + n].decode("utf-8", "surrogateescape"))
        i += n
    return syms
