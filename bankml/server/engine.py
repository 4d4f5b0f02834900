"""One request's generation in a slot, as llama-server's update_slots and process_token run it.

    job = Job(prompt=ids, n_predict=16, params=SamplerParams(temp=0), seed=42, stop=["\\n"])
    result = run_job(model, slot, job, on_text=lambda text, tok, prob: ..., cancelled=event.is_set)

The slot keeps its cells for the prompt's common prefix, prefills the rest, starts the sampler
with the whole prompt accepted (init_sampler), then samples and decodes one token at a time; with
n_probs, each token's probabilities as populate_token_probs takes them (runtime/probs.py). Text
follows process_token: a token's piece without its special text (the end-of-generation token
adds none), kept as bytes (generated_text), nothing sent while its last bytes start a UTF-8
character they do not finish (validate_utf8: bytes that are not UTF-8 at all are sent, each
chunk's as U+FFFD as llama-server's JSON writer replaces them) or the text ends with the start of
a stop string, and a stop string ends the text before it. Stops:
a stop string ("stop" / STOP_TYPE_WORD), the end-of-generation token ("stop" / EOS), n_predict
tokens or a full context ("length" / LIMIT), or a cancel (a client gone).
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

from bankml.runtime import probs as P
from bankml.runtime.generate import start_sampler
from bankml.runtime.sampler import LLAMA_DEFAULT_SEED, SamplerParams
from bankml.tokenizer import tokenizer_for
from bankml.server import checkpoints as ckpt
from bankml.server.slots import Slot, prefix_state
from bankml.server.steps import DecodeSteps


@dataclass
class Job:
    prompt: list[int]
    n_predict: int = -1
    params: SamplerParams = SamplerParams()
    seed: int = LLAMA_DEFAULT_SEED
    stop: list[str] = field(default_factory=list)
    user_starts: frozenset = frozenset()    # a chat prompt's user-message starts (message_spans)
    cache_prompt: bool = True
    n_probs: int = 0                        # > 0: each token's probabilities (populate_token_probs)
    post_sampling_probs: bool = False       # from the chain's candidates, not the whole row
    t_max_predict_ms: int = -1              # > 0: stop at a newline once generating took longer
    grammar: object = None                  # a runtime.grammar Grammar every token must fit (cloned per run)
    grammar_text: str = ""                  # its GBNF, as generation_settings shows it


@dataclass
class Prob:
    """One generated_token_probs entry: the probabilities and the bytes sent with the token (text_to_send)."""
    probs: P.TokenProbs
    sent: bytes


@dataclass
class Result:
    tokens: list[int]
    text: str
    finish: str                     # "stop" | "length" | "cancelled"
    stop_type: str                  # "eos" | "word" | "limit" | "none"
    stopping_word: str
    n_prompt: int                   # prompt tokens
    n_cached: int                   # of which taken from the slot's cells (timings.cache_n)
    t_prompt_ms: float
    t_gen_ms: float
    probs: list[Prob] = field(default_factory=list)     # the tokens whose text was complete UTF-8
    n_stop_tokens: int = 0          # a stop word's tokens: left out of a non-streamed answer's probs

    def final_probs(self, stream: bool) -> list[Prob]:
        """send_final_response's probs_output."""
        if stream or self.stop_type != "word":
            return self.probs
        return self.probs[:len(self.probs) - min(len(self.probs), self.n_stop_tokens)]

    @property
    def n_processed(self) -> int:   # timings.prompt_n
        return self.n_prompt - self.n_cached

    def timings(self) -> dict:
        """server_slot_stats::to_json."""
        return timings_json(self.n_cached, self.n_processed, self.t_prompt_ms, len(self.tokens), self.t_gen_ms)


def timings_json(n_cached: int, n_processed: int, t_prompt_ms: float, n_gen: int, t_gen_ms: float) -> dict:
    """server_slot_stats::to_json of these counts and times."""
    return {"cache_n": n_cached, "prompt_n": n_processed, "prompt_ms": t_prompt_ms,
            "prompt_per_token_ms": t_prompt_ms / n_processed if n_processed else 0.0,
            "prompt_per_second": 1e3 * n_processed / t_prompt_ms if t_prompt_ms > 0 else 0.0,
            "predicted_n": n_gen, "predicted_ms": t_gen_ms,
            "predicted_per_token_ms": t_gen_ms / n_gen if n_gen else 0.0,
            "predicted_per_second": 1e3 * n_gen / t_gen_ms if t_gen_ms > 0 else 0.0}


def timings_so_far(slot, n_gen: int) -> dict:
    """A streamed token's timings (timings_per_token): the slot's prompt, n_gen tokens so far."""
    n_prompt, n_cached, t_prompt_ms, t_start = slot.progress
    return timings_json(n_cached, n_prompt - n_cached, t_prompt_ms, n_gen, (time.perf_counter() - t_start) * 1e3)


def valid_utf8_len(b: bytes) -> int:
    """validate_utf8 (server-common.cpp): the length without a multi-byte character cut off at the end."""
    n = len(b)
    for i in range(1, min(4, n) + 1):
        c = b[n - i]
        if ((c & 0xE0) == 0xC0 and i < 2) or ((c & 0xF0) == 0xE0 and i < 3) or ((c & 0xF8) == 0xF0 and i < 4):
            return n - i
    return n


