"""The SentencePiece tokenizer against llama.cpp b11434 on the real Gemma-3-270M vocabulary.

Two vocabularies: Gemma's own (add_bos, no space prefix), and the same tokens with
add_space_prefix and add_eos switched on (a vocab-only copy, tests/models `gemma3-vocab-prefix`),
so the space-prefix and leading-space rules Gemma leaves off are compared too. The oracles are
llama-server's /tokenize, the bankml-oracle harness, and libllama's own functions (oracle.vocab).
"""
from __future__ import annotations

import heapq
import json
from pathlib import Path

import pytest

from bankml import oracle
from bankml.oracle.vocab import Vocab
from bankml.tokenizer import tokenizer_for, vocab_refusal
from bankml.tokenizer.spm import A_BYTE, SpmTokenizer
from bankml.testing import models

CORPUS = json.loads((Path(__file__).parents[1] / "data" / "tokenizer_corpus.json").read_text("utf-8"))
GEMMA, PREFIX = "gemma3-270m-q4_k_m", "gemma3-vocab-prefix"
# Gemma's own special and user-defined texts, and texts whose merges tie on score
EXTRA = ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos><eos>", "<eos>x", "</s>",
         "a</s>b", "<b>bold</b> <i>x</i>", "<table><tr><td>1</td></tr></table>", "<0x41>", "[multimodal]",
         "<start_of_image><end_of_image>", "<unused5>", "<unk>", "<pad><mask>", "\t\tx\t", "x\n\n\n\n\n\ny",
         "   lead", "a" * 33, "x" * 300, "ab" * 9, "aaaa bbbb aaaa", "ـــــ", "🎉" * 5, "𮯰𮯰 \U0010fffd",
         "a\u2581b \u2581\u2581"]                           # a literal U+2581 is a space to SentencePiece
TEXTS = CORPUS + EXTRA


@pytest.fixture(scope="module")
def libllama():
    made = {}
    yield lambda name: made.setdefault(name, Vocab(models.path(name)))
    for v in made.values():
        v.close()


def tok(name):
    return tokenizer_for(models.path(name))


@pytest.mark.oracle
@pytest.mark.parametrize("parse_special", [False, True], ids=["text", "parse_special"])
def test_corpus_tokens_equal_llama_server_tokenize(servers, parse_special):
    srv, t = servers(GEMMA), tok(GEMMA)
    bad = [(s, t.encode(s, True, parse_special), want) for s in TEXTS
           if t.encode(s, True, parse_special) != (want := srv.tokenize(s, True, parse_special))]
    assert not bad, f"{len(bad)} of {len(TEXTS)} differ, first: {bad[0]!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("name", [GEMMA, PREFIX])
def test_corpus_tokens_equal_llama_tokenize(libllama, name):
    """Every corpus text, add_special and parse_special each on and off."""
    v, t = libllama(name), tok(name)
    for add_special in (False, True):
        for parse_special in (False, True):
            bad = [s for s in TEXTS
                   if t.encode(s, add_special, parse_special) != v.tokenize(s, add_special, parse_special)]
            assert not bad, f"add_special={add_special} parse_special={parse_special}: {len(bad)} differ: {bad[0]!r}"


@pytest.mark.oracle
def test_decode_equals_llama_server_detokenize(servers):
    """bankml's decode is llama-server's /detokenize: every piece (special=true) joined."""
    srv, t = servers(GEMMA), tok(GEMMA)
    for s in TEXTS[::4]:
        ids = srv.tokenize(s, True, True)
        assert t.decode(ids) == srv.post("/detokenize", {"tokens": ids})["content"], s


@pytest.mark.oracle
@pytest.mark.parametrize("name", [GEMMA, PREFIX])
def test_tokens_equal_oracle_harness(name):
    """The harness (llama_tokenize in its own process) agrees too: a sample, each call loads the vocabulary."""
    p, t = models.path(name), tok(name)
    for s in TEXTS[::100] + EXTRA[:2]:
        for add_special, parse_special in [(True, True), (False, False)]:
            assert t.encode(s, add_special, parse_special) == oracle.tokenize(p, s, add_special, parse_special), s


@pytest.mark.oracle
def test_equal_scores_merge_leftmost_first(libllama):
    """Runs of one character tie on score at every position: llama.cpp's queue takes the leftmost."""
    v, t = libllama(GEMMA), tok(GEMMA)
    for text in ["x" * n for n in range(2, 40)] + ["ab" * n for n in range(2, 12)]:
        ids = t.encode(text, add_special=False)
        assert ids == v.tokenize(text, False, False), text


@pytest.mark.oracle
def test_overlapping_special_texts_of_equal_length_cut_in_std_sort_order(libllama):
    """"{{{~" and "~}}}" both fit "{{{~}}}": the first in tokenizer_st_partition's order cuts. That
    order is libstdc++'s std::sort of the special ids by length, not by id (which gets 5 of 7 wrong)."""
    v, t = libllama(PREFIX), tok(PREFIX)
    texts = ["{" * k + "~" + "}" * k for k in range(3, 10)]
    assert all(s in t.tokens for s in models.OVERLAPPING_SPECIALS)
    for s in texts:
        assert t.encode(s, False, False) == v.tokenize(s, False, False), s
    by_id = sorted(sorted(t.special), key=lambda i: -len(t.tokens[i].encode()))
    assert by_id != t.special                       # the two orders differ on this vocabulary


