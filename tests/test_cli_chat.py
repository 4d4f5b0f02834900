"""The chat of `bankml run`: its commands and Ctrl-C over piped lines, its keys at a prompt_toolkit
prompt, and the whole of it in a real terminal (tmux runs `bankml run`, the test types and reads
the pane)."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bankml.testing import models

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str, input: str):
    """`bankml ARGS` in this process, stdin (not a terminal) from `input`."""
    from click.testing import CliRunner

    from bankml.cli import main
    return CliRunner().invoke(main, list(args), input=input)


def chat_ids(m, messages) -> list[int]:
    from bankml.runtime.chat import render_chat
    return m.tokenize(render_chat(m, messages, add_generation_prompt=True), add_special=True, parse_special=True)


@pytest.fixture(scope="module")
def smollm2():
    import bankml as bk
    return bk.load(models.path("smollm2-q4_1"), threads=2)


def watch_samplers(monkeypatch) -> list[tuple]:
    """(params, seed, prompt ids accepted) of every reply's sampler from now on."""
    from bankml.runtime import generate
    made, start = [], generate.start_sampler

    def watched(params, seed, tokenizer, prompt, grammar=None):
        made.append((params, seed, list(prompt)))
        return start(params, seed, tokenizer, prompt, grammar)
    monkeypatch.setattr(generate, "start_sampler", watched)
    return made


def ctrl_c_at_decode(monkeypatch, at: int, times: int = 1) -> None:
    """SIGINT to this process (`times` of them) from inside the at-th Session.decode, as a Ctrl-C."""
    from bankml.runtime.session import Session
    decode, n = Session.decode, [0]

    def interrupted(self, token):
        n[0] += 1
        if n[0] == at:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)
        return decode(self, token)
    monkeypatch.setattr(Session, "decode", interrupted)


# ---------------------------------------------------------------- over piped lines

PATH = str(models.path("smollm2-q4_1"))


def test_run_without_a_prompt_chats_and_commands_never_reach_the_model(monkeypatch, smollm2):
    made = watch_samplers(monkeypatch)
    r = invoke("run", PATH, "--temp", "0", "-n", "4", "--json",
               input="/help\n/set temp hot\n/nope\n\nHi.\n/exit\nNot sent.\n")
    assert r.exit_code == 0, r.output
    replies = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(replies) == 1 and [ids for _, _, ids in made] == [chat_ids(smollm2, [{"role": "user", "content": "Hi."}])]
    assert "/regen" in r.stderr and "/multiline" in r.stderr                          # /help
    assert "[/set temp: 'hot' is not a number" in r.stderr and "[/nope: no such command" in r.stderr


def test_set_changes_the_next_replys_sampler_and_length(monkeypatch):
    from bankml.runtime.sampler import LLAMA_DEFAULT_SEED
    made = watch_samplers(monkeypatch)
    r = invoke("run", PATH, "--temp", "0", "-n", "4", "--json", input=(
        "Hi.\n/set temp 0.5\n/set top_k 7\n/set top_p 0.5\n/set min_p 0.1\n/set seed 7\n/set n_predict 2\n"
        "/set top_k 1.5\n/set n_predict -2\n/set seed -1\n/set temp -3\n/set\nAgain.\n"))
    assert r.exit_code == 0, r.output
    first, second = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(first["tokens"]) == 4 and len(second["tokens"]) == 2
    (p0, seed0, _), (p1, seed1, _) = made
    assert (p0.temp, p0.top_k, seed0) == (0.0, 40, LLAMA_DEFAULT_SEED)     # no --seed: a new draw each reply
    assert (p1.temp, p1.top_k, p1.top_p, p1.min_p, seed1) == (0.0, 7, 0.5, pytest.approx(0.1), LLAMA_DEFAULT_SEED)
    assert "[temp = 0.5]" in r.stderr and "[seed = 7]" in r.stderr and "[temp = 0]" in r.stderr
    assert "[/set top_k: '1.5' is not an integer" in r.stderr and "[/set n_predict: '-2' is not" in r.stderr
    assert "[temp 0, top_k 7, top_p 0.5, min_p 0.1, seed random, n_predict 2]" in r.stderr