def find_partial_stop(text: bytes, word: bytes) -> int:
    """string_find_partial_stop: where a suffix of text that starts `word` begins, or -1."""
    for i in range(max(0, len(text) - len(word) + 1), len(text)):
        if word.startswith(text[i:]):
            return i
    return -1


def run_job(model, slot: Slot, job: Job, on_text: Callable[..., None] = lambda s, t, p: None,
            cancelled: Callable[[], bool] = lambda: False, steps: DecodeSteps | None = None) -> Result:
    """Generate in `slot` (its session, its held ids); on_text(text, token, prob) for each token as
    it comes (prob: its Prob when n_probs > 0 and its text is complete UTF-8, else None). With
    `steps` (the server's, --parallel > 1) each decode after the prompt shares one step with the
    other slots' (server/steps.py): the slot is a member from its first sampled token to its last."""
    with ExitStack() as stack:
        def join() -> None:
            if steps is not None:
                stack.enter_context(steps.member(slot.session))
        return _run_job(model, slot, job, on_text, cancelled, steps, join)


def _prefill(model, sess, tokens: list[int], steps: DecodeSteps | None):
    """sess.prefill(tokens, outputs="last")'s last row. With the server's shared steps, one
    micro-batch at a time (the cut llama_decode makes), each after any decode step that is ready,
    so that a long prompt holds the generating slots up by one micro-batch at most."""
    if steps is None:
        return sess.prefill(tokens, outputs="last")[-1]
    for start, stop, _ in model.micro_batches(len(tokens), "last"):
        steps.wait_turn()
        row = sess.prefill(tokens[start:stop], outputs="last")[-1]
    return row


def _run_job(model, slot, job, on_text, cancelled, steps, join) -> Result:
    tok = tokenizer_for(model)
    sess = slot.session
    n_cached = prefix_state(slot, job.prompt, job.cache_prompt)
    rest = job.prompt[n_cached:]
    t0 = time.perf_counter()
    if slot.n_swa or slot.recurrent:    # llama-server's checkpoint batches (server/checkpoints.py)
        slot.n_tasks += 1
        states = sess.recurrent_states if slot.recurrent else None
        for start, stop in ckpt.batches(n_cached, len(job.prompt), set(job.user_starts), slot.checkpoints,
                                        slot.n_tasks, states):
            row = _prefill(model, sess, job.prompt[start:stop], steps)
    else:
        row = _prefill(model, sess, rest, steps)
    slot.tokens = list(job.prompt)
    grammar = job.grammar.clone() if job.grammar is not None else None
    sampler = start_sampler(job.params, job.seed, tok, job.prompt, grammar)   # init_sampler
    t1 = time.perf_counter()
    slot.progress = (len(job.prompt), n_cached, (t1 - t0) * 1e3, t1)    # what timings_so_far reads
    join()
    out: list[int] = []
    probs: list[Prob] = []
    raw = bytearray()           # generated_text: every piece so far, a stop word cut
    sent = 0                    # n_sent_text (bytes)
    stops = [w.encode() for w in job.stop]
    finish, stop_type, word = "length", "limit", ""
    while job.n_predict != 0:
        if cancelled():
            finish, stop_type = "cancelled", "none"
            break
        t = sampler.sample(row)
        tp = None
        if job.n_probs > 0:
            tp = P.post_sampling(sampler, t, job.n_probs) if job.post_sampling_probs \
                else P.pre_sampling(row, t, job.n_probs)
        out.append(t)
        eog = t in tok.eog
        piece = b"" if eog else tok.piece(t, special=False)
        raw += piece
        has_next = True
        if valid_utf8_len(raw) == len(raw):
            window = bytes(raw[sent:])
            stop_pos = -1
            for w, b in zip(job.stop, stops):
                p = window.find(b, max(0, len(window) - (len(b) + len(piece))))
                if p != -1 and (stop_pos == -1 or p < stop_pos):
                    stop_pos, word = p, w
            send = True
            if stop_pos != -1:
                del raw[sent + stop_pos:]
                finish, stop_type, has_next = "stop", "word", False
            elif not eog:
                send = all(find_partial_stop(window, b) == -1 for b in stops)
            chunk = bytes(raw[sent:]) if send else b""
            sent += len(chunk)
            prob = None
            if tp is not None:                      # slot.add_token(result)
                prob = Prob(tp, chunk)
                probs.append(prob)
            on_text(chunk.decode("utf-8", "replace"), t, prob)
            if job.t_max_predict_ms > 0 and b"\n" in chunk and (time.perf_counter() - t1) * 1e3 > job.t_max_predict_ms:
                finish, stop_type, has_next = "length", "limit", False     # the time limit, met at a newline
        else:
            on_text("", t, None)
        if len(job.prompt) + len(out) >= model.n_ctx:
            finish, stop_type, has_next = "length", "limit", False
        if has_next and job.n_predict != -1 and len(out) >= job.n_predict:
            finish, stop_type, has_next = "length", "limit", False
        if eog:
            finish, stop_type, has_next = "stop", "eos", False
        if not has_next:
            break
        row = steps.decode(sess, t) if steps is not None else sess.decode(t)
        slot.tokens.append(t)
    t2 = time.perf_counter()
    n_stop = len(model.tokenize(word, add_special=False, parse_special=False)) if probs and word else 0
    return Result(out, raw.decode("utf-8", "replace"), finish, stop_type, word,
                  len(job.prompt), n_cached, (t1 - t0) * 1e3, (t2 - t1) * 1e3, probs, n_stop)
