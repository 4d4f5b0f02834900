"""server/steps.py, the slots' shared decode steps, on a stand-in model that records each step: a
step runs once every member has handed in its token, with all of them; a member that leaves does
not hold the others; a prompt's micro-batch waits for a step that is ready; a failed step fails
in every member; a model that cannot batch decodes each session alone."""
from __future__ import annotations

import threading
import time

import pytest

from bankml.server.steps import DecodeSteps


class Sess:
    def __init__(self, name):
        self.name = name

    def decode(self, token):
        return ("alone", self.name, token)


class Model:
    def __init__(self, refusal=None, fail=False, delay=0.0):
        self.refusal, self.fail, self.delay = refusal, fail, delay
        self.steps: list[list[str]] = []
        self.log: list[str] = []

    def batch_refusal(self):
        return self.refusal

    def batch(self, sessions):
        model = self

        class Batch:
            def __init__(self):
                self.sessions = sessions

            def decode(self, tokens):
                time.sleep(model.delay)
                if model.fail:
                    raise RuntimeError("step failed")
                model.steps.append([s.name for s in sessions])
                model.log.append("step")
                return [("step", s.name, t) for s, t in zip(sessions, tokens)]
        return Batch()


def _members(steps, sessions, tokens, results, before=None):
    """Each session a member in its own thread, handing in its token once."""
    def run(s, t):
        with steps.member(s):
            if before is not None:
                before.wait()
            try:
                results[s.name] = steps.decode(s, t)
            except RuntimeError as e:
                results[s.name] = e
    threads = [threading.Thread(target=run, args=(s, t)) for s, t in zip(sessions, tokens)]
    return threads


def test_a_step_takes_every_members_token_once_all_are_in():
    m = Model()
    steps = DecodeSteps(m)
    sessions = [Sess(n) for n in "abc"]
    results, go = {}, threading.Barrier(3)
    threads = _members(steps, sessions, [1, 2, 3], results, go)
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(m.steps) == 1 and sorted(m.steps[0]) == ["a", "b", "c"]
    assert results == {"a": ("step", "a", 1), "b": ("step", "b", 2), "c": ("step", "c", 3)}


def test_a_member_that_leaves_without_a_token_does_not_hold_the_step():
    m = Model()
    steps = DecodeSteps(m)
    a, b = Sess("a"), Sess("b")
    results = {}
    entered, b_leaves = threading.Event(), threading.Event()

    def stay():
        with steps.member(a):
            entered.wait(10)
            results["a"] = steps.decode(a, 7)

    def leave():
        with steps.member(b):
            entered.set()
            b_leaves.wait(10)               # b's client went away: no token

    ta, tb = threading.Thread(target=stay), threading.Thread(target=leave)
    ta.start()
    tb.start()
    time.sleep(0.2)
    assert "a" not in results               # a waits for b's token ...
    b_leaves.set()
    ta.join(10)
    tb.join(10)
    assert results == {"a": ("step", "a", 7)} and m.steps == [["a"]]      # ... until b leaves


def test_a_prompts_micro_batch_waits_for_a_ready_step():
    m = Model(delay=0.3)
    steps = DecodeSteps(m)
    results = {}
    threads = _members(steps, [Sess("a"), Sess("b")], [1, 2], results, threading.Barrier(2))
    for t in threads:
        t.start()
    time.sleep(0.1)                         # the step is running
    steps.wait_turn()
    m.log.append("prompt")
    for t in threads:
        t.join(10)
    assert m.log == ["step", "prompt"]


def test_a_failed_step_fails_in_every_member():
    steps = DecodeSteps(Model(fail=True))
    results = {}
    threads = _members(steps, [Sess("a"), Sess("b")], [1, 2], results, threading.Barrier(2))
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(isinstance(r, RuntimeError) for r in results.values()) and len(results) == 2


@pytest.mark.parametrize("member", [True, False])
def test_without_batching_or_outside_the_loop_a_session_decodes_alone(member):
    steps = DecodeSteps(Model(refusal="recurrent states") if member else Model())
    s = Sess("a")
    if member:
        with steps.member(s):
            assert steps.decode(s, 5) == ("alone", "a", 5)
    else:
        assert steps.decode(s, 5) == ("alone", "a", 5)
    steps.wait_turn()                       # nothing to wait for
