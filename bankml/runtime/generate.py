"""Token generation as llama-server does it: prefill the prompt, then sample and decode one at a time.

    for tok in generate(model, ids, 64, SamplerParams(temp=0.8), seed=42): ...
    ids = list(generate(model, ids, 16, GREEDY))

Stops after n tokens, after an end-of-generation token (yielded: llama-server's process_token
pushes every sampled token into its returned tokens, the EOG one included, then stops), or
once the text holds a stop string (the token that completes it is yielded). ignore_eos is
llama.cpp's --ignore-eos (common/common.cpp): every end-of-generation token's logit gets a bias
of -inf before the chain, so none is ever sampled, unless the vocabulary has no EOS token.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from bankml.runtime.sampler import GREEDY, LLAMA_DEFAULT_SEED, Sampler, SamplerParams
from bankml.tokenizer import tokenizer_for

__all__ = ["generate", "GREEDY", "SamplerParams"]


def generate(model, prompt_ids: Sequence[int], n: int, sampler_params: SamplerParams = SamplerParams(),
             seed: int = LLAMA_DEFAULT_SEED, stop: Sequence[str] = (), ignore_eos: bool = False,
             session=None) -> Iterator[int]:
    """Up to `n` sampled token ids after `prompt_ids`, bit for bit llama-server's /completion."""
    if not prompt_ids:
        raise ValueError("generate needs at least one prompt token")
    tok = tokenizer_for(model)
    sess = session if session is not None else model.session()
    sampler = Sampler(sampler_params, seed)
    ignore_eos = ignore_eos and tok.eos is not None      # llama.cpp drops the flag for a vocab without EOS
    banned = sorted(tok.eog) if ignore_eos else []        # its logit_bias_eog
    row = sess.prefill(list(prompt_ids), outputs="last")[-1]
    text = b""
    for i in range(n):
        if banned:
            row = row.copy()
            row[banned] = -np.inf
        t = sampler.sample(row)
        yield t
        if t in tok.eog and not ignore_eos:
            return
        if stop:
            text += tok.piece(t)
            decoded = text.decode("utf-8", "ignore")
            if any(s in decoded for s in stop):
                return
        if i + 1 < n:
            row = sess.decode(t)
