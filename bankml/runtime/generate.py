"""Token generation as llama-server does it: prefill the prompt, then sample and decode one at a time.

    for tok in generate(model, ids, 64, SamplerParams(temp=0.8), seed=42): ...
    ids = list(generate(model, ids, 16, GREEDY))

Stops after n tokens, after an end-of-generation token (yielded: llama-server's process_token
pushes every sampled token into its returned tokens, the EOG one included, then stops), or
once the text holds a stop string (the token that completes it is yielded). ignore_eos is
llama.cpp's --ignore-eos (common/common.cpp): every end-of-generation token gets a logit bias
of -inf (the chain's first sampler), so none is ever sampled, unless the vocabulary has no EOS token.

Before the prompt runs, every graph variant the prompt and the n decodes after it will meet is
made ready (Model.prepare_for: compiled, or loaded from the JIT cache), so that no step of the
stream waits for one, such as the split-KV decode from 512 cells.
"""
from __future__ import annotations

import codecs
import dataclasses
from typing import Iterator, Sequence

import numpy as np

from bankml.runtime.sampler import GREEDY, LLAMA_DEFAULT_SEED, Sampler, SamplerParams
from bankml.tokenizer import tokenizer_for

__all__ = ["generate", "GREEDY", "SamplerParams", "StopScan"]


class StopScan:
    """Whether the text generated so far holds a stop string, one token's bytes at a time.

    The answer is `any(s in text.decode("utf-8", "ignore") for s in stop)` over all the bytes
    so far, without decoding them all again each token: that decoded text only grows at its end
    (an incremental decoder that holds back an unfinished UTF-8 sequence gives it), so a stop
    string it did not hold before ends in the characters just added, and starts at most
    len(stop) - 1 characters before them."""

    def __init__(self, stop: Sequence[str]):
        self.stop = tuple(stop)
        self.reach = max(len(s) for s in self.stop) - 1 if self.stop else 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("ignore")
        self._tail = ""             # the last `reach` characters of the text so far

    def push(self, piece: bytes) -> bool:
        """Add one token's bytes; True once the text holds a stop string."""
        look = self._tail + self._decoder.decode(piece)
        if any(s in look for s in self.stop):
            return True
        self._tail = look[-self.reach:] if self.reach else ""
        return False


def start_sampler(params: SamplerParams, seed: int, tokenizer, prompt: Sequence[int], grammar=None) -> Sampler:
    """The chain for one generation, with the prompt accepted into it (common_sampler_accept(tok,
    false) for each prompt token, as llama-server's init_sampler and llama-completion do), so
    that the penalties and DRY see the prompt. grammar: a runtime.grammar Grammar, whose state
    is this generation's (pass a clone to keep the original)."""
    sampler = Sampler(params, seed, tokenizer=tokenizer, grammar=grammar)
    sampler.accept(prompt)
    return sampler


def generate(model, prompt_ids: Sequence[int], n: int, sampler_params: SamplerParams = SamplerParams(),
             seed: int = LLAMA_DEFAULT_SEED, stop: Sequence[str] = (), ignore_eos: bool = False,
             session=None, history: Sequence[int] = (), grammar=None) -> Iterator[int]:
    """Up to `n` sampled token ids after `prompt_ids`, bit for bit llama-server's /completion.
    history: the tokens the session's cells already hold before prompt_ids (a chat's earlier
    turns); the sampler accepts them first, as init_sampler accepts the slot's whole prompt.
    grammar: a runtime.grammar Grammar that every sampled token must fit (llama.cpp's --grammar)."""
    if not prompt_ids:
        raise ValueError("generate needs at least one prompt token")
    tok = tokenizer_for(model)
    sess = session if session is not None else model.session()
    ignore_eos = ignore_eos and tok.eos is not None      # llama.cpp drops the flag for a vocab without EOS
    if ignore_eos:                                        # its logit_bias_eog, after the request's biases
        bias = sampler_params.logit_bias + tuple((t, -np.inf) for t in sorted(tok.eog))
        sampler_params = dataclasses.replace(sampler_params, logit_bias=bias)
    sampler = start_sampler(sampler_params, seed, tok, [*history, *prompt_ids], grammar)
    model.prepare_for(sess.n_past, len(prompt_ids), n)
    row = sess.prefill(list(prompt_ids), outputs="last")[-1]
    eog = frozenset() if ignore_eos else tok.eog
    scan = StopScan(stop) if stop else None
    for i in range(n):
        t = sampler.sample(row)
        yield t
        if t in eog:
            return
        if scan is not None and scan.push(tok.piece(t)):
            return
        if i + 1 < n:
            row = sess.decode(t)
