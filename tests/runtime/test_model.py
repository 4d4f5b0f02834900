"""A model compiles each variant once and never again; a session checks a call before running it;
close() gives back what the model holds."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import bankml
from bankml.backends.llvm import backend as runner
from bankml.testing import models


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 49152, n).tolist()


def test_after_compile_no_prompt_length_or_context_length_compiles_again(monkeypatch):
    with bankml.load(models.path("smollm2-q4_1"), threads=2, n_ctx=1024) as m:
        m.compile()
        spent = m.compile_seconds
        assert spent > 0

        def refuse(g):
            raise AssertionError(f"compiled {g.meta} after compile()")
        monkeypatch.setattr(runner, "compile_graph", refuse)
        for n, outputs in ((3, "all"), (17, "last"), (70, "last"), (130, "all"), (513, "last")):
            m.session().prefill(_tokens(n, n), outputs=outputs)
        s = m.session()
        s.prefill(_tokens(250, 1), outputs="last")
        for t in range(300):                       # crosses 256 and 512 cells: decode, then decode-split
            s.decode(t)
        assert s.n_past == 550 and m.compile_seconds == spent


def test_a_bad_token_in_the_second_micro_batch_leaves_the_session_as_it_was():
    with bankml.load(models.path("smollm2-q4_1"), threads=2) as m:
        s = m.session()
        first = s.prefill(_tokens(10, 2), outputs="all")
        bad = _tokens(700, 3)
        bad[600] = m.hparams.n_vocab
        with pytest.raises(bankml.BankmlError, match=f"token id {m.hparams.n_vocab} is out of range"):
            s.prefill(bad, outputs="all")
        assert s.n_past == 10
        good = _tokens(20, 4)
        rows = s.prefill(good, outputs="all")
        fresh = m.session()
        want = np.concatenate([fresh.prefill(_tokens(10, 2), outputs="all"), fresh.prefill(good, outputs="all")])
        assert np.array_equal(np.concatenate([first, rows]).view(np.uint32), want.view(np.uint32))


def test_context_full_names_n_ctx_and_runs_nothing():
    with bankml.load(models.path("qwen3-small-q1_0"), threads=1, n_ctx=300) as m:
        s = m.session()
        s.prefill(_tokens(200, 5), outputs="last")
        with pytest.raises(bankml.BankmlError, match=r"context full: 200 tokens held \+ 400 new exceed n_ctx 300"):
            s.prefill(_tokens(400, 6))
        assert s.n_past == 200
        s.truncate(100)
        assert s.n_past == 100
        with pytest.raises(bankml.BankmlError, match="truncate"):
            s.truncate(101)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_loading_and_closing_a_model_50_times_gives_back_memory_and_files():
    path = models.path("qwen3-small-q1_0")

    def once():
        with bankml.load(path, threads=2) as m:
            m.session().prefill([1, 2, 3], outputs="last")
    for _ in range(3):                 # the first loads fill caches that live with the process
        once()
    gc.collect()
    fds, rss = _open_fds(), _rss_kb()
    for _ in range(50):
        once()
    gc.collect()
    assert _open_fds() == fds
    assert _rss_kb() - rss < 50 * 1024           # KiB: not 50 models' weights and arenas


def test_a_closed_model_refuses_to_run():
    m = bankml.load(models.path("qwen3-small-q1_0"), threads=1)
    s = m.session()
    m.close()
    m.close()
    with pytest.raises(bankml.BankmlError, match="closed"):
        s.prefill([1, 2])


def test_two_sessions_decoding_in_turn_give_the_bits_each_gives_alone():
    """A decode binds only what differs from the last call (another session's cache arrays, other
    sizes, another variant): two sessions decoding in turn, one of them across 256 cells into the
    split-KV variant, give the same logits as each one alone."""
    with bankml.load(models.path("smollm2-q4_1"), threads=2, n_ctx=512) as m:
        prompts, n = (_tokens(250, 1), _tokens(9, 2)), 12

        def start(ids):
            s = m.session()
            return s, [s.prefill(ids, outputs="last")[-1]]
        alone = []
        for ids in prompts:
            s, rows = start(ids)
            alone.append(rows + [s.decode(100 + i) for i in range(n)])
        (sa, ra), (sb, rb) = start(prompts[0]), start(prompts[1])
        for i in range(n):
            ra.append(sa.decode(100 + i))
            rb.append(sb.decode(100 + i))
        assert sa.n_past > 256 >= sb.n_past
        for got, want in zip((ra, rb), alone):
            assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(got, want))
