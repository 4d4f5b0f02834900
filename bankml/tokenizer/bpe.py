"""llama_tokenize for byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`), in Python.

    tok = tokenizer_for(model)                      # or Tokenizer.from_gguf(read_gguf(path))
    ids = tok.encode("Hello", add_special=True, parse_special=True)
    text = tok.decode(ids)                          # llama_token_to_piece(special=true) of each id
    for piece in tok.stream(ids): ...               # text only once its UTF-8 is complete

The steps are llama.cpp's (src/llama-vocab.cpp, src/unicode.cpp): special tokens cut the text
first (tokenizer_st_partition), each remaining fragment is split by the pre-tokenizer that
`tokenizer.ggml.pre` names (unicode_regex_split), each word is byte-encoded and merged by BPE
rank (llm_tokenizer_bpe_session), then BOS/EOS are added as the header says.
"""
from __future__ import annotations

import heapq
import unicodedata
from typing import Iterable

from bankml.errors import ModelRefused
from bankml.gguf.reader import GGUF_ARRAY, GGUF_STRING
from bankml.numerics.stdsort import std_sort
from bankml.tokenizer.vocab import EOG_TEXTS, FIM_TEXTS, FIMEOG_TEXTS, PieceVocab, st_partition

# llama_token_type (gguf token_type) -> llama_token_attr bits we use
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# unicode_cpt_flags (src/unicode.h)
UNDEFINED, NUMBER, LETTER, SEPARATOR, MARK, PUNCT, SYMBOL, CTRL = 1, 2, 4, 8, 0x10, 0x20, 0x40, 0x80
WHITESPACE = 0x100
_CATEGORY = {"C": CTRL, "L": LETTER, "M": MARK, "N": NUMBER, "P": PUNCT, "S": SYMBOL, "Z": SEPARATOR}

# unicode_set_whitespace (src/unicode-data.cpp): \s for the custom splitters
_WHITESPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

# llama.cpp's flags table is Unicode 15.1; Python 3.11's unicodedata is 14.0. These are the
# codepoints it assigns that 14.0 leaves unassigned (first, last, flag); the oracle test
# tests/tokenizer/test_bpe.py::test_unicode_flags_equal_llama_cpp_table checks every codepoint.
_UNICODE_15_1 = (
    (0xcf3, 0xcf3, 0x10), (0xece, 0xece, 0x10), (0x2ffc, 0x2fff, 0x40), (0x31ef, 0x31ef, 0x40),
    (0x10efd, 0x10eff, 0x10), (0x1123f, 0x11240, 0x4), (0x11241, 0x11241, 0x10), (0x11b00, 0x11b09, 0x20),
    (0x11f00, 0x11f01, 0x10), (0x11f02, 0x11f02, 0x4), (0x11f03, 0x11f03, 0x10), (0x11f04, 0x11f10, 0x4),
    (0x11f12, 0x11f33, 0x4), (0x11f34, 0x11f3a, 0x10), (0x11f3e, 0x11f42, 0x10), (0x11f43, 0x11f4f, 0x20),
    (0x11f50, 0x11f59, 0x2), (0x1342f, 0x1342f, 0x4), (0x13439, 0x1343f, 0x80), (0x13440, 0x13440, 0x10),
    (0x13441, 0x13446, 0x4), (0x13447, 0x13455, 0x10), (0x1b132, 0x1b132, 0x4), (0x1b155, 0x1b155, 0x4),
    (0x1d2c0, 0x1d2d3, 0x2), (0x1df25, 0x1df2a, 0x4), (0x1e030, 0x1e06d, 0x4), (0x1e08f, 0x1e08f, 0x10),
    (0x1e4d0, 0x1e4eb, 0x4), (0x1e4ec, 0x1e4ef, 0x10), (0x1e4f0, 0x1e4f9, 0x2), (0x1f6dc, 0x1f6dc, 0x40),
    (0x1f774, 0x1f776, 0x40), (0x1f77b, 0x1f77f, 0x40), (0x1f7d9, 0x1f7d9, 0x40), (0x1fa75, 0x1fa77, 0x40),
    (0x1fa87, 0x1fa88, 0x40), (0x1faad, 0x1faaf, 0x40), (0x1fabb, 0x1fabd, 0x40), (0x1fabf, 0x1fabf, 0x40),
    (0x1face, 0x1facf, 0x40), (0x1fada, 0x1fadb, 0x40), (0x1fae8, 0x1fae8, 0x40), (0x1faf7, 0x1faf8, 0x40),
    (0x2b739, 0x2b739, 0x4), (0x2ebf0, 0x2ee5d, 0x4), (0x31350, 0x323af, 0x4),
)
_flag_memo: dict[str, int] = {}


