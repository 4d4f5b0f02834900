"""Slots, the request queue and llama-server's prompt cache (tools/server/server-context.cpp, b11434).

    pool = SlotPool(model, n_slots=1, queue_size=16)
    slot = await pool.acquire(prompt_ids)      # a free slot, its cells primed for prompt_ids; 503 when full
    for ev in run_generation(slot, job, cancel): ...   # in a worker thread
    pool.release(slot)

A slot is one Session and the token ids its cells hold. A request keeps the common prefix of
those ids and its prompt (`get_common_prefix`), re-evaluating the last prompt token when the
whole prompt matches ([TAG_PROMPT_LOGITS]: n_past - 1), and prefills only the rest: one
`Session.prefill`, cut into micro-batches of n_ubatch from the first new token, as
llama_decode cuts llama-server's batch of the rest (n_batch 2048 is a multiple of n_ubatch 512).

The slot is picked as `get_available_slot` picks it: the idle slot whose held ids share more
than `slot_prompt_similarity` (0.1) of the prompt, else the least recently used one. Then, as
llama-server's host-memory prompt cache does (`--cache-ram`, server_prompt_cache in
server-task.cpp), the slot's state is saved when it was picked by LRU or would lose more than
half of its cells, and the saved state that keeps and matches more of the prompt is loaded
instead. Restoring a state restores the exact cells, so the next logits are the same bits as
llama-server's, whose cells came through the same history.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from bankml.runtime.chat import common_prefix
from bankml.server import checkpoints as ckpt

SLOT_PROMPT_SIMILARITY = 0.1        # common/common.h: slot_prompt_similarity
CACHE_RAM_MIB = 8192                # common/common.h: cache_ram_mib


class Busy(Exception):
    """Every slot is busy and the queue is full."""


@dataclass
class SavedPrompt:
    """server_prompt_cache_state: the ids and the cells (K/V rows) of one saved slot."""
    tokens: list[int]
    cells: dict                      # Session.saved: (layer, "k"|"v") -> the first n_tokens cells; the recurrent states
    checkpoints: list = field(default_factory=list)   # the slot's context checkpoints (server_prompt)

    def size(self) -> int:
        return sum(a.nbytes for a in self.cells.values())


class PromptCache:
    """server_prompt_cache: saved slot states, oldest first, bounded in bytes and tokens."""

    def __init__(self, limit_mib: int, limit_tokens: int):
        self.limit_size = 1024 * 1024 * max(0, limit_mib)
        self.limit_tokens = limit_tokens
        self.states: deque[SavedPrompt] = deque()

    def size(self) -> int:
        return sum(s.size() for s in self.states)

    def n_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.states)

    def save(self, tokens: list[int], sess, checkpoints: list | None = None) -> None:
        """slot.prompt_save then server_prompt_cache::alloc."""
        if not tokens:
            return
        if any(common_prefix(s.tokens, tokens) == len(tokens) for s in self.states):
            return                                  # already in the cache
        n = len(tokens)
        cells = sess.saved(n)
        new = SavedPrompt(list(tokens), cells, list(checkpoints or []))
        if self.limit_size and new.size() > self.limit_size:
            return
        self.states = deque(s for s in self.states if common_prefix(s.tokens, tokens) != len(s.tokens))
        while self.limit_size and self.states and self.size() + new.size() > self.limit_size:
            self.states.popleft()
        self.states.append(new)

    def load(self, slot: "Slot", tokens_new: list[int]) -> None:
        """server_prompt_cache::load: replace the slot's state with a saved one that keeps more."""
        lcp_best = common_prefix(slot.tokens, tokens_new)
        f_keep_best = lcp_best / len(slot.tokens) if slot.tokens else -1.0
        f_sim_best = lcp_best / len(tokens_new)
        best = None
        for s in self.states:
            lcp = common_prefix(s.tokens, tokens_new)
            f_keep, f_sim = lcp / len(s.tokens), lcp / len(tokens_new)
            if f_keep < 0.25:
                continue
            if f_keep_best < f_keep and f_sim_best < f_sim:
                f_keep_best, f_sim_best, best = f_keep, f_sim, s
        if best is None:
            return
        n = len(best.tokens)
        slot.session.restore(n, best.cells)
        slot.tokens = list(best.tokens)
        slot.checkpoints = list(best.checkpoints)
        self.states.remove(best)

    def update(self) -> None:
        """server_prompt_cache::update: drop the oldest states past the limits."""
        while self.limit_size and self.states and self.size() > self.limit_size:
            self.states.popleft()
        per_token = max(1.0, self.size() / max(1, self.n_tokens()))
        limit = max(self.limit_tokens, int(self.limit_size / per_token)) if self.limit_size else self.limit_tokens
        while self.limit_tokens and self.states and self.n_tokens() > limit:
            self.states.popleft()


