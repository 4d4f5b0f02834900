"""llama-server's context checkpoints for a sliding-window model (b11434, swa_full=false, its
default) or a recurrent/hybrid one (Qwen3.5).

tools/server/server-context.cpp makes checkpoints of what the memory cannot roll back for every
completion task of a model with n_swa > 0 or whose memory refuses a partial seq_rm
(COMMON_CONTEXT_SEQ_RM_TYPE_FULL: a recurrent state), and they change what runs:

- the prompt is decoded in batches that end before the first token of a user message (the
  chat template's user delimiter, `message_spans`) and `min(n_batch, 4 + n_ubatch)` and 4 tokens
  before the prompt's end (`checkpoint_offsets`); a checkpoint (n_tokens, pos_min, pos_max of
  the cache before the batch) is made before a batch that starts a user message or ends near
  the prompt's end (`create_checkpoint`);
- a later request keeps its common prefix only through a checkpoint: when the cache's pos_min
  is at least `pos_min_thold = max(0, pos_next - n_swa - ...)`, the newest checkpoint at or
  before pos_next decides n_past, none means the whole prompt again ("forcing full prompt
  re-processing").

A recurrent model's memory (llama_memory_hybrid) reports pos_min = pos_max = the last position
its states hold: a checkpoint made before the batch at `start` is (start, start-1, start-1) and
carries the recurrent states, loaded back when a later prompt keeps `start` tokens through it;
a prompt that extends every held token keeps them all (pos_min < the threshold).

bankml's sliding-window cache is full-size, so the checkpoints' cells are the slot's own cells:
these rules decide only the batches and n_past. They equal llama-server's while its ring of
GGML_PAD(n_swa + n_ubatch, 256) cells has not wrapped (pos_min is 0), which is where bankml's
cache equals it (docs/ARCHITECTURES.md, "The SWA cache").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

N_CTX_CHECKPOINTS = 32          # common/common.h: n_ctx_checkpoints
CHECKPOINT_MIN_STEP = 8192      # common/common.h: checkpoint_min_step
N_BATCH = 2048                  # common/common.h: n_batch
N_UBATCH = 512                  # common/common.h: n_ubatch


@dataclass(frozen=True)
class Checkpoint:
    n_tokens: int
    pos_min: int
    pos_max: int
    task: int
    states: dict | None = field(default=None, compare=False)   # a recurrent model's states at n_tokens


def keep(n_past: int, n_task: int, n_swa: int, checkpoints: list[Checkpoint],
         pos_min: int = 0) -> tuple[int, Checkpoint | None]:
    """n_past after the checkpoint rules (before [TAG_PROMPT_LOGITS]) and the checkpoint it goes
    back through (None: the cells as they are, or none); drops the checkpoints past it. pos_min is
    the memory's llama_memory_seq_pos_min: 0 for bankml's full-size sliding-window cache, the
    last held position for a recurrent model."""
    pos_next, used = n_past, None
    if n_past > 0:
        thold = max(0, pos_next - n_swa - (0 if n_past < n_task else 1))
        if pos_min >= thold:
            used = next((c for c in reversed(checkpoints)
                         if c.pos_max <= pos_next and (c.pos_min < thold or c.pos_min == 0)), None)
            if used is None:
                pos_next = n_past = 0
            else:
                pos_next = min(pos_next, max(used.pos_min + 1, used.pos_max))
                n_past = min(pos_next, used.n_tokens)
    checkpoints[:] = [c for c in checkpoints if c.pos_max <= pos_next]
    return n_past, used


def batches(n_past: int, n_task: int, user_starts: set[int], checkpoints: list[Checkpoint], task: int,
            states: Callable[[], dict] | None = None):
    """The batches [start, stop) the prompt's rest is decoded in, making checkpoints as they start;
    `states` (a recurrent model) copies the states the checkpoint carries, before the batch runs."""
    last_user = max(user_starts, default=-1)
    n = n_past
    while n < n_task:
        start = n
        while n < n_task and n - start < N_BATCH:
            n += 1
            if n in user_starts and (n == last_user or not checkpoints
                                     or n > checkpoints[-1].n_tokens + CHECKPOINT_MIN_STEP):
                break
            if n_task in (n + min(N_BATCH, 4 + N_UBATCH), n + min(N_BATCH, 4)):
                break
        near_end = n_task < n + N_UBATCH
        make = start > 0                               # pos_min >= 0: the cache holds a cell
        if n < n_task and start not in user_starts and not near_end:
            make = False
        make = make and (not checkpoints or start == last_user or near_end
                         or start > checkpoints[-1].n_tokens + CHECKPOINT_MIN_STEP)
        if make:
            pos_min = start - 1 if states else 0
            _create(checkpoints, Checkpoint(start, pos_min, start - 1, task, states() if states else None))
        yield start, n


def _create(checkpoints: list[Checkpoint], new: Checkpoint) -> None:
    """create_checkpoint: evict close or old ones when full, supersede one at the same n_tokens."""
    i, last = 0, -1
    while len(checkpoints) + 1 >= N_CTX_CHECKPOINTS and i < len(checkpoints):
        c = checkpoints[i]
        if c.task != new.task and last >= 0 and c.n_tokens <= last + CHECKPOINT_MIN_STEP:
            del checkpoints[i]
            continue
        last = c.n_tokens
        i += 1
    while len(checkpoints) >= N_CTX_CHECKPOINTS:
        checkpoints.pop(0)
    checkpoints[:] = [c for c in checkpoints if c.n_tokens != new.n_tokens]
    checkpoints.append(new)


def user_starts(prompt: list[int], delimiter: list[int]) -> set[int]:
    """common_chat_msg_delimiters::split for one user delimiter: where its tokens begin."""
    k = len(delimiter)
    return {i for i in range(len(prompt) - k + 1) if k and prompt[i:i + k] == delimiter}
