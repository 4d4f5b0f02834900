"""model.batch(sessions).decode(tokens): one graph run for a token of each session, each row the
bits of that session's decode alone, whatever else is in the batch, in any order, as sessions
come and go, across the 256- and 512-cell boundaries (one-chunk and split-KV rows side by side);
llvm at 2 and 3 llama threads, the reference backend on short sessions; and the refusals."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import bankml
from bankml.testing import models

# prompt lengths: 256 cells, 256 -> 512 during the steps, split-KV (512 and 768 cells)
LENGTHS = (3, 254, 509, 700)
STEPS = 4


def _same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _prompts(m, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, m.hparams.n_vocab, n + STEPS).tolist() for n in lengths]


def _alone(m, prompts, lengths):
    """Each session's decode rows by itself."""
    rows = []
    for toks, n in zip(prompts, lengths):
        s = m.session()
        s.prefill(toks[:n], outputs="last")
        rows.append([s.decode(t) for t in toks[n:]])
    return rows


def _check_batched(m, lengths, orders):
    """Sessions decode their STEPS tokens in batches whose members and order change each step
    (orders[k]: the sessions of step k, in row order; the others decode alone that step)."""
    prompts = _prompts(m, lengths)
    want = _alone(m, prompts, lengths)
    sessions = []
    for toks, n in zip(prompts, lengths):
        s = m.session()
        s.prefill(toks[:n], outputs="last")
        sessions.append(s)
    for k, members in enumerate(orders):
        rows = m.batch([sessions[i] for i in members]).decode([prompts[i][lengths[i] + k] for i in members])
        for row, i in zip(rows, members):
            assert _same(row, want[i][k]), f"step {k}, session {i} in {members}"
        for i in set(range(len(lengths))) - set(members):
            assert _same(sessions[i].decode(prompts[i][lengths[i] + k]), want[i][k])
    assert [s.n_past for s in sessions] == [n + STEPS for n in lengths]


ORDERS = [(0, 1, 2, 3), (3, 1, 0, 2), (2, 0), (1, 3, 2)]


@pytest.mark.parametrize("name,llama_threads", [("smollm2-q4_1", 2), ("smollm2-q4_1", 3), ("smollm2-f16", 2),
                                                ("smollm2-q8_0", 3), ("llama-kq-q4_k_m", 2)])
def test_each_row_is_its_sessions_decode_alone(name, llama_threads):
    with bankml.load(models.path(name), threads=2, llama_threads=llama_threads, n_ctx=1024) as m:
        _check_batched(m, LENGTHS, ORDERS)


@pytest.mark.parametrize("name,swa_full", [("gemma3-tiny-w48-f16", False), ("gemma3-270m-q4_k_m", True)])
def test_sliding_window_sessions_batch_with_their_own_cells(name, swa_full):
    """Gemma 3: each row's sliding-window layers write the cell its own ring gives and read its own
    window (the 48-token window wraps its ring of 768 cells here)."""
    with bankml.load(models.path(name), threads=2, n_ctx=1024, swa_full=swa_full) as m:
        _check_batched(m, (3, 300, 520), [(0, 1, 2), (2, 0, 1), (1, 2), (0, 1, 2)])


def test_reference_backend_batches_bit_for_bit():
    with bankml.load(models.path("llama-kq-q4_k_m"), backend="reference", n_ctx=256) as m:
        _check_batched(m, (2, 9, 5), [(0, 1, 2), (2, 1)] + [(1, 0)] * (STEPS - 2))


def test_every_arrival_order_of_four_sessions_gives_the_same_rows():
    with bankml.load(models.path("smollm2-q4_1"), threads=2, n_ctx=512) as m:
        prompts = _prompts(m, (5, 40, 7, 20), seed=3)
        want = [rows[0] for rows in _alone(m, prompts, (5, 40, 7, 20))]
        for perm in itertools.permutations(range(4)):
            sessions = {}
            for i in perm:
                sessions[i] = m.session()
                sessions[i].prefill(prompts[i][:(5, 40, 7, 20)[i]], outputs="last")
            rows = m.batch([sessions[i] for i in perm]).decode([prompts[i][(5, 40, 7, 20)[i]] for i in perm])
            assert all(_same(row, want[i]) for row, i in zip(rows, perm)), perm


def test_more_sessions_than_one_run_takes():
    from bankml.passes.variants import SEQS_MAX
    with bankml.load(models.path("smollm2-q4_1"), threads=2, n_ctx=256) as m:
        lengths = [1 + i for i in range(SEQS_MAX + 3)]
        prompts = _prompts(m, lengths, seed=5)
        want = _alone(m, prompts, lengths)
        sessions = []
        for toks, n in zip(prompts, lengths):
            sessions.append(m.session())
            sessions[-1].prefill(toks[:n], outputs="last")
        rows = m.batch(sessions).decode([toks[n] for toks, n in zip(prompts, lengths)])
        assert all(_same(row, w[0]) for row, w in zip(rows, want))


def test_bad_calls_are_refused_and_leave_every_session_as_it_was():
    with bankml.load(models.path("smollm2-q4_1"), threads=2, n_ctx=256) as m:
        a, b = m.session(), m.session()
        a.prefill([1, 2, 3])
        b.prefill([4] * 255)
        for bad in ([5], 5, "ab"):
            with pytest.raises(bankml.BankmlError, match="one token per session"):
                m.batch([a, b]).decode(bad)
        with pytest.raises(bankml.BankmlError, match="token id 49152 is out of range"):
            m.batch([a, b]).decode([5, 49152])
        b.decode(6)
        with pytest.raises(bankml.BankmlError, match="context full"):
            m.batch([a, b]).decode([5, 6])
        with pytest.raises(bankml.BankmlError, match="appears twice"):
            m.batch([a, a])
        with pytest.raises(bankml.BankmlError, match="at least one session"):
            m.batch([])
        assert (a.n_past, b.n_past) == (3, 256)
        with bankml.load(models.path("smollm2-q4_1"), threads=2, n_ctx=256) as other:
            with pytest.raises(bankml.BankmlError, match="belong to this model"):
                m.batch([a, other.session()])


@pytest.mark.parametrize("name,kw,why", [
    ("qwen35-small-q8_0", {}, "recurrent states"),
    ("smollm2-q4_1", {"profile": "portable"}, "portable profile"),
    ("smollm2-q4_1", {"cache_type": "q8_0"}, "q8_0 K/V cache"),
])
def test_models_whose_sessions_cannot_share_a_step_are_refused_in_one_line(name, kw, why):
    with bankml.load(models.path(name), threads=1, n_ctx=256, **kw) as m:
        with pytest.raises(bankml.BankmlError, match=why):
            m.batch([m.session(), m.session()])
