"""The tokenizer calls DRY's sequence-breaker processing makes (llama_sampler_init_dry): the
text of one token (llama_vocab::detokenize, clean_spaces included) and llama_tokenize of the rest of
a breaker, bytes that need not be UTF-8; and the suppress tokens the chain bans."""
from __future__ import annotations

import ctypes

import pytest

from bankml.oracle.vocab import Vocab
from bankml.testing import models
from bankml.tokenizer import tokenizer_for
from bankml.tokenizer.bpe import clean_spaces, utf8_lossy

N_VOCAB = 49152


def test_utf8_lossy_replaces_each_bad_byte_as_unicode_cpts_from_utf8():
    assert utf8_lossy("日本".encode()[1:]) == "\ufffd\ufffd本"
    assert utf8_lossy(b"a\xe6\x97") == "a\ufffd\ufffd"         # Python's "replace" gives one
    assert utf8_lossy("x€y".encode()) == "x€y"


TAILS = ["日本".encode()[1:], "日本".encode()[2:], "日本".encode()[4:], b"\x80abc", "é:".encode()[1:],
         "🙂x".encode()[1:], "🙂x".encode()[3:], b"\xe6\x9c", b"ok \xff\xfe done", "日本".encode()]


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["smollm2-q4_1", "gemma3-vocab-prefix"])
def test_encode_bytes_is_llama_tokenize_of_bytes_that_are_not_utf8(name):
    """DRY tokenizes the rest of a breaker from a byte inside a character on: BPE reads such bytes
    as U+FFFD each, SentencePiece gives them byte tokens."""
    tok = tokenizer_for(models.path(name))
    with Vocab(models.path(name)) as v:
        for raw in TAILS:
            out = (ctypes.c_int32 * 64)()
            n = v.lib.llama_tokenize(v.vocab, raw, len(raw), out, 64, False, False)
            assert tok.encode_bytes(raw, False, False) == list(out[:n]), raw


def test_clean_spaces_passes():
    assert clean_spaces(b"a , b ! it 's me 're 't ' x") == b"a, b! it's me're 't'x"


@pytest.mark.oracle
def test_dry_breaker_texts_are_llama_detokenize():
    """get_overlapping_token_sequences reads vocab.detokenize({id}, special=true) of every token."""
    tok = tokenizer_for(models.path("smollm2-q4_1"))
    with Vocab(models.path("smollm2-q4_1")) as v:
        assert all(tok.detokenize_bytes([i], False, True) == v.detokenize([i], False, True) for i in range(N_VOCAB))


def vocab_copy(src, dst, keys: dict):
    """src's header (no tensors) with `keys` set (new int lists are INT32 arrays): a vocabulary
    libllama loads vocab_only."""
    import gguf
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), reader.get_field("general.architecture").contents())
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, keys.pop(key, field.contents()), field.types[0], sub_type=sub)
    for key, value in keys.items():
        w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.oracle
def test_clean_spaces_is_llama_detokenize_with_clean_spaces(tmp_path):
    """SmolLM2's vocabulary relabelled with the gpt-2 pre-tokenizer, for which llama.cpp sets
    clean_spaces: llama_detokenize of texts where the three passes bite is clean_spaces() of the
    joined pieces (bankml's tokenizer does not take gpt-2, so the pieces come from smollm's)."""
    tok = tokenizer_for(models.path("smollm2-q4_1"))
    dst = vocab_copy(models.path("smollm2-vocab-specials"), tmp_path / "gpt2.gguf", {"tokenizer.ggml.pre": "gpt-2"})
    texts = ["Is it ? Yes ! a , b . c", "it 's he 'd we 're they 've I 'm don 't you 'll", " ' x ' ' y", "a ' ' ' b",
             "' s", " '", "x '", " 're", "  , ,", "'s 'm"]
    cleaned = 0
    with Vocab(dst) as v:
        for text in texts:
            ids = tok.encode(text, False)
            want, joined = v.detokenize(ids, False, True), b"".join(tok.piece(i) for i in ids)
            assert clean_spaces(joined) == want, text
            cleaned += want != joined
    assert cleaned >= 7


@pytest.mark.oracle
def test_bpe_detokenize_bytes_is_llama_detokenize_for_qwen2():
    """Qwen2's vocabulary (llama.cpp turns clean_spaces off for its pre-tokenizer, as for smollm):
    single tokens as DRY reads them, and texts where the clean-up passes would bite (" ?", " ' ",
    " 's", " 're", " 't") but must not."""
    path = models.path("qwen3-small-q2_0")
    tok = tokenizer_for(path)
    assert not tok.clean_spaces
    texts = ["Is it ? Yes ! a , b .", "it 's he 'd we 're they 've I 'm don 't you 'll", " ' x ' ' y", "a ' ' ' b",
             "' s", " '", "x '"]
    with Vocab(path) as v:
        assert all(tok.detokenize_bytes([i], False, True) == v.detokenize([i], False, True) for i in range(tok.n_vocab))
        for text in texts:
            ids = tok.encode(text, False)
            assert tok.detokenize_bytes(ids, False, True) == v.detokenize(ids, False, True), text


@pytest.mark.oracle
def test_suppress_tokens_are_read_as_llama_vocab(tmp_path):
    """tokenizer.ggml.suppress_tokens, out-of-range ids dropped as llama_vocab's loader does: the
    ids llama_vocab_get_suppress_tokens reports."""
    dst = vocab_copy(models.path("smollm2-vocab-specials"), tmp_path / "suppress.gguf",
                     {"tokenizer.ggml.suppress_tokens": [11, -3, 2, 10 ** 6, 11]})
    tok = tokenizer_for(dst)
    with Vocab(dst) as v:
        fn = v.lib.llama_vocab_get_suppress_tokens
        fn.restype, fn.argtypes = ctypes.POINTER(ctypes.c_int32), [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        n = ctypes.c_int32()
        ids = fn(v.vocab, ctypes.byref(n))
        assert tok.suppress_tokens == tuple(ids[:n.value]) == (11, 2, 11)