def test_regen_drops_the_last_reply_and_generates_it_again(monkeypatch, smollm2):
    made = watch_samplers(monkeypatch)
    r = invoke("run", PATH, "--temp", "0.8", "--seed", "5", "-n", "6", "--json", input="/regen\nHi.\n/regen\n")
    assert r.exit_code == 0, r.output
    first, again = [json.loads(line) for line in r.stdout.splitlines()]
    assert "[no reply to regenerate]" in r.stderr
    ids = chat_ids(smollm2, [{"role": "user", "content": "Hi."}])
    assert [(seed, prompt) for _, seed, prompt in made] == [(5, ids), (5, ids)]       # --seed: the same seed each reply
    assert again["tokens"] == first["tokens"] and again["timings"]["prompt_n"] == 1    # its prompt's cells kept


def test_clear_starts_a_new_conversation_in_a_truncated_session(monkeypatch, smollm2):
    from bankml.runtime.session import Session
    calls, prefill = [], Session.prefill

    def counted(self, tokens, outputs="all"):
        calls.append((self.n_past, len(tokens)))
        return prefill(self, tokens, outputs)
    monkeypatch.setattr(Session, "prefill", counted)
    made = watch_samplers(monkeypatch)
    r = invoke("run", PATH, "--temp", "0", "-n", "4", "--json", input="Hi.\n/clear\nHi.\n")
    assert r.exit_code == 0, r.output
    ids = chat_ids(smollm2, [{"role": "user", "content": "Hi."}])
    assert calls == [(0, len(ids)), (0, len(ids))] and [p for _, _, p in made] == [ids, ids]
    assert "[new conversation]" in r.stderr


def test_ctrl_c_stops_the_reply_and_keeps_it_in_the_conversation(monkeypatch, smollm2):
    """As llama-cli: the reply stops at the next token and what it said so far is the assistant's message."""
    ctrl_c_at_decode(monkeypatch, at=3)
    made = watch_samplers(monkeypatch)
    r = invoke("run", PATH, "--temp", "0", "-n", "40", "--ignore-eos", "--json", input="Count to fifty.\nThanks.\n")
    assert r.exit_code == 0, r.output
    stopped, after = [json.loads(line) for line in r.stdout.splitlines()]
    assert 3 <= len(stopped["tokens"]) < 40 and len(after["tokens"]) == 40
    assert r.stderr.count("[stopped") == 1
    messages = [{"role": "user", "content": "Count to fifty."}, {"role": "assistant", "content": stopped["text"]},
                {"role": "user", "content": "Thanks."}]
    assert made[1][2] == chat_ids(smollm2, messages)


def test_a_second_ctrl_c_before_the_reply_stops_exits_130(monkeypatch):
    ctrl_c_at_decode(monkeypatch, at=2, times=2)
    r = invoke("run", PATH, "--temp", "0", "-n", "40", "--ignore-eos", input="Count to fifty.\nThanks.\n")
    assert r.exit_code == 130 and "Traceback" not in r.output and "[stopped" not in r.stderr