def cpt_flags(ch: str) -> int:
    """unicode_cpt_flags_from_cpt: the category bit, plus WHITESPACE."""
    f = _flag_memo.get(ch)
    if f is None:
        c = ord(ch)
        cat = unicodedata.category(ch)
        f = UNDEFINED if cat == "Cn" else _CATEGORY[cat[0]]
        if f == UNDEFINED:
            for lo, hi, flag in _UNICODE_15_1:
                if lo <= c <= hi:
                    f = flag
        if c in _WHITESPACE:
            f |= WHITESPACE
        _flag_memo[ch] = f
    return f


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character map (unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    m, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in m:
            m[b] = chr(256 + n)
            n += 1
    return m


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


# ---------------------------------------------------------------- pre-tokenizers (unicode.cpp)

def _split_numbers(text: str, flags: list[int], pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`\\p{N}` through std::regex on the collapsed text: each number codepoint alone."""
    out = []
    for lo, hi in pieces:
        start = lo
        for i in range(lo, hi):
            if flags[i] & NUMBER and not flags[i] & WHITESPACE:
                if i > start:
                    out.append((start, i))
                out.append((i, i + 1))
                start = i + 1
        if start < hi:
            out.append((start, hi))
    return out


def _contraction(text: str, pos: int, end: int, fold: bool) -> int:
    """Length of 's 't 're 've 'm 'll 'd at pos (0 if none); `fold` makes it case-insensitive."""
    if text[pos] != "'" or pos + 1 >= end:
        return 0
    a = text[pos + 1].lower() if fold else text[pos + 1]
    if len(a) == 1 and a in "stmd":
        return 2
    if pos + 2 < end:
        b = text[pos + 2].lower() if fold else text[pos + 2]
        if a + b in ("re", "ve", "ll"):
            return 3
    return 0


def _split_gpt2(text: str, flags: list[int], pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """unicode_regex_split_custom_gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    out = []
    for lo, hi in pieces:
        def fl(p):
            return flags[p] if p < hi else 0
        pos = lo
        while pos < hi:
            n = _contraction(text, pos, hi, fold=False)
            if n:
                out.append((pos, pos + n))
                pos += n
                continue
            sp = text[pos] == " "
            f2 = fl(pos + 1) if sp else flags[pos]
            start = pos
            for want in (LETTER, NUMBER):
                if f2 & want:
                    pos += sp
                    while fl(pos) & want:
                        pos += 1
                    break
            else:
                if not f2 & (WHITESPACE | LETTER | NUMBER) and f2:
                    pos += sp
                    while not fl(pos) & (WHITESPACE | LETTER | NUMBER) and fl(pos):
                        pos += 1
            if pos > start:
                out.append((start, pos))
                continue
            ws = 0
            while fl(pos + ws) & WHITESPACE:
                ws += 1
            if ws > 1 and pos + ws < hi:
                pos += ws - 1                       # \s+(?!\S)
            else:
                pos += max(ws, 1)                   # \s+, or no match
            out.append((start, pos))
    return out


def _split_qwen2(text: str, flags: list[int], pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """unicode_regex_split_custom_qwen2: (?i:'s|..)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    out = []
    for lo, hi in pieces:
        def fl(p):
            return flags[p] if p < hi else 0
        pos = lo
        while pos < hi:
            start, ch, f = pos, text[pos], flags[pos]
            n = _contraction(text, pos, hi, fold=True)
            if n:
                pos += n
            elif ch not in "\r\n" and not f & NUMBER and (f & LETTER or fl(pos + 1) & LETTER):
                pos += 1
                while fl(pos) & LETTER:
                    pos += 1
            elif f & NUMBER:
                pos += 1
            else:
                sp = ch == " "
                f2 = fl(pos + 1) if sp else f
                if not f2 & (WHITESPACE | LETTER | NUMBER) and f:
                    pos += sp
                    while not fl(pos) & (WHITESPACE | LETTER | NUMBER) and fl(pos):
                        pos += 1
                    while pos < hi and text[pos] in "\r\n":
                        pos += 1
                else:
                    ws, last_rn = 0, 0
                    while fl(pos + ws) & WHITESPACE:
                        if text[pos + ws] in "\r\n":
                            last_rn = pos + ws + 1
                        ws += 1
                    if last_rn:
                        pos = last_rn               # \s*[\r\n]+
                    elif ws > 1 and pos + ws < hi:
                        pos += ws - 1               # \s+(?!\S)
                    else:
                        pos += max(ws, 1)           # \s+, or no match
            out.append((start, pos))
    return out


# tokenizer.ggml.pre -> the splitters llm_tokenizer_bpe applies in order
PRE_TOKENIZERS = {
    "smollm": (_split_numbers, _split_gpt2),
    "qwen2": (_split_qwen2,),
}
_INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)     # gguf integer value types, u8 .. i64


def bpe_vocab_refusal(metadata: dict, value_types: dict) -> str | None:
    """Why a gpt2 BPE vocabulary cannot load (tokenizer/__init__.py's vocab_refusal asks), or None."""
    pre = metadata.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        what = "missing (llama.cpp's 'default')" if pre is None else repr(pre)
        return (f"tokenizer.ggml.pre is {what}; bankml implements the "
                f"{' '.join(sorted(PRE_TOKENIZERS))} pre-tokenizers")
    for key, element_types, what in (("tokenizer.ggml.tokens", (GGUF_STRING,), "strings"),
                                     ("tokenizer.ggml.merges", (GGUF_STRING,), "strings"),
                                     ("tokenizer.ggml.token_type", _INT_TYPES, "integers")):
        vtype = value_types.get(key)
        if vtype is None:
            return f"key {key} is missing; a gpt2 BPE tokenizer needs it"
        if vtype[0] != GGUF_ARRAY or vtype[1] not in element_types or len(metadata[key]) == 0:
            return f"key {key} is empty or not an array of {what}"
    n_tokens, n_types = len(metadata["tokenizer.ggml.tokens"]), len(metadata["tokenizer.ggml.token_type"])
    if n_types != n_tokens:
        return f"key tokenizer.ggml.token_type has {n_types} entries for {n_tokens} tokens"
    return None


# pre-tokenizers whose llama.cpp vocab loader sets clean_spaces = false (others: true); both of
# PRE_TOKENIZERS are (llama_vocab::impl::load: "smollm" and the "qwen2" family)
_NO_CLEAN_SPACES = {"smollm", "qwen2"}


class Tokenizer(PieceVocab):
    """One GGUF vocabulary: encode, decode, pieces, special ids."""

    def __init__(self, tokens: list[str], token_types: Iterable[int], merges: list[str], pre: str,
                 bos: int | None, eos: int | None, add_bos: bool = False, add_eos: bool = False,
                 name: str = "model"):
        if pre not in PRE_TOKENIZERS:
            raise ModelRefused(f"{name}: tokenizer.ggml.pre is {pre!r}; bankml's tokenizer supports "
                               f"{' '.join(sorted(PRE_TOKENIZERS))}")
        self.tokens = tokens
        self.types = [int(t) for t in token_types]
        self.pre, self.bos, self.eos, self.add_bos, self.add_eos = pre, bos, eos, add_bos, add_eos
        self.clean_spaces = pre not in _NO_CLEAN_SPACES
        self.token_to_id = {t: i for i, t in enumerate(tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for i, m in enumerate(merges):
            cut = m.find(" ", 1)
            self.ranks.setdefault((m[:cut], m[cut + 1:]) if cut >= 0 else (m, ""), i)
        eog = {i for i, t in enumerate(tokens) if t in EOG_TEXTS or t in FIMEOG_TEXTS}
        for i, t in enumerate(tokens):
            if (i in eog or t in FIM_TEXTS) and self.types[i] != CONTROL:
                self.types[i] = CONTROL             # llama.cpp overrides control-looking tokens
        self.eog = frozenset(eog | ({eos} if eos is not None else set()))
        # tokenizer_st_partition's order: longest text first, equal lengths as libstdc++'s std::sort
        # leaves them (it matters only where two special texts of one length can overlap)
        self.special = [i for i, t in enumerate(self.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        std_sort(self.special, key=lambda i: len(tokens[i].encode()))
        self._pieces = [self._piece(i) for i in range(len(tokens))]
        self._word_cache: dict[str, list[int]] = {}

    refusal = staticmethod(bpe_vocab_refusal)

    @classmethod
    def from_metadata(cls, md: dict, name: str) -> "Tokenizer":
        return cls(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"], md["tokenizer.ggml.merges"],
                   md["tokenizer.ggml.pre"], md.get("tokenizer.ggml.bos_token_id"),
                   md.get("tokenizer.ggml.eos_token_id"), bool(md.get("tokenizer.ggml.add_bos_token", False)),
                   bool(md.get("tokenizer.ggml.add_eos_token", False)), name)

    # -------------------------------------------------------------- encode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special)."""
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos)
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
            else:
                self._encode_text(frag, out)
        if add_special and self.add_eos:
            out.append(self.eos)
        return out

    def encode_bytes(self, raw: bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize of bytes that need not be UTF-8 (unicode_cpts_from_utf8: see utf8_lossy)."""
        return self.encode(utf8_lossy(raw), add_special, parse_special)

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        return st_partition(text, [(sid, self.tokens[sid]) for sid in self.special
                                   if parse_special or self.types[sid] not in (CONTROL, UNKNOWN)])

    def _encode_text(self, text: str, out: list[int]) -> None:
        flags = [cpt_flags(c) for c in text]
        pieces = [(0, len(text))]
        for split in PRE_TOKENIZERS[self.pre]:
            pieces = split(text, flags, pieces)
        cache = self._word_cache
        for lo, hi in pieces:
            word = "".join(BYTE_TO_CHAR[b] for b in text[lo:hi].encode("utf-8", "surrogatepass"))
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._bpe(word)
            out.extend(ids)

    def _bpe(self, word: str) -> list[int]:
        """llm_tokenizer_bpe_session: merge the lowest-rank pair, leftmost first."""
        syms = list(word)
        n = len(syms)
        prev, nxt = list(range(-1, n - 1)), [*range(1, n), -1]
        heap: list[tuple[int, int, int, str]] = []
        ranks = self.ranks

        def add(left: int, right: int) -> None:
            if left != -1 and right != -1:
                r = ranks.get((syms[left], syms[right]))
                if r is not None:
                    heapq.heappush(heap, (r, left, right, syms[left] + syms[right]))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not syms[left] or not syms[right] or syms[left] + syms[right] != text:
                continue                            # outdated
            syms[left], syms[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        ids = []
        for s in syms:
            if not s:
                continue
            tid = self.token_to_id.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            for b in s.encode("utf-8"):             # byte fallback: single-byte tokens only
                tid = self.token_to_id.get(chr(b)) if b < 0x80 else None
                if tid is not None:
                    ids.append(tid)
        return ids

    # -------------------------------------------------------------- decode

    def _piece(self, tid: int) -> bytes:
        """llama_token_to_piece(special=true) for a BPE vocabulary."""
        text, typ = self.tokens[tid], self.types[tid]
        if typ == NORMAL:
            out = bytearray()
            for c in text:
                b = CHAR_TO_BYTE.get(c)
                if b is None:
                    u = c.encode("utf-8")
                    out += b"[UNK_BYTE_0x" + u.hex().encode() + text.encode("utf-8") + b"]"
                else:
                    out.append(b)
            return bytes(out)
        if typ in (CONTROL, USER_DEFINED, UNKNOWN):
            return text.encode("utf-8")
        return b""

    def piece(self, tid: int, special: bool = True) -> bytes:
        if not special and self.types[tid] in (CONTROL, UNKNOWN):
            return b""
        return self._pieces[tid]

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """llama_detokenize for a BPE vocabulary: a leading BOS / trailing EOS dropped on request,
        the pieces joined, then (clean_spaces) llama.cpp's three clean-up passes."""
        ids = list(ids)
        if remove_special and self.add_bos and ids and ids[0] == self.bos:
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos:
            ids = ids[:-1]
        text = b"".join(self.piece(i, unparse_special) for i in ids)
        return clean_spaces(text) if self.clean_spaces else text


def clean_spaces(text: bytes) -> bytes:
    """llama_vocab::impl::detokenize's clean_spaces passes: drop the space before ? ! . , ; drop
    the spaces around a lone apostrophe; drop the space before 's 'm 're 've."""
    t = bytearray(text)
    out = t[:1]                                     # " ?", " !", " .", " ,"
    for i in range(1, len(t)):
        if t[i - 1] == 0x20 and t[i] in b"?!.,":
            out.pop()
        out.append(t[i])
    t, out = out, out[:1]                           # " ' "
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            i += 1
            t[i] = 0                                # C writes '\0' over the next space and keeps it
        out.append(x)
        i += 1
    t, out = out, out[:1]                           # " 's", " 'm", " 're", " 've"
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < len(t) and (t[i + 1:i + 3] in (b"re", b"ve"))):
                out.pop()
        out.append(x)
    return bytes(out)


def utf8_lossy(b: bytes) -> str:
    """unicode_cpts_from_utf8 (src/unicode.cpp): a byte that does not start a complete sequence
    becomes U+FFFD and the scan goes on at the next byte (Python's "replace" groups bytes otherwise)."""
    out, i, n = [], 0, len(b)
    while i < n:
        x = b[i]
        need = 0 if x < 0x80 else -1 if x < 0xC0 else 1 if x < 0xE0 else 2 if x < 0xF0 else 3 if x < 0xF8 else -1
        if need < 0 or i + need >= n or any((b[i + j] & 0xC0) != 0x80 for j in range(1, need + 1)):
            out.append("\ufffd")
            i += 1
            continue
        cpt = x & (0x7F, 0x1F, 0x0F, 0x07)[need]
        for j in range(1, need + 1):
            cpt = (cpt << 6) | (b[i + j] & 0x3F)
        out.append(chr(cpt) if cpt <= 0x10FFFF else "\ufffd")
        i += need + 1
    return "".join(out)
