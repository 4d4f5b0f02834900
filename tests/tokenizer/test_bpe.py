"""The BPE tokenizer against llama_tokenize / llama_token_to_piece of llama.cpp b11434."""
from __future__ import annotations

import heapq
import json
import re
import unicodedata
from pathlib import Path

import pytest

from bankml import oracle
from bankml.oracle.paths import source_dir
from bankml.tokenizer import tokenizer_for
from bankml.tokenizer.bpe import cpt_flags
from bankml.tokenizer.vocab import StreamDecoder
from bankml.testing import models

CORPUS = json.loads((Path(__file__).parents[1] / "data" / "tokenizer_corpus.json").read_text("utf-8"))
VOCABS = ["smollm2-q4_1", "qwen3-small-q1_0"]          # pre-tokenizers smollm and qwen2


def tok(name):
    return tokenizer_for(models.path(name))


@pytest.mark.oracle
@pytest.mark.parametrize("parse_special", [False, True], ids=["text", "parse_special"])
@pytest.mark.parametrize("name", VOCABS)
def test_corpus_tokens_equal_llama_tokenize(servers, name, parse_special):
    srv, t = servers(name), tok(name)
    bad = [(s, t.encode(s, True, parse_special), want) for s in CORPUS
           if t.encode(s, True, parse_special) != (want := srv.tokenize(s, True, parse_special))]
    assert not bad, f"{len(bad)} of {len(CORPUS)} differ, first: {bad[0]!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("name", VOCABS)
def test_tokens_equal_oracle_harness(name):
    """The C-API harness (llama_tokenize itself) agrees too, add_special on and off."""
    p, t = models.path(name), tok(name)
    for s in CORPUS[::40]:
        for add_special, parse_special in [(True, True), (False, False)]:
            assert t.encode(s, add_special, parse_special) == oracle.tokenize(p, s, add_special, parse_special), s


@pytest.mark.oracle
@pytest.mark.parametrize("name", VOCABS)
def test_pieces_equal_llama_token_to_piece(name):
    want, t = oracle.pieces(models.path(name)), tok(name)
    assert [t.piece(i) for i in range(t.n_vocab)] == want


@pytest.mark.oracle
def test_unicode_flags_equal_llama_cpp_table():
    """Every codepoint's category and whitespace flag equals src/unicode-data.cpp's."""
    src = (source_dir() / "src" / "unicode-data.cpp").read_text()
    body = re.search(r"unicode_ranges_flags = \{.*?\n(.*?)\n\};", src, re.S).group(1)
    ranges = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)]
    ws = re.search(r"unicode_set_whitespace = \{(.*?)\};", src, re.S).group(1)
    ws = {int(x, 16) for x in re.findall(r"0x([0-9A-F]+)", ws)}
    bad = []
    for (lo, flag), (hi, _) in zip(ranges, ranges[1:]):
        for c in range(lo, hi):
            if 0xD800 <= c < 0xE000:
                continue                            # surrogates never reach the tokenizer
            want = flag | (0x100 if c in ws else 0)
            if cpt_flags(chr(c)) != want:
                bad.append(hex(c))
    assert not bad, f"{len(bad)} codepoints differ (Python unicodedata {unicodedata.unidata_version}): {bad[:10]}"


@pytest.mark.parametrize("name", VOCABS)
def test_decode_round_trips_corpus(name):
    t = tok(name)
    for s in CORPUS:
        for parse_special in (False, True):
            assert t.decode(t.encode(s, add_special=False, parse_special=parse_special)) == s


def test_stream_yields_only_complete_utf8():
    t = tok("smollm2-q4_1")
    s = "emoji 😀🎉 日本語 é 👨‍👩‍👧‍👦 ok"
    ids = t.encode(s, add_special=False)
    assert any(len(t.piece(i).decode("utf-8", "ignore").encode()) != len(t.piece(i)) for i in ids)  # split chars
    parts = list(t.stream(ids))
    assert "".join(parts) == s and all("\ufffd" not in p for p in parts)


def test_stream_decoder_holds_partial_sequence():
    t = tok("smollm2-q4_1")
    byte_ids = {t.piece(i): i for i in range(t.n_vocab) if len(t.piece(i)) == 1}
    d = StreamDecoder(t)
    e = "é".encode()
    assert d.push(byte_ids[e[:1]]) == "" and d.push(byte_ids[e[1:]]) == "é"


def test_add_bos_follows_header():
    t = tok("smollm2-q4_1")                         # add_bos_token = false in the header
    assert t.encode("hi", add_special=True) == t.encode("hi", add_special=False)
    assert 2 in t.eog and 0 in t.eog               # <|im_end|> (EOS), <|endoftext|>


def test_tokenizing_10kb_does_linear_work(monkeypatch):
    """Each distinct word is merged once (the word cache), and merging a word pushes at most
    3 pairs per character (n-1 first, then 2 per merge) on the heap: no quadratic rescans."""
    t = tok("smollm2-q4_1")
    text = (Path(__file__).read_text() * 4)[:10_000]
    t._word_cache.clear()
    words, pushes, bpe, push = [], [0], t._bpe, heapq.heappush

    def counted_push(heap, item):
        pushes[0] += 1
        push(heap, item)
    monkeypatch.setattr(t, "_bpe", lambda word: words.append(word) or bpe(word))
    monkeypatch.setattr(heapq, "heappush", counted_push)
    ids = t.encode(text)
    assert t.decode(ids) == text
    assert words and len(words) == len(set(words))
    assert 0 < pushes[0] <= 3 * sum(len(w) for w in words)


@pytest.mark.oracle
def test_overlapping_special_texts_of_equal_length_cut_in_std_sort_order():
    """SmolLM2's vocabulary with user-defined "{{{~" and "~}}}" (and longer kin), which both fit
    "{{{~}}}": the first in tokenizer_st_partition's order (libstdc++'s std::sort by length) cuts."""
    from bankml.oracle.vocab import Vocab
    name = "smollm2-vocab-specials"
    t = tok(name)
    assert all(s in t.token_to_id for s in models.OVERLAPPING_SPECIALS)
    with Vocab(models.path(name)) as v:
        for s in ["{" * k + "~" + "}" * k for k in range(3, 10)]:
            for parse_special in (False, True):
                assert t.encode(s, False, parse_special) == v.tokenize(s, False, parse_special), s
    by_id = sorted(sorted(t.special), key=lambda i: -len(t.tokens[i].encode()))
    assert by_id != t.special                       # the two orders differ on this vocabulary