@pytest.mark.oracle
def test_characters_outside_the_vocabulary_fall_back_to_byte_tokens(libllama):
    v, t = libllama(GEMMA), tok(GEMMA)
    text = "\U0010fffd and \U000e0fff"                  # private use: no token of their own
    ids = t.encode(text, add_special=False)
    assert sum(1 for i in ids if t.attrs[i] & A_BYTE) == 8       # two 4-byte characters as <0xXX>
    assert ids == v.tokenize(text, False, False) and t.decode(ids) == text


@pytest.mark.oracle
@pytest.mark.parametrize("name", [GEMMA, PREFIX])
def test_pieces_equal_llama_token_to_piece(name):
    want, t = oracle.pieces(models.path(name)), tok(name)
    assert [t.piece(i) for i in range(t.n_vocab)] == want


@pytest.mark.oracle
@pytest.mark.parametrize("name", [GEMMA, PREFIX])
def test_detokenize_equals_llama_detokenize(libllama, name):
    """remove_special and unparse_special each way, ids with and without BOS: with add_space_prefix
    the first piece loses its leading space unless a BOS was removed before it."""
    v, t = libllama(name), tok(name)
    bad = []
    for s in TEXTS[::3]:
        for add_special in (False, True):
            ids = v.tokenize(s, add_special, True)
            for remove_special in (False, True):
                for unparse_special in (False, True):
                    if t.detokenize_bytes(ids, remove_special, unparse_special) != \
                            v.detokenize(ids, remove_special, unparse_special):
                        bad.append((s, add_special, remove_special, unparse_special))
    assert not bad, f"{len(bad)} differ, first {bad[0]!r}"


@pytest.mark.oracle
@pytest.mark.parametrize("name", [GEMMA, PREFIX])
def test_token_attributes_and_eog_equal_libllama(libllama, name):
    """llama.cpp's attrs after its loader's rules (EOG texts made control, 'unused' control tokens)."""
    v, t = libllama(name), tok(name)
    assert t.attrs == v.attrs() and t.eog == v.eog()


def test_decode_round_trips_corpus():
    t = tok(GEMMA)
    for s in TEXTS:
        if "\u2581" in s:
            continue                                # it comes back as a space, in llama.cpp too
        for parse_special in (False, True):
            assert t.decode(t.encode(s, add_special=False, parse_special=parse_special)) == s


def test_header_flags_reach_the_tokenizer():
    g, p = tok(GEMMA), tok(PREFIX)
    assert (g.add_bos, g.add_eos, g.add_space_prefix) == (True, False, False)
    assert (p.add_bos, p.add_eos, p.add_space_prefix) == (True, True, True)
    assert g.encode("hi")[0] == g.bos and p.encode("hi")[-1] == p.eos
    assert p.encode("hi", add_special=False) != g.encode("hi", add_special=False)           # the space prefix


def test_merging_10kb_pushes_at_most_3_pairs_per_character(monkeypatch):
    """n-1 pairs first, then at most 2 per merge: no quadratic rescans."""
    t = tok(GEMMA)
    text = (Path(__file__).read_text() * 4)[:10_000]
    pushes, push = [0], heapq.heappush

    def counted_push(heap, item):
        pushes[0] += 1
        push(heap, item)
    monkeypatch.setattr(heapq, "heappush", counted_push)
    ids = t.encode(text, add_special=False)
    assert t.decode(ids) == text
    assert 0 < pushes[0] <= 3 * len(text)


def test_refuses_bad_spm_vocabulary_in_one_line():
    from bankml.gguf.reader import GGUF_ARRAY, GGUF_FLOAT32, GGUF_INT32, GGUF_STRING
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
          "tokenizer.ggml.scores": [0.0] * 4, "tokenizer.ggml.token_type": [2, 3, 3, 1]}
    vt = {"tokenizer.ggml.model": (8,), "tokenizer.ggml.tokens": (GGUF_ARRAY, GGUF_STRING),
          "tokenizer.ggml.scores": (GGUF_ARRAY, GGUF_FLOAT32), "tokenizer.ggml.token_type": (GGUF_ARRAY, GGUF_INT32)}
    assert vocab_refusal(md, vt) is None
    assert SpmTokenizer(md["tokenizer.ggml.tokens"], None, None, add_space_prefix=False).encode("aa") == [1, 3, 3]
    bad_scores = {**vt, "tokenizer.ggml.scores": (GGUF_ARRAY, GGUF_STRING)}
    assert "scores is not an array of f32 or i32" in vocab_refusal(md, bad_scores)
    assert "token_type has 3 entries for 4 tokens" in vocab_refusal({**md, "tokenizer.ggml.token_type": [1] * 3}, vt)
    assert "no BOS token" in vocab_refusal({**md, "tokenizer.ggml.tokens": ["<unk>"]}, vt)
    assert "Phi-3" in vocab_refusal({**md, "general.name": "Phi-3 mini"}, vt)