def test_the_history_file_from_the_flag_the_variable_or_the_cache(monkeypatch, tmp_path):
    from bankml.cli_chat import history_file
    monkeypatch.setenv("BANKML_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("BANKML_CHAT_HISTORY", raising=False)
    assert history_file(None) == tmp_path / "cache" / "chat_history"
    monkeypatch.setenv("BANKML_CHAT_HISTORY", str(tmp_path / "env"))
    assert history_file(None) == tmp_path / "env" and history_file(str(tmp_path / "flag")) == tmp_path / "flag"
    assert history_file("") is None
    monkeypatch.setenv("BANKML_CHAT_HISTORY", "")
    assert history_file(None) is None


# ---------------------------------------------------------------- keys at the prompt (prompt_toolkit, a pipe)

@pytest.mark.parametrize("keys, hints", [("\x04", 0), ("\x03\x03", 1), ("typed\x03\x03\x03", 1),
                                         ("\x03/exit\r", 1)],
                         ids=["ctrl-d", "ctrl-c-twice", "ctrl-c-clears-the-line-first", "exit"])
def test_the_prompt_leaves_on_ctrl_d_two_ctrl_c_or_exit(smollm2, capsys, keys, hints):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from bankml.cli_chat import Conversation, chat, terminal_reader
    from bankml.runtime.sampler import GREEDY
    c = Conversation(smollm2, None, 4, GREEDY, 0, False, False)
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        chat(c, read=terminal_reader(c, None, input=pipe, output=DummyOutput()))
    assert c.messages == [] and capsys.readouterr().err.count("[Ctrl-C again") == hints


# ---------------------------------------------------------------- in a real terminal

TURN = re.compile(r"\[prompt (\d+) tokens, [\d.]+ tok/s; generated (\d+) tokens, [\d.]+ tok/s; context (\d+) of (\d+)\]")


class Terminal:
    """One tmux pane (120x40, its own tmux server on the socket given) running a command: keys in,
    the screen out."""

    def __init__(self, argv: list[str], socket: Path):
        self.tmux = ["tmux", "-S", str(socket), "-f", "/dev/null"]
        cmd = f'{shlex.join(argv)}; echo "[exit $?]"; sleep 600'
        self.run("new-session", "-d", "-x", "120", "-y", "40", "-s", "chat", "-c", str(ROOT), cmd)

    def run(self, *args: str) -> str:
        return subprocess.run([*self.tmux, *args], check=True, capture_output=True, text=True, timeout=10).stdout

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", "chat", "-l", text)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "chat", *keys)

    def paste(self, text: str) -> None:
        """As a terminal pastes: inside bracketed-paste marks, the application having asked for them."""
        self.run("set-buffer", "-b", "clip", text)
        self.run("paste-buffer", "-p", "-d", "-b", "clip", "-t", "chat")

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-J", "-S", "-", "-t", "chat").rstrip()

    def wait(self, until, timeout: float = 40) -> str:
        end = time.monotonic() + timeout
        while True:
            s = self.screen()
            if until(s):
                return s
            if time.monotonic() > end:
                raise AssertionError(f"the terminal never showed what was awaited; it shows:\n{s}")
            time.sleep(0.05)

    def at_prompt(self, turns: int) -> str:
        """The screen once `turns` replies are done and the prompt waits for input."""
        return self.wait(lambda s: len(TURN.findall(s)) == turns and s.splitlines()[-1] == ">")

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    """`bankml run` with no MODEL and no -p (the default model, a chat), greedy, 8 tokens a reply."""
    where = tmp_path_factory.mktemp("chat")
    history = where / "history"
    t = Terminal([sys.executable, "-m", "bankml.cli", "run", "--temp", "0", "-n", "8", "--ignore-eos",
                  "--ctx", "1024", "--history", str(history)], where / "tmux")
    t.history = history
    yield t
    t.close()


def test_terminal_a_message_streams_its_reply(term):
    term.wait(lambda s: "[chat with" in s and s.splitlines()[-1] == ">")
    term.type("Name a color.")
    term.keys("Enter")
    s = term.at_prompt(1)
    after = s[s.index("> Name a color.\n") + len("> Name a color.\n"):]
    reply = re.split(r"\n\[(?:compiling|prompt) ", after)[0]
    assert reply.strip() and TURN.search(after).group(2) == "8"


def test_terminal_up_arrow_recalls_the_message_kept_in_the_history_file(term):
    term.keys("Up")
    term.wait(lambda s: s.splitlines()[-1] == "> Name a color.")
    term.keys("C-c")                                                # with text: clears the line, no hint
    s = term.wait(lambda s: s.splitlines()[-1] == ">")
    assert "[Ctrl-C again" not in s
    assert "+Name a color." in term.history.read_text().splitlines()


def test_terminal_help_lists_the_commands_and_is_no_turn(term):
    term.type("/help")
    term.keys("Enter")
    s = term.wait(lambda s: "/multiline" in s and s.splitlines()[-1] == ">")
    assert "/regen" in s and "/set NAME VALUE" in s and str(term.history) in s and len(TURN.findall(s)) == 1


def test_terminal_set_accepts_a_temperature_and_refuses_a_bad_value(term):
    for line, shown in [("/set temp 0.5", "[temp = 0.5]"), ("/set temp hot", "[/set temp: 'hot' is not a number"),
                        ("/set temp 0", "[temp = 0]")]:
        term.type(line)
        term.keys("Enter")
        term.wait(lambda s: shown in s and s.splitlines()[-1] == ">")
    assert len(TURN.findall(term.screen())) == 1


def test_terminal_a_pasted_block_is_one_turn(term):
    term.paste("Line one.\nLine two.")
    term.keys("Enter")
    term.at_prompt(2)
    time.sleep(1.0)                               # a second turn, had the paste been two, would be under way by now
    s = term.at_prompt(2)
    assert "Line two." in s


def test_terminal_multiline_mode_sends_on_esc_enter(term):
    term.type("/multiline")
    term.keys("Enter")
    term.wait(lambda s: "[multi-line input" in s and s.splitlines()[-1] == ">")
    term.type("First line.")
    term.keys("Enter")
    term.type("Second line.")
    term.wait(lambda s: s.splitlines()[-1].endswith("Second line."))
    assert len(TURN.findall(term.screen())) == 2                  # Enter added a line, sent nothing
    term.keys("Escape", "Enter")
    term.at_prompt(3)
    term.type("/multiline")
    term.keys("Escape", "Enter")
    term.wait(lambda s: "[single-line input" in s and s.splitlines()[-1] == ">")


def test_terminal_ctrl_c_stops_a_long_reply_and_the_conversation_goes_on(term):
    term.type("/set n_predict -1")
    term.keys("Enter")
    term.wait(lambda s: "[n_predict = -1]" in s and s.splitlines()[-1] == ">")
    term.type("Count from one to one thousand.")
    term.keys("Enter")
    mark = "> Count from one to one thousand.\n"
    term.wait(lambda s: mark in s and len(s[s.index(mark) + len(mark):].strip()) >= 300, timeout=60)
    term.keys("C-c")
    s = term.wait(lambda s: "[stopped" in s and s.splitlines()[-1] == ">")
    stopped = TURN.findall(s)[-1]
    n_stopped, context_stopped = int(stopped[1]), int(stopped[2])
    assert len(TURN.findall(s)) == 4 and 40 <= n_stopped < 600              # stopped long before the full context
    term.type("/set n_predict 8")
    term.keys("Enter")
    term.wait(lambda s: "[n_predict = 8]" in s and s.splitlines()[-1] == ">")
    term.type("Thanks.")
    term.keys("Enter")
    prompt_n, n, context, _ = (int(v) for v in TURN.findall(term.at_prompt(5))[-1])
    assert n == 8 and prompt_n < context_stopped        # the session's cells were kept, not all prefilled again
    assert context >= context_stopped + 10              # and the stopped reply stays in the conversation (else: 40 fewer)


def test_terminal_ctrl_c_at_an_empty_prompt_hints_and_exit_leaves_with_status_0(term):
    term.keys("C-c")
    term.wait(lambda s: "[Ctrl-C again, Ctrl-D or /exit leaves]" in s and s.splitlines()[-1] == ">")
    term.type("/exit")
    term.keys("Enter")
    term.wait(lambda s: "[exit 0]" in s)
