"""The cells of llama.cpp's sliding-window cache (src/llama-kv-cache.cpp), one sequence.

llama_kv_cache_iswa gives the sliding-window layers a cache of their own. With `swa_full`
(llama_context_default_params) it has as many cells as the base cache; without it (llama-server,
llama-cli) PAD256(min(kv_size, n_swa + n_ubatch)) cells, reused once the window has left them.
Where a token's K/V row goes, and so the order in which attention visits the keys, is decided
by llama.cpp's slot search, mirrored here:

- find_slot (cont = false): from `head` (reset to 0 when head > used + 2*n_tokens), cell by cell,
  wrapping at the end, take a cell that is empty or whose position the window has left
  (is_masked_swa(pos, seq_pos_max + 1): seq_pos_max + 1 - pos >= n_swa, with the positions held
  before this micro-batch);
- apply_ubatch: overwrite those cells, then purge every position below the largest one
  overwritten (seq_rm(seq_pos_min, max_rm + 1)); head = last cell + 1;
- get_n_kv: min(size, max(256, PAD256(used_max_p1)));
- the mask (set_input_kq_mask): a cell is visible to the token at p1 when it holds p0 <= p1
  and p1 - p0 < n_swa.
"""
from __future__ import annotations

import numpy as np

from bankml.errors import BankmlError


class SwaCells:
    def __init__(self, size: int, n_swa: int):
        self.size, self.n_swa = size, n_swa
        self.pos = np.full(size, -1, np.int64)     # the position each cell holds, -1 when empty
        self.head = 0

    def find_slot(self, n_tokens: int) -> list[int]:
        """llama_kv_cache::find_slot(ubatch, cont=false) for n_tokens tokens of the sequence."""
        used = int((self.pos >= 0).sum())
        head = 0 if self.head > used + 2 * n_tokens else self.head
        p1 = int(self.pos.max()) + 1 if used else 0        # seq_pos_max + 1 (pos_max is -1 when empty)
        idxs, tested = [], 0
        while len(idxs) < n_tokens:
            if tested >= self.size:
                raise BankmlError(f"no room for {n_tokens} tokens in the sliding-window cache of {self.size} cells")
            if head + 1 > self.size:
                tested += self.size - head
                head = 0
                continue
            p0 = self.pos[head]
            if p0 < 0 or p1 - p0 >= self.n_swa:
                idxs.append(head)
            head += 1
            tested += 1
        return idxs

    def apply(self, idxs: list[int], positions: np.ndarray) -> None:
        """llama_kv_cache::apply_ubatch: place the tokens, purge what lies below what they overwrote."""
        max_rm = -1
        for i, p in zip(idxs, positions):
            if self.pos[i] >= 0:
                max_rm = max(max_rm, int(self.pos[i]))
            self.pos[i] = int(p)
        if max_rm >= 0:
            held = self.pos[self.pos >= 0]
            if held.size and held.min() <= max_rm:
                self.remove(int(held.min()), max_rm + 1)
        self.head = idxs[-1] + 1

    def remove(self, p0: int, p1: int | None = None) -> None:
        """llama_kv_cache::seq_rm(seq, p0, p1): free the cells holding p0 <= pos < p1; head moves
        back to the first freed cell."""
        gone = (self.pos >= p0) & (self.pos < (np.iinfo(np.int64).max if p1 is None else p1))
        if gone.any():
            self.pos[gone] = -1
            self.head = min(self.head, int(np.argmax(gone)))

    def place(self, positions) -> tuple[list[int], int, np.ndarray]:
        """A micro-batch of these positions placed (find_slot, then apply_ubatch): its cells, the
        n_kv the attention then reads and the mask [tokens, n_kv] it reads through."""
        idxs = self.find_slot(len(positions))
        self.apply(idxs, positions)
        n_kv = self.n_kv()
        return idxs, n_kv, self.mask(positions, n_kv)

    def n_kv(self) -> int:
        """llama_kv_cache::get_n_kv: the cells attention reads."""
        used = np.nonzero(self.pos >= 0)[0]
        used_max_p1 = int(used[-1]) + 1 if used.size else 0
        return min(self.size, max(256, -(-used_max_p1 // 256) * 256))

    def mask(self, positions: np.ndarray, n_kv: int) -> np.ndarray:
        """set_input_kq_mask for the sliding-window layers: [tokens, n_kv] f16, 0 or -inf."""
        p0 = self.pos[None, :n_kv]
        p1 = np.asarray(positions, np.int64)[:, None]
        visible = (p0 >= 0) & (p0 <= p1) & (p1 - p0 < self.n_swa)
        return np.where(visible, np.float16(0), np.float16(-np.inf)).astype(np.float16)
