"""One sequence with its own K/V cache (and a hybrid model's recurrent states): prefill and
decode, micro-batched as llama.cpp does."""
from __future__ import annotations

from typing import Callable

import numpy as np

from bankml.errors import BankmlError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import STATE_KINDS, Op
from bankml.quants.kv_cache import cache_array
from bankml.runtime.kv_cells import SwaCells


class Session:
    def __init__(self, model):
        self.model = model
        hp = model.hparams
        self.caches = new_caches(model.generic_graph(model.variants[0]))
        # the recurrent layers' conv and SSM states (llama_memory_recurrent): one per sequence, not per cell
        self.state_keys = tuple(key for key in self.caches if key[1] in STATE_KINDS)
        # the sliding-window layers' own cells (llama_kv_cache_iswa), where they have a window
        self.swa = SwaCells(model.kv_size_swa, hp.n_swa) if hp.n_swa else None
        self.n_past = 0
        # kv_size zeros then kv_size -inf: a decode's mask row (cells < used visible) is a slice of it
        self._mask_row = np.repeat(np.array([0, -np.inf], np.float16), model.kv_size)
        self.trace: Callable[[int, Node, np.ndarray], None] | None = None   # (ubatch, node, value)
        self._ubatch_index = 0

    def prefill(self, tokens, outputs: str = "all") -> np.ndarray:
        """llama_decode of one batch: rows for every token ("all") or the last ("last").
        The whole call is checked (token ids, room in the context) before anything runs."""
        if outputs not in ("all", "last"):
            raise BankmlError("outputs must be 'all' or 'last'")
        tokens = self._checked(tokens)
        rows = []
        for start, stop, out_ids in self.model.micro_batches(len(tokens), outputs):
            r = self._ubatch(tokens[start:stop], out_ids)
            if r is not None:
                rows.append(r)
        return np.concatenate(rows, axis=0)

    def embeddings(self, tokens) -> np.ndarray:
        """llama_decode of one batch with every token an output, as a llama.cpp context with
        embeddings on: each token's final-norm row (result_norm, t_embd), not the logits."""
        tokens = self._checked(tokens)
        return np.concatenate([self._ubatch(tokens[start:stop], out_ids, "embd")
                               for start, stop, out_ids in self.model.micro_batches(len(tokens), "all")], axis=0)

    def decode(self, token: int) -> np.ndarray:
        """One more single-token llama_decode: the logits row of the next position."""
        return self._ubatch(self._checked([token]), [0])[0]

    def truncate(self, n: int) -> None:
        """Keep the first n cells and forget the rest (llama.cpp's llama_memory_seq_rm(seq, n, -1)):
        the next prefill or decode continues at position n. Cells past n are masked out and
        overwritten, never read. A recurrent state holds the whole sequence and cannot go back:
        as llama_memory_recurrent::seq_rm, only n = 0 (the states zeroed) and n = n_past are
        taken (rewind() goes back to a saved state)."""
        if not 0 <= n <= self.n_past:
            raise BankmlError(f"truncate({n}): the session holds {self.n_past} cells")
        if self.state_keys and 0 < n < self.n_past:
            raise BankmlError(f"truncate({n}): a recurrent model's state cannot go back from {self.n_past} to {n} "
                              "cells (llama.cpp refuses it too); truncate(0) starts over")
        if self.state_keys and n == 0:
            for key in self.state_keys:
                self.caches[key][...] = 0
        self.n_past = n
        if self.swa is not None:
            self.swa.remove(n)

    def saved(self, n: int) -> dict:
        """A copy of the first n cells of every K/V cache and of the recurrent states (llama_state_seq_get_data):
        what restore(n, saved) puts back."""
        return {key: a.copy() if key in self.state_keys else a[:n].copy() for key, a in self.caches.items()}

    def recurrent_states(self) -> dict:
        """A copy of the recurrent states (what a context checkpoint carries; rewind() loads it)."""
        return {key: self.caches[key].copy() for key in self.state_keys}

    def rewind(self, n: int, states: dict) -> None:
        """Go back to n cells with the recurrent states saved when the session held n (llama-server's
        context checkpoint, loaded with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): the K/V cells before n
        are this session's own."""
        if not 0 <= n <= self.n_past:
            raise BankmlError(f"rewind({n}): the session holds {self.n_past} cells")
        for key in self.state_keys:
            self.caches[key][...] = states[key]
        self.n_past = n

    def restore(self, n: int, saved: dict | None = None) -> None:
        """The first n cells of every cache now hold positions 0..n-1 (a saved prompt copied back
        into them, as llama-server's prompt cache does: `saved`, from saved(n), or written by the
        caller); the next token goes to position n."""
        if not 0 <= n <= self.model.kv_size:
            raise BankmlError(f"restore({n}): the cache has {self.model.kv_size} cells")
        for key, a in (saved or {}).items():
            if key in self.state_keys:
                self.caches[key][...] = a
            else:
                self.caches[key][:n] = a
        if self.swa is not None:
            if self.swa.size != self.model.kv_size:
                raise BankmlError("restoring saved cells needs the full-size sliding-window cache (swa_full)")
            self.swa.remove(0)
            self.swa.pos[:n] = np.arange(n)
            self.swa.head = n
        self.n_past = n

    def _checked(self, tokens) -> list[int]:
        """The tokens as ints, or an error naming what is wrong; nothing has run yet."""
        m = self.model
        try:
            tokens = [int(t) for t in tokens]
        except (TypeError, ValueError):
            raise BankmlError("tokens must be integers") from None
        if not tokens:
            raise BankmlError("prefill needs at least one token")
        n_vocab = m.hparams.n_vocab
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise BankmlError(f"token id {bad} is out of range 0..{n_vocab - 1}")
        if self.n_past + len(tokens) > m.kv_size:
            padded = "" if m.kv_size == m.n_ctx else f" (padded to {m.kv_size} cells)"
            raise BankmlError(f"context full: {self.n_past} tokens held + {len(tokens)} new exceed n_ctx "
                              f"{m.n_ctx}{padded}")
        return tokens

    def _ubatch(self, tokens: list[int], out_ids: list[int], want: str = "logits") -> np.ndarray | None:
        m = self.model
        T = len(tokens)
        used = self.n_past + T
        n_kv = m.n_kv(used)
        pos = np.arange(self.n_past, used, dtype=np.int32)
        if T == 1:          # a decode: the cells before `used` (a view of the 0 | -inf row, no new mask)
            mask = self._mask_row[None, m.kv_size - used:m.kv_size - used + n_kv]
        else:
            cells = np.arange(n_kv)
            visible = (cells[None, :] <= pos[:, None]) & (cells[None, :] < used)
            mask = np.where(visible, np.float16(0), np.float16(-np.inf)).astype(np.float16)
        inputs = {"tokens": np.asarray(tokens, np.int64), "pos": pos, "kq_mask": mask,
                  "out_ids": np.asarray(out_ids, np.int64)}
        n_kv_swa = None
        if self.swa is not None:
            # the sliding-window layers' cache: cells by llama.cpp's slot search, its own n_kv,
            # and its mask (is_masked_swa: p1 - p0 >= n_swa is hidden)
            idxs, n_kv_swa, inputs["kq_mask_swa"] = self.swa.place(pos)
            inputs["swa_idxs"] = np.asarray(idxs, np.int32)
        ub = self._ubatch_index
        trace = (lambda n, v: self.trace(ub, n, v)) if self.trace else None
        out = m.run_ubatch(T, n_kv, len(out_ids), inputs, self.caches, trace, n_kv_swa, want)
        self.n_past = used
        self._ubatch_index += 1
        rows = out.get(want)
        return None if rows is None or not out_ids else rows[:len(out_ids)]


def cache_layouts(g: Graph) -> dict[tuple[int, str], tuple[tuple[int, ...], np.dtype]]:
    """Every layer's K and V cache as the graph's CACHE nodes lay them out (their type, heads and
    head size, params["cells"]: kv_cache.cache_array), and a recurrent layer's states (no cells:
    the node's shape is the whole state): (shape, dtype) each; any variant's nodes say the same."""
    def shape(n: Node) -> tuple[int, ...]:
        return (n.params["cells"], *n.shape[1:]) if "cells" in n.params else n.shape
    return {(n.params["layer"], n.params["kind"]): cache_array(n.dtype, shape(n))
            for n in g.nodes.values() if n.op is Op.CACHE}


def new_caches(g: Graph) -> dict[tuple[int, str], np.ndarray]:
    """The caches of cache_layouts(g), zeroed. A recurrent state is written now (every token reads
    all of it: its pages are in memory before the first one); K/V cells are zero pages until used."""
    caches = {}
    for key, layout in cache_layouts(g).items():
        caches[key] = np.zeros(*layout)
        if key[1] in STATE_KINDS:
            caches[key].fill(0)
    return caches
