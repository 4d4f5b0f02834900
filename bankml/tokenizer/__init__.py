"""llama_tokenize in Python, for the vocabularies llama.cpp loads: byte-level BPE
(`tokenizer.ggml.model = gpt2`, bpe.py) and SentencePiece (`llama`, spm.py); vocab.py holds what
they share.

    tok = tokenizer_for(model)                      # made once per bankml Model (or GGUF path)
    why = vocab_refusal(metadata, value_types)      # plan(): why a header's vocabulary cannot load
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path

from bankml.tokenizer.bpe import Tokenizer, bpe_vocab_refusal
from bankml.tokenizer.spm import SpmTokenizer, spm_vocab_refusal
from bankml.tokenizer.vocab import PieceVocab

# tokenizer.ggml.model values llama.cpp knows (llama_vocab::impl::load) that bankml does not implement
OTHER_TOKENIZER_MODELS = {"bert": "WordPiece", "t5": "Unigram", "rwkv": "RWKV",
                          "plamo2": "PLaMo-2", "no_vocab": "no vocabulary"}


def vocab_refusal(metadata: dict, value_types: dict) -> str | None:
    """Why a GGUF header's vocabulary is one bankml's tokenizer cannot load, naming the key; None if it can.

    plan() refuses on it, so a model is refused before any weight is read rather than when it
    first tokenizes."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        return spm_vocab_refusal(metadata, value_types)
    if kind != "gpt2":
        what = "missing" if kind is None else repr(kind)
        if kind in OTHER_TOKENIZER_MODELS:
            what += f" ({OTHER_TOKENIZER_MODELS[kind]})"
        return f"tokenizer.ggml.model is {what}; bankml implements gpt2 BPE and llama SentencePiece tokenizers"
    return bpe_vocab_refusal(metadata, value_types)


def from_gguf(gguf, name: str) -> PieceVocab:
    """The tokenizer `tokenizer.ggml.model` names: SentencePiece for llama, BPE otherwise."""
    if gguf.metadata.get("tokenizer.ggml.model") == "llama":
        return SpmTokenizer.from_gguf(gguf, name)
    return Tokenizer.from_gguf(gguf, name)


_cache: "weakref.WeakKeyDictionary[object, PieceVocab]" = weakref.WeakKeyDictionary()
_path_cache: dict[str, PieceVocab] = {}


def tokenizer_for(model) -> PieceVocab:
    """The Tokenizer of a bankml Model (made once per model), or of a GGUF path."""
    if isinstance(model, (str, os.PathLike)):
        key = str(Path(model).resolve())
        if key not in _path_cache:
            from bankml.gguf import read_gguf
            _path_cache[key] = from_gguf(read_gguf(key), name=key)
        return _path_cache[key]
    tok = _cache.get(model)
    if tok is None:
        tok = _cache[model] = from_gguf(model.gguf, name=str(model.path))
    return tok
