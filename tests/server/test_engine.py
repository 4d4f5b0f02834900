"""run_job's text as llama-server's process_token makes it (bankml/server/engine.py), on scripted
tokens: no model, a fake vocabulary whose pieces cut UTF-8 and stop strings across tokens.

The bits and tokens are proven against llama-server in test_oracle_server.py; these pin what
each token sends and the text the job returns when the UTF-8 is unfinished, invalid, or a stop
string spans tokens (the text is decoded a token at a time, not all again each token).
"""
from __future__ import annotations

import numpy as np
import pytest

from bankml.server import engine
from bankml.server.engine import Job, run_job
from bankml.server.slots import Slot

EOG = 99


class FakeVocab:
    eog = frozenset({EOG})

    def __init__(self, pieces: dict[int, bytes]):
        self.pieces = pieces

    def piece(self, tid: int, special: bool = True) -> bytes:
        return self.pieces[tid]


class FakeSession:
    n_past = 0
    state_keys = ()

    def prefill(self, tokens, outputs="all"):
        self.n_past += len(tokens)
        return np.zeros((1, 4), np.float32)

    def decode(self, token):
        self.n_past += 1
        return np.zeros(4, np.float32)

    def truncate(self, n):
        self.n_past = n


class FakeModel:
    n_ctx = 4096


def run(monkeypatch, pieces: list[bytes], stop=(), eog_last=False, n_predict=-1):
    """run_job over tokens 0..len(pieces)-1 in turn (then EOG if eog_last): the events and the result."""
    vocab = FakeVocab({**dict(enumerate(pieces)), EOG: b"</s>"})
    script = list(range(len(pieces))) + ([EOG] if eog_last else [])

    class Scripted:
        def __init__(self, params, seed):
            self.next = iter(script)

        def sample(self, row):
            return next(self.next)
    monkeypatch.setattr(engine, "tokenizer_for", lambda model: vocab)
    monkeypatch.setattr(engine, "start_sampler", lambda params, seed, *rest: Scripted(params, seed))
    events: list[str] = []
    n = n_predict if n_predict != -1 else len(script)
    r = run_job(FakeModel(), Slot(0, FakeSession()), Job(prompt=[1, 2], n_predict=n, stop=list(stop)),
                on_text=lambda s, t, p: events.append(s))
    return events, r


def test_split_character_is_sent_once_whole(monkeypatch):
    events, r = run(monkeypatch, [b"ab\xc3", b"\xa9", b"c", b"\xf0\x9f", b"\x98", b"\x80!"])
    assert events == ["", "ab\xe9", "c", "", "", "\U0001f600!"]
    assert r.text == "ab\xe9c\U0001f600!" and r.finish == "length"


def test_bytes_that_are_not_utf8_are_sent_replaced(monkeypatch):
    """validate_utf8 holds back only a character cut off at the end: a byte that starts none goes
    out at once, as U+FFFD (llama-server's JSON writer), and the text goes on after it."""
    events, r = run(monkeypatch, [b"ok", b"\xff", b"more", b"text"])
    assert events == ["ok", "\ufffd", "more", "text"]
    assert r.text == "ok\ufffdmoretext"


def test_a_start_byte_waits_for_as_many_bytes_as_it_announces(monkeypatch):
    """\\xe2 announces three bytes: "a\\xe2b" still looks cut off, "a\\xe2bc" does not (and is not UTF-8)."""
    events, r = run(monkeypatch, [b"a\xe2", b"b", b"c", b"d"])
    assert events == ["", "", "a\ufffdbc", "d"] and r.text == "a\ufffdbcd"


def test_stop_string_across_tokens_cuts_the_text_before_it(monkeypatch):
    events, r = run(monkeypatch, [b"Hello", b" wo", b"rld", b" again"], stop=["world"])
    assert events == ["Hello", "", " "] and r.text == "Hello " and (r.finish, r.stop_type) == ("stop", "word")
    assert r.stopping_word == "world" and len(r.tokens) == 3


def test_stop_string_after_a_split_character(monkeypatch):
    events, r = run(monkeypatch, [b"caf\xc3", b"\xa9 ", b"ol\xc3", b"\xa9!"], stop=["\xe9!"])
    assert events == ["", "caf\xe9 ", "", "ol"] and r.text == "caf\xe9 ol"
    assert (r.finish, r.stop_type, r.stopping_word) == ("stop", "word", "\xe9!")


@pytest.mark.parametrize("stop, want, text", [(["XYZ"], ["a", "", "bXY!"], "abXY!"), (["XY"], ["a", "", "b"], "ab")],
                         ids=["partial-then-not", "whole"])
def test_text_that_may_start_a_stop_string_waits(monkeypatch, stop, want, text):
    """ "bX" ends with the start of the stop string: held back until the next token decides."""
    events, r = run(monkeypatch, [b"a", b"bX", b"Y!"], stop=stop)
    assert events == want and r.text == text


def test_stop_string_after_an_invalid_byte(monkeypatch):
    """The stop strings are looked for in the bytes, after a byte that is not UTF-8 too."""
    events, r = run(monkeypatch, [b"x\xc3", b"\xa9y", b"\xff", b"zy", b"!"], stop=["zy"])
    assert events == ["", "x\xe9y", "\ufffd", ""] and r.text == "x\xe9y\ufffd"
    assert (r.finish, r.stop_type, r.stopping_word) == ("stop", "word", "zy")


def test_end_of_generation_adds_no_text(monkeypatch):
    events, r = run(monkeypatch, [b"one", b" two"], eog_last=True)
    assert events == ["one", " two", ""] and r.text == "one two" and (r.finish, r.stop_type) == ("stop", "eos")
    assert r.tokens == [0, 1, EOG]
