"""`bankml run`'s replies: one streamed with its timings, and the interactive chat.

    r = stream_reply(m, m.session(), ids, n_predict, params, seed, echo=True)
    report(r, as_json=False)
    chat(Conversation(m, system, n_predict, params, seed, as_json, ignore_eos), history_file(None))

The chat is llama-cli's (tools/cli/cli-context.cpp, b11434) over one bankml session: each turn
renders the whole conversation through the chat template, keeps the cells the session already
holds for their common prefix (llama_memory_seq_rm past it), prefills only the rest, and its
sampler accepts the whole conversation (as does the server task llama-cli posts for each turn).
At a terminal, input is read with prompt_toolkit: arrow keys, history in a file, bracketed paste
(a pasted block is one message), a multi-line mode. With stdin not a terminal each line is one
message (commands included), with no prompt and no history: what scripts pipe in.

As llama-cli's: Ctrl-C while a reply streams stops it at the next token and the partial reply
stays in the conversation (cli.cpp's SIGINT handler sets `interrupted`, the stream stops, and
the content so far is pushed as the assistant's message); a second Ctrl-C before it has stopped
exits with status 130. Without a seed each reply draws a new one (each of llama-cli's requests
builds a new sampler, whose LLAMA_DEFAULT_SEED draws from std::random_device), so /regen gives
a new reply; with --seed (or /set seed) every reply uses that seed, so /regen repeats it.
Unlike llama-cli, a Ctrl-C at the prompt does not exit at once: a hint, then a second exits.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import click

from bankml.oracle.paths import cache_root
from bankml.runtime.sampler import LLAMA_DEFAULT_SEED

HELP = """\
commands:
  /exit, /quit        leave (also Ctrl-D, or Ctrl-C twice at an empty prompt)
  /clear              start a new conversation
  /regen              drop the last reply and generate it again
  /set NAME VALUE     temp, top_k, top_p, min_p, seed (-1: a new one each reply) or n_predict; /set lists them
  /multiline          multi-line input on or off: Enter adds a line, Esc+Enter or Alt+Enter sends
  /help               this list
keys: Up and Down recall earlier inputs (kept in {history}); Ctrl-C stops a reply, which stays
in the conversation; a pasted block is one message; // at the start sends a message beginning with /"""

COMMANDS = ("/exit", "/quit", "/clear", "/regen", "/set", "/multiline", "/help")
_COMMAND = re.compile(r"/[A-Za-z_]+")


def _now() -> float:
    return time.perf_counter()


def _note(text: str) -> None:
    click.echo(text, err=True)


# ---------------------------------------------------------------- one reply

def stream_reply(m, sess, ids: list[int], n_predict: int, params, seed: int, echo: bool, ignore_eos: bool = False,
                 history: list[int] = (), stop=None, grammar=None) -> dict:
    """Prefill ids into sess (after the cells it holds: history), sample until -n, the
    end-of-generation token, a full context or stop() (asked after each token); stream text as it
    comes. Timings leave out native compile time."""
    from bankml.runtime.generate import generate
    from bankml.tokenizer import tokenizer_for
    from bankml.tokenizer.vocab import StreamDecoder
    room = m.n_ctx - sess.n_past - len(ids)       # tokens that still fit in the context after the prompt
    n = room if n_predict < 0 else min(n_predict, room)
    out, pieces = [], []
    dec = StreamDecoder(tokenizer_for(m), special=False)
    c0, t0 = m.compile_seconds, _now()             # generate() compiles (the first time) before any text streams
    c_first = t_first = None
    for t in generate(m, ids, n, params, seed=seed, session=sess, ignore_eos=ignore_eos, history=history,
                      grammar=grammar):
        if t_first is None:
            c_first, t_first = m.compile_seconds, _now()
        out.append(t)
        piece = dec.push(t)
        pieces.append(piece)
        if echo and piece:
            click.echo(piece, nl=False)
        if stop is not None and stop():
            break
    tail = dec.flush()
    pieces.append(tail)
    if echo and tail:
        click.echo(tail, nl=False)
    c_end, t_end = m.compile_seconds, _now()
    if t_first is None:                             # -n 0: the prompt prefilled, nothing sampled
        c_first, t_first = c_end, t_end
    prompt_s = max(0.0, t_first - t0 - (c_first - c0))
    gen_s = max(0.0, t_end - t_first - (c_end - c_first))
    return {"tokens": out, "text": "".join(pieces), "timings": {
        "compile_ms": (c_end - c0) * 1e3,
        "prompt_n": len(ids), "prompt_ms": prompt_s * 1e3,
        "prompt_per_second": len(ids) / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": len(out), "predicted_ms": gen_s * 1e3,
        "predicted_per_second": (len(out) - 1) / gen_s if gen_s > 0 and len(out) > 1 else 0.0}}


