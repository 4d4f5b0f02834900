"""The sliding-window layers' cells (bankml/runtime/kv_cells.py) through a session's life."""
from __future__ import annotations

import numpy as np
import pytest

import bankml
from bankml.errors import BankmlError
from bankml.runtime.kv_cells import SwaCells
from bankml.testing import models


def test_ring_reuses_cells_the_window_has_left_and_purges_below_them():
    c = SwaCells(size=256, n_swa=48)
    c.apply(c.find_slot(250), np.arange(250))
    idxs = c.find_slot(20)               # 6 empty cells at the end, then cells 0.. (positions 0.., out of the window)
    assert idxs == list(range(250, 256)) + list(range(14))
    c.apply(idxs, np.arange(250, 270))
    assert c.pos[0] == 256 and c.pos.min() == 14 and c.head == 14 and c.n_kv() == 256
    m = c.mask(np.array([269]), 256)[0]
    assert (m == 0).sum() == 48 and m[13] == 0 and m[14] == -np.inf     # positions 222..269 only


def test_a_cell_still_in_the_window_is_not_reused():
    c = SwaCells(size=256, n_swa=48)
    c.apply(c.find_slot(256), np.arange(256))
    assert c.find_slot(48) == list(range(48))                # positions 0..47 have left the window of 256
    full = SwaCells(size=256, n_swa=257)
    full.apply(full.find_slot(256), np.arange(256))
    with pytest.raises(BankmlError, match="no room"):
        full.find_slot(1)                                     # every cell still in the window


@pytest.mark.parametrize("backend", ["llvm", "reference"])
def test_restored_cells_continue_like_the_session_that_made_them(backend):
    """llama-server's prompt cache copies the first n cells back (Session.restore): the next
    micro-batch then lands in the same cells, sliding-window cache included, bit for bit."""
    m = bankml.load(models.path("gemma3-tiny-w48-q8_0"), backend=backend, threads=2)
    try:
        t = np.random.default_rng(2).integers(0, 49152, 20).tolist()
        a = m.session()
        a.prefill(t[:12], outputs="last")
        want = a.prefill(t[12:], outputs="all")
        b = m.session()
        b.prefill(np.random.default_rng(3).integers(0, 49152, 30).tolist())   # other cells in the way
        for key, arr in a.caches.items():
            b.caches[key][:12] = arr[:12]
        b.restore(12)
        got = b.prefill(t[12:], outputs="all")
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert list(b.swa.pos[:20]) == list(range(20)) and b.swa.head == 20
    finally:
        m.close()
