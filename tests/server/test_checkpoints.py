"""llama-server's context-checkpoint rules for sliding-window models (bankml/server/checkpoints.py).

The bits are proven against llama-server in test_gemma3_server.py; these pin the rules of
server-context.cpp on cases read off `llama-server -v` (b11434, Gemma-3-270M, ChatML): a
25-token chat "Hi" is decoded as [0, 1) [1, 21) [21, 25) with checkpoints at n_tokens 1 and 21.
"""
from __future__ import annotations

from bankml.server.checkpoints import N_CTX_CHECKPOINTS, Checkpoint, batches, keep, user_starts


def test_chat_prompt_splits_before_the_user_message_and_4_before_the_end():
    cps: list[Checkpoint] = []
    assert list(batches(0, 25, {1}, cps, task=1)) == [(0, 1), (1, 21), (21, 25)]
    assert [(c.n_tokens, c.pos_min, c.pos_max) for c in cps] == [(1, 0, 0), (21, 0, 20)]


def test_long_completion_splits_4_plus_n_ubatch_and_4_before_the_end():
    cps: list[Checkpoint] = []
    assert list(batches(0, 1100, set(), cps, task=1)) == [(0, 584), (584, 1096), (1096, 1100)]
    assert [c.n_tokens for c in cps] == [584, 1096]
    cps = []
    assert list(batches(0, 3, set(), cps, task=1)) == [(0, 3)] and cps == []


def test_prefix_kept_through_the_newest_checkpoint_at_or_before_it():
    cps = [Checkpoint(1, 0, 0, 1), Checkpoint(21, 0, 20, 1)]
    assert keep(40, 60, 512, cps) == (20, cps[1]) and len(cps) == 2     # pos_next = pos_max of the checkpoint
    cps = [Checkpoint(21, 0, 20, 1)]
    assert keep(10, 60, 512, cps) == (0, None) and cps == []            # none at or before: the whole prompt
    cps = [Checkpoint(21, 0, 20, 1)]
    assert keep(600, 700, 512, cps) == (600, None)              # pos_min 0 < pos_next - n_swa: the cells hold it


def test_checkpoints_are_bounded():
    cps: list[Checkpoint] = []
    for task in range(1, 40):
        list(batches(0, 10 + task, set(), cps, task=task))
    assert len(cps) < N_CTX_CHECKPOINTS


def test_user_starts_are_where_the_delimiter_tokens_begin():
    assert user_starts([2, 7, 8, 9, 7, 8, 5, 7, 8], [7, 8]) == {1, 4, 7}


def test_recurrent_checkpoints_carry_the_states_before_their_batch():
    """A hybrid model (pos_min = pos_max = the last position the states hold): the checkpoint
    before [21, 25) is (21, 20, 20) with the states after 21 tokens."""
    cps: list[Checkpoint] = []
    held = {"n": 0}
    steps = []
    for start, stop in batches(0, 25, {1}, cps, task=1, states=lambda: {"at": held["n"]}):
        steps.append((start, stop))
        held["n"] = stop
    assert steps == [(0, 1), (1, 21), (21, 25)]
    assert [(c.n_tokens, c.pos_min, c.pos_max, c.states) for c in cps] == [(1, 0, 0, {"at": 1}),
                                                                          (21, 20, 20, {"at": 21})]


def test_recurrent_prefix_kept_through_a_checkpoint_or_whole():
    cps = [Checkpoint(1, 0, 0, 1), Checkpoint(21, 20, 20, 1)]
    # 29 tokens held (the states at position 28), 27 shared: back to the checkpoint at 21
    assert keep(27, 40, 0, cps, pos_min=28) == (21, cps[1])
    # every held token shared: the states are where the prompt goes on
    assert keep(29, 40, 0, cps, pos_min=28) == (29, None) and len(cps) == 2
    # the same prompt again: at least one token to compute, through a checkpoint
    assert keep(29, 29, 0, cps, pos_min=28) == (21, cps[1])
