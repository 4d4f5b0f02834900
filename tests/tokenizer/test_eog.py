"""The end-of-generation ids equal libllama's (llama_vocab_is_eog of every id): the EOG texts and
the FIM pad, repo and file-separator tokens (SmolLM2's <reponame> is one) of llama_vocab::impl::load."""
from __future__ import annotations

import pytest

from bankml.gguf.reader import read_gguf
from bankml.oracle.vocab import Vocab
from bankml.testing import models
from bankml.tokenizer import from_gguf


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["smollm2-q4_1", "gemma3-270m-q4_k_m", "qwen3-small-f16", "llama-kq-f16"])
def test_eog_ids_equal_libllamas(name):
    path = models.path(name)
    tok = from_gguf(read_gguf(path), name)
    with Vocab(path) as v:
        assert sorted(tok.eog) == sorted(v.eog())
