"""A hybrid model's Session (Qwen3.5: recurrent states beside the attention cells): what
truncate can do (llama_memory_recurrent::seq_rm), going back through saved states (a context
checkpoint), and the prompt cache's copy of a session."""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml.errors import BankmlError
from bankml.testing import models

TOKENS = [1, 504, 2365, 282, 253, 1012, 30, 216, 2025, 314]


@pytest.fixture(scope="module")
def model():
    m = bankml.load(models.path("qwen35-small-q8_0"), backend="llvm", threads=2)
    yield m
    m.close()


def test_truncate_refuses_a_partial_rollback_and_keeps_the_session(model):
    s = model.session()
    s.prefill(TOKENS[:7])
    before = {k: a.copy() for k, a in s.caches.items()}
    with pytest.raises(BankmlError, match="cannot go back from 7 to 3 cells"):
        s.truncate(3)
    assert s.n_past == 7 and all(np.array_equal(before[k], a) for k, a in s.caches.items())
    s.truncate(7)                                    # nothing removed: taken, as llama.cpp takes it
    assert s.n_past == 7


def test_truncate_to_zero_starts_over(model):
    s = model.session()
    first = s.prefill(TOKENS[:7])
    s.truncate(0)
    assert all(not s.caches[k].any() for k in s.state_keys)
    assert s.prefill(TOKENS[:7]).tobytes() == first.tobytes()


def test_rewind_through_saved_states(model):
    s = model.session()
    s.prefill(TOKENS[:4])
    at_4 = s.recurrent_states()
    rest = s.prefill(TOKENS[4:])
    s.prefill([7, 8, 9])                             # elsewhere, then back to 4 cells
    s.rewind(4, at_4)
    assert s.prefill(TOKENS[4:]).tobytes() == rest.tobytes()


def test_saved_copy_restores_cells_and_states(model):
    a = model.session()
    a.prefill(TOKENS[:7])
    b = model.session()
    b.restore(7, a.saved(7))
    assert b.decode(TOKENS[7]).tobytes() == a.decode(TOKENS[7]).tobytes()