def report(r: dict, as_json: bool, context: tuple[int, int] | None = None) -> None:
    """The JSON object, or compile time and tokens/s on stderr after the streamed text (and, in
    the chat, the context's cells in use: (held, n_ctx))."""
    if as_json:
        click.echo(json.dumps(r))
        return
    t = r["timings"]
    click.echo()
    if t["compile_ms"] > 0:
        _note(f"[compiling {t['compile_ms'] / 1e3:.1f} s (this model's graphs: compiled on first use, loaded from "
              "the JIT cache after; not counted below)]")
    used = f"; context {context[0]} of {context[1]}" if context else ""
    _note(f"[prompt {t['prompt_n']} tokens, {t['prompt_per_second']:.1f} tok/s; generated "
          f"{t['predicted_n']} tokens, {t['predicted_per_second']:.1f} tok/s{used}]")


def first_messages(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system is not None else []


def chat_ids(m, messages: list[dict]) -> list[int]:
    """The conversation through the chat template, tokenized, ready for the assistant's reply."""
    from bankml.runtime.chat import render_chat
    return m.tokenize(render_chat(m, messages, add_generation_prompt=True), add_special=True, parse_special=True)


# ---------------------------------------------------------------- the conversation

class Conversation:
    """The messages, the session whose cells hold their tokens, and the settings /set changes."""

    def __init__(self, m, system: str | None, n_predict: int, params, seed: int, as_json: bool, ignore_eos: bool):
        self.m, self.system, self.as_json, self.ignore_eos = m, system, as_json, ignore_eos
        self.n_predict, self.params = n_predict, params
        self.seed = seed                             # LLAMA_DEFAULT_SEED: a new draw each reply
        self.sess, self.held = m.session(), []       # held: the token ids in sess's cells, in order
        self.messages = first_messages(system)
        self.multiline = False
        self.stop_asked = False                      # Ctrl-C during this reply
        self.stopped = False                         # the last reply ended by Ctrl-C

    def on_sigint(self, signum, frame) -> None:
        """SIGINT outside the prompt: stop the reply at its next token; a second before it stops exits."""
        if self.stop_asked:
            raise KeyboardInterrupt
        self.stop_asked = True

    def clear(self) -> None:
        self.messages = first_messages(self.system)
        self.sess.truncate(0)
        self.held = []
        _note("[new conversation]")

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        self.reply()

    def regen(self) -> None:
        if not self.messages or self.messages[-1]["role"] != "assistant":
            _note("[no reply to regenerate]")
            return
        self.messages.pop()
        self.reply()

    def _fit(self) -> list[int] | None:
        """The conversation's ids; when it outgrows the context, from its last message alone."""
        m = self.m
        ids = chat_ids(m, self.messages)
        if len(ids) < m.n_ctx:
            return ids
        self.messages = first_messages(self.system) + self.messages[-1:]
        ids = chat_ids(m, self.messages)
        if len(ids) >= m.n_ctx:
            _note(f"[this message alone is {len(ids)} tokens with the template; the context holds "
                  f"{m.n_ctx} (--ctx); not sent, the conversation starts over]")
            self.messages = first_messages(self.system)
            return None
        _note(f"[the conversation no longer fits the context of {m.n_ctx} tokens (--ctx); it starts "
              "over from this message (type /clear to start over any time)]")
        return ids

    def reply(self) -> None:
        """The assistant's turn: stream it, report it, append it (a stopped one as far as it got)."""
        self.stopped = False
        ids = self._fit()
        if ids is None:
            return
        from bankml.runtime.chat import common_prefix
        keep = min(common_prefix(self.held, ids), len(ids) - 1)      # prefill at least one token for its logits
        self.sess.truncate(keep)
        self.stop_asked = False
        r = stream_reply(self.m, self.sess, ids[keep:], self.n_predict, self.params, self.seed,
                         echo=not self.as_json, ignore_eos=self.ignore_eos, history=ids[:keep],
                         stop=lambda: self.stop_asked)
        self.held = (ids + r["tokens"])[:self.sess.n_past]
        self.stopped = self.stop_asked
        report(r, self.as_json, context=(self.sess.n_past, self.m.n_ctx))
        self.messages.append({"role": "assistant", "content": r["text"]})
        if self.stopped:
            _note("[stopped: the reply so far stays in the conversation; /regen makes a new one]")

    def settings(self) -> str:
        p = self.params
        seed = "random" if self.seed == LLAMA_DEFAULT_SEED else self.seed
        return (f"[temp {p.temp:g}, top_k {p.top_k}, top_p {p.top_p:g}, min_p {p.min_p:g}, seed {seed}, "
                f"n_predict {self.n_predict}]")

    def set(self, args: list[str]) -> None:
        """/set NAME VALUE: one line saying the new value, or why it is refused (nothing changed)."""
        if not args:
            _note(self.settings())
            return
        if len(args) != 2 or args[0] not in _SETTINGS:
            _note(f"[/set NAME VALUE, NAME one of {' '.join(_SETTINGS)}; nothing changed]")
            return
        name, value = args
        parse, want = _SETTINGS[name]
        try:
            v = parse(value)
        except ValueError:
            _note(f"[/set {name}: {value!r} is not {want}; nothing changed]")
            return
        if name == "seed":
            self.seed = v
        elif name == "n_predict":
            self.n_predict = v
        else:
            self.params = dataclasses.replace(self.params, **{name: v})
            v = getattr(self.params, name)
        _note(f"[{name} = {'random each reply' if name == 'seed' and v == LLAMA_DEFAULT_SEED else f'{v:g}'}]")


def _finite(value: str) -> float:
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(value)
    return v


def _temp(value: str) -> float:
    return max(_finite(value), 0.0)             # as --temp: below 0 is 0 (greedy)


def _seed(value: str) -> int:
    v = int(value)
    if v == -1:
        return LLAMA_DEFAULT_SEED
    if not 0 <= v < 2 ** 32:
        raise ValueError(value)
    return v


def _n_predict(value: str) -> int:
    v = int(value)
    if v < -1:
        raise ValueError(value)
    return v


# NAME -> (parse, what a value must be)
_SETTINGS = {
    "temp": (_temp, "a number (below 0: greedy, as --temp)"),
    "top_k": (int, "an integer (0 or less: off)"),
    "top_p": (_finite, "a number (1: off)"),
    "min_p": (_finite, "a number (0: off)"),
    "seed": (_seed, "an integer from 0 to 4294967295, or -1 (a new seed each reply)"),
    "n_predict": (_n_predict, "an integer >= -1 (-1: until the end-of-generation token or a full context)"),
}


def take(c: Conversation, text: str, history: str) -> bool:
    """One input: a command or a message (an empty one is skipped). False: leave the chat."""
    line = text.strip()
    word = line.split(maxsplit=1)[0] if line else ""
    if not line:
        return True
    if "\n" in line or not _COMMAND.fullmatch(word):
        c.say(text[text.index("/") + 1:] if line.startswith("//") else text)
        return True
    args = line.split()[1:]
    if word in ("/exit", "/quit"):
        return False
    if word == "/help":
        _note(HELP.format(history=history))
    elif word == "/clear":
        c.clear()
    elif word == "/regen":
        c.regen()
    elif word == "/set":
        c.set(args)
    elif word == "/multiline":
        c.multiline = not c.multiline
        _note("[multi-line input: Enter adds a line, Esc+Enter or Alt+Enter sends]" if c.multiline
              else "[single-line input: Enter sends]")
    else:
        _note(f"[{word}: no such command; /help lists them (// at the start sends a message beginning with /)]")
    return True


# ---------------------------------------------------------------- input

def history_file(flag: str | None) -> Path | None:
    """--history, else $BANKML_CHAT_HISTORY, else <cache>/chat_history; an empty one: no file."""
    path = flag if flag is not None else os.environ.get("BANKML_CHAT_HISTORY")
    if path is None:
        return cache_root() / "chat_history"
    return Path(path).expanduser() if path else None


def terminal_stream(as_json: bool):
    """The terminal the prompt writes to (stdout, or stderr under --json or a redirected stdout),
    or None: stdin is not a terminal, so lines are read plainly."""
    if not sys.stdin.isatty():
        return None
    out = sys.stderr if as_json or not sys.stdout.isatty() else sys.stdout
    return out if out.isatty() else None


def terminal_reader(c: Conversation, history: Path | None, stream=None, input=None, output=None):
    """prompt() -> the text submitted; KeyboardInterrupt for Ctrl-C at an empty prompt (with text
    there, Ctrl-C discards it), EOFError for Ctrl-D. Enter sends, or in multi-line mode adds a
    line (Esc+Enter and Alt+Enter always send)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.output import create_output

    keys = KeyBindings()

    @keys.add("c-c")
    def _ctrl_c(event):
        if event.current_buffer.text:
            event.current_buffer.reset()
        else:
            event.app.exit(exception=KeyboardInterrupt, style="class:aborting")
    store = InMemoryHistory()
    if history is not None:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            history.touch()
            store = FileHistory(str(history))
        except OSError as e:
            _note(f"[{history}: {e.strerror}; this chat's history is kept in memory only (--history)]")
    if output is None and stream is not None:
        output = create_output(stdout=stream)
    session = PromptSession(history=store, multiline=Condition(lambda: c.multiline), key_bindings=keys,
                            prompt_continuation=lambda width, n, wrap: "." * (width - 1) + " ",
                            input=input, output=output)
    return lambda: session.prompt("> ")


def _plain_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\r\n")


def chat(c: Conversation, history: Path | None = None, multiline: bool = False, read=None) -> None:
    """The chat loop; read: a terminal_reader, or None to pick one (plain lines when stdin is not a terminal)."""
    c.multiline = multiline
    if read is None:
        stream = terminal_stream(c.as_json)
        read = terminal_reader(c, history, stream) if stream is not None else _plain_line
        if stream is not None:
            _note(f"[chat with {Path(c.m.path).name}: /help lists the commands; Ctrl-C stops a reply, Ctrl-D leaves]")
    where = str(history) if history is not None else "memory only"
    old = signal.signal(signal.SIGINT, c.on_sigint)
    try:
        streak = 0                          # Ctrl-Cs in a row (the one that stopped a reply counts)
        while True:
            try:
                text = read()
            except EOFError:
                return
            except KeyboardInterrupt:
                if streak:
                    return
                streak = 1
                _note("[Ctrl-C again, Ctrl-D or /exit leaves]")
                continue
            c.stopped = False
            if not take(c, text, where):
                return
            streak = 1 if c.stopped else 0
    except KeyboardInterrupt:               # a second Ctrl-C before the reply stopped: llama-cli's exit(130)
        click.echo(err=True)
        raise click.exceptions.Exit(130)
    finally:
        signal.signal(signal.SIGINT, old)
