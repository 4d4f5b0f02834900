"""One sequence with its own f16 K/V cache: prefill and decode, micro-batched as llama.cpp does."""
from __future__ import annotations

from typing import Callable

import numpy as np

from bankml.backends.reference.run import Env
from bankml.errors import BankmlError
from bankml.ir.node import Node
from bankml.runtime.gpu import for_model as gpu_for_model


def pad256(n: int) -> int:
    return -(-n // 256) * 256


class Session:
    def __init__(self, model):
        self.model = model
        hp = model.hparams
        shape = (model.kv_size, hp.n_head_kv, hp.head_dim)
        self.caches = {(il, kind): np.zeros(shape, np.float16) for il in range(hp.n_layer) for kind in "kv"}
        self.n_past = 0
        self.trace: Callable[[int, Node, np.ndarray], None] | None = None   # (ubatch, node, value)
        self._ubatch_index = 0

    def prefill(self, tokens, outputs: str = "all") -> np.ndarray:
        """llama_decode of one batch: rows for every token ("all") or the last ("last")."""
        if outputs not in ("all", "last"):
            raise BankmlError("outputs must be 'all' or 'last'")
        tokens = list(tokens)
        if not tokens:
            raise BankmlError("prefill needs at least one token")
        rows = []
        step = self.model.n_ubatch
        for start in range(0, len(tokens), step):
            ub = tokens[start:start + step]
            last = start + step >= len(tokens)
            out_ids = list(range(len(ub))) if outputs == "all" else ([len(ub) - 1] if last else [])
            r = self._ubatch(ub, out_ids)
            if r is not None:
                rows.append(r)
        return np.concatenate(rows, axis=0)

    def truncate(self, n: int) -> None:
        """Keep the first n cells and forget the rest (llama.cpp's llama_memory_seq_rm(seq, n, -1)):
        the next prefill or decode continues at position n. Cells past n are masked out and
        overwritten, never read."""
        if not 0 <= n <= self.n_past:
            raise BankmlError(f"truncate({n}): the session holds {self.n_past} cells")
        self.n_past = n

    def decode(self, token: int) -> np.ndarray:
        """One more single-token llama_decode: the logits row of the next position."""
        return self._ubatch([int(token)], [0])[0]

    def _ubatch(self, tokens: list[int], out_ids: list[int]) -> np.ndarray | None:
        m, hp = self.model, self.model.hparams
        T = len(tokens)
        used = self.n_past + T
        if used > m.kv_size:
            raise BankmlError(f"context full: {used} tokens exceed n_ctx {m.n_ctx}")
        if any(t < 0 or t >= hp.n_vocab for t in tokens):
            raise BankmlError(f"token id out of range 0..{hp.n_vocab - 1}")
        n_kv = min(m.kv_size, max(256, pad256(used)))          # llama_kv_cache::get_n_kv
        pos = np.arange(self.n_past, used, dtype=np.int32)
        cells = np.arange(n_kv)
        visible = (cells[None, :] <= pos[:, None]) & (cells[None, :] < used)
        mask = np.where(visible, np.float16(0), np.float16(-np.inf)).astype(np.float16)
        g = m.graph(T, n_kv, len(out_ids))
        env = Env(m.weight, self.caches, {"tokens": np.asarray(tokens, np.int64), "pos": pos, "kq_mask": mask,
                                          "out_ids": np.asarray(out_ids, np.int64)})
        env.gpu = gpu_for_model(m)                     # None: CPU only (runtime/gpu.py)
        ub = self._ubatch_index
        trace = (lambda n, v: self.trace(ub, n, v)) if self.trace else None
        env.threads = m.threads
        out = m.runner(g, env, trace)
        self.n_past = used
        self._ubatch_index += 1
        return out.get("logits")
