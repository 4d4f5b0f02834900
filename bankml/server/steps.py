"""The slots' decode tokens in one step: continuous batching, each slot with its solo bits.

    steps = DecodeSteps(model)
    with steps.member(session):                  # a slot's generation loop, after its prompt
        row = steps.decode(session, token)       # waits for the step that takes every member's token

As llama-server's update_slots puts the token of every generating slot into one llama_decode,
the slots' worker threads meet here: a step runs when every member (a slot between its prompt
and its last token) has handed in its token, as one Model.batch run, whose every row is the
bits of that session's decode alone (runtime/batch.py). A slot whose client went away leaves
at its next token (run_job checks before sampling), so the next step goes on without it; a
slot that is still prefilling its prompt is no member yet, and its micro-batches run between
the steps (wait_turn: each of its micro-batches lets a ready step go first, so a long prompt holds
the others up by one micro-batch at most). The thread that completes the set of tokens
runs the step; the others wait for their rows. Where the model cannot batch
(Model.batch_refusal), each slot decodes alone as before.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager


class DecodeSteps:
    def __init__(self, model):
        self.model = model
        self.enabled = model.batch_refusal() is None
        self._cond = threading.Condition()
        self._members: set = set()          # sessions in their generation loop
        self._tokens: dict = {}             # session -> its token for the next step
        self._rows: dict = {}               # session -> its row (or the step's exception)
        self._running = False
        self._batch = None                  # the last step's Model.batch (kept while its members stay)
        self.on_step = None                 # on_step(n): after each step of n tokens (the server's /metrics)

    @contextmanager
    def member(self, session):
        """The session's generation loop: its tokens go into the shared steps while inside."""
        with self._cond:
            self._members.add(session)
        try:
            yield
        finally:
            with self._cond:
                self._members.discard(session)
                self._cond.notify_all()     # the set of tokens may be complete without it

    def decode(self, session, token: int):
        """session.decode(token)'s row, from the step that takes it."""
        if not self.enabled or session not in self._members:
            return session.decode(token)
        with self._cond:
            self._tokens[session] = token
            self._cond.notify_all()
            while session not in self._rows:
                if not self._running and self._tokens and self._members <= self._tokens.keys():
                    self._step()
                else:
                    self._cond.wait()
            row = self._rows.pop(session)
        if isinstance(row, BaseException):
            raise row
        return row

    def wait_turn(self) -> None:
        """Before a prompt's micro-batch: let a decode step that is ready (or running) go first."""
        if not self.enabled:
            return
        with self._cond:
            while self._running or (self._tokens and self._members <= self._tokens.keys()):
                self._cond.wait()

    def _step(self) -> None:
        """Run the tokens handed in (called holding the lock, which it lets go while the step runs)."""
        tokens, self._tokens = self._tokens, {}
        self._running = True
        self._cond.release()
        try:
            sessions = sorted(tokens, key=id)     # one order while the members stay: the batch is kept
            if self._batch is None or self._batch.sessions != sessions:
                self._batch = self.model.batch(sessions)
            rows = self._batch.decode([tokens[s] for s in sessions])
            results = dict(zip(sessions, rows))
        except BaseException as e:          # every member of the step hears of it
            results = dict.fromkeys(tokens, e)
        finally:
            self._cond.acquire()
            self._running = False
        self._rows.update(results)
        self._cond.notify_all()
        if self.on_step is not None:
            self.on_step(len(tokens))