@dataclass
class Slot:
    id: int
    session: object
    tokens: list[int] = field(default_factory=list)     # the ids in the session's cells, in order
    busy: bool = False
    t_last_used: float = -1.0
    n_swa: int = 0                  # the model's window when llama-server's checkpoints apply (swa_full=false)
    checkpoints: list = field(default_factory=list)     # server/checkpoints.py
    n_tasks: int = 0
    last: tuple | None = None       # (task id, job, stream) of the slot's latest task: what GET /slots shows
    progress: tuple = (0, 0, 0.0, 0.0)  # its prompt: (tokens, cached, ms, when generating began)

    @property
    def recurrent(self) -> bool:
        """The model has recurrent states: llama-server's checkpoints apply, carrying them."""
        return bool(self.session.state_keys)

    def keep_for(self, prompt: list[int], cache_prompt: bool = True) -> tuple[int, ckpt.Checkpoint | None]:
        """How many cells a prompt keeps (llama-server's n_past), at least one token left to compute,
        and the context checkpoint it goes back through (None: the cells as they are)."""
        n = common_prefix(self.tokens, prompt) if cache_prompt else 0
        used = None
        if self.n_swa or self.recurrent:
            # llama_memory_seq_pos_min: the recurrent state's one position, or 0 (bankml's full SWA cache)
            n, used = ckpt.keep(n, len(prompt), self.n_swa, self.checkpoints,
                                len(self.tokens) - 1 if self.recurrent else 0)
        if n == len(prompt) and n > 0:
            n -= 1
        return n, used


class SlotPool:
    """--parallel slots over one model, and a bounded FIFO of requests waiting for one."""

    def __init__(self, model, n_slots: int = 1, queue_size: int = 16, cache_ram_mib: int = CACHE_RAM_MIB,
                 swa_full: bool = False):
        self.model = model
        n_swa = 0 if swa_full else model.hparams.n_swa
        self.slots = [Slot(i, model.session(), n_swa=n_swa) for i in range(n_slots)]
        self.queue_size = queue_size
        self.cache = PromptCache(cache_ram_mib, model.n_ctx) if cache_ram_mib != 0 else None
        self.waiting: deque[asyncio.Future] = deque()
        self.lock = threading.Lock()

    def n_busy(self) -> int:
        return sum(s.busy for s in self.slots)

    async def acquire(self, prompt: list[int], id_slot: int = -1) -> Slot:
        """A free slot for this prompt (id_slot != -1: that slot, its id taken modulo the slots, as
        get_slot_by_id), after waiting in line; Busy when the line is full."""
        while True:
            if not self.waiting:
                slot = self._pick(prompt, id_slot)
                if slot is not None:
                    return slot
            if len(self.waiting) >= self.queue_size:
                raise Busy()
            fut = asyncio.get_running_loop().create_future()
            self.waiting.append(fut)
            try:
                await fut
            finally:
                if fut in self.waiting:
                    self.waiting.remove(fut)
            slot = self._pick(prompt, id_slot)
            if slot is not None:
                self._wake()                    # another slot may be free too
                return slot

    def release(self, slot: Slot) -> None:
        with self.lock:
            slot.busy = False
            slot.t_last_used = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        for fut in self.waiting:
            if not fut.done():
                fut.set_result(None)
                return

    def _pick(self, prompt: list[int], id_slot: int = -1) -> Slot | None:
        """get_available_slot: the slot asked for, else by LCP similarity, else least recently
        used; then the prompt cache."""
        with self.lock:
            free = [s for s in self.slots if not s.busy]
            if id_slot != -1:
                asked = self.slots[id_slot % len(self.slots)]
                if asked.busy:
                    return None                 # the task waits for its slot (a deferred task)
                free = [asked]
            if not free:
                return None
            ret, update_cache = None, False
            f_sim_best = 0.0
            for s in free:
                if not s.tokens:
                    continue
                f_sim = common_prefix(s.tokens, prompt) / len(prompt)
                if f_sim > f_sim_best and f_sim > SLOT_PROMPT_SIMILARITY:
                    f_sim_best, ret = f_sim, s
            if ret is not None:
                f_keep = f_sim_best * len(prompt) / len(ret.tokens)
                update_cache = f_keep < 0.5
            elif id_slot != -1:
                ret = free[0]                   # the slot asked for, its cells kept as they are
            else:
                t_last = -1.0
                for s in free:
                    if ret is None or s.t_last_used <= t_last:
                        t_last, ret = s.t_last_used, s
                update_cache = True
            if update_cache and self.cache is not None:
                self.cache.save(ret.tokens, ret.session, ret.checkpoints)
                self.cache.load(ret, prompt)
                self.cache.update()
            ret.busy = True
            return ret


def prefix_state(slot: Slot, prompt: list[int], cache_prompt: bool) -> int:
    """Keep the reusable cells (llama_memory_seq_rm past them); the count kept."""
    keep, used = slot.keep_for(prompt, cache_prompt)
    if used is not None and used.states is not None:
        slot.session.rewind(keep, used.states)      # the checkpoint's states (keep is its n_tokens)
    else:
        slot.session.truncate(min(keep, slot.session.n_past))
    slot.tokens = slot.tokens[:keep]
    return keep


def saved_bytes(pool: SlotPool) -> int:
    return pool.cache.size() if pool.cache is not None else 0
