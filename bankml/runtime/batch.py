"""Sessions decoding together: one graph run for one token of each, each with its solo bits.

    batch = model.batch([sess_a, sess_b, sess_c])
    rows = batch.decode([tok_a, tok_b, tok_c])     # rows[i] == sessions[i].decode(tokens[i]), bit for bit

One run of the `decode-seqs` graph (passes/variants.py) takes the tokens: every mul_mat reads
each weight row once for all of them, which is most of a decode step's cost. Each row is its
own sequence: its mul_mat column takes the path ggml takes for one column
(choose_matmul_kernel), its K/V rows go to its own session's cache, and its attention reads its
own cells with the kernel its decode takes alone (choose_attention_kernel: FA_ROWS), so its
logits are the bits of `sess.decode(tok)` whatever else is in the batch, in any order. A
batch of more than SEQS_MAX sessions runs in several graph runs; one session decodes alone.

Models whose sessions cannot share a step are refused in one line (Model.batch_refusal): a
recurrent model's states, a quantized K/V cache, the portable profile, a GPU-placed decode.
"""
from __future__ import annotations

import numpy as np

from bankml.errors import BankmlError
from bankml.passes.variants import SEQS_MAX


class SessionBatch:
    """A fixed list of sessions of one model that decode one token each per step."""

    def __init__(self, model, sessions):
        sessions = list(sessions)
        why = model.batch_refusal()
        if why:
            raise BankmlError(f"model.batch: {why}")
        if not sessions:
            raise BankmlError("model.batch needs at least one session")
        if len({id(s) for s in sessions}) != len(sessions):
            raise BankmlError("model.batch: a session appears twice (each decodes one token per step)")
        if any(s.model is not model for s in sessions):
            raise BankmlError("model.batch: every session must belong to this model")
        self.model, self.sessions = model, sessions
        self._caches: dict[int, dict] = {}      # a run's caches by its first session (kept: the backend
                                                # binds the same lists without looking again)

    def decode(self, tokens) -> np.ndarray:
        """One token for each session (tokens[i] to sessions[i]): the logits rows [n_sessions, n_vocab],
        row i the bits sessions[i].decode(tokens[i]) gives alone. Every token and every session's room
        is checked before anything runs."""
        try:
            tokens = list(tokens) if not isinstance(tokens, (str, bytes)) else None
        except TypeError:
            tokens = None
        if tokens is None or len(tokens) != len(self.sessions):
            raise BankmlError(f"batch.decode takes one token per session ({len(self.sessions)})")
        checked = [s._checked([t])[0] for s, t in zip(self.sessions, tokens)]
        rows = [self._run(i, self.sessions[i:i + SEQS_MAX], checked[i:i + SEQS_MAX])
                for i in range(0, len(self.sessions), SEQS_MAX)]
        return np.concatenate(rows)

    def _run(self, first: int, sessions, tokens: list[int]) -> np.ndarray:
        if len(sessions) == 1:
            return sessions[0].decode(tokens[0])[None]
        S, KV, inputs, caches, n_kv_swa = self.step_inputs(first, sessions, tokens)
        out = self.model.run_seqs(S, KV, inputs, caches, n_kv_swa)
        for s in sessions:
            s.n_past += 1
            s._ubatch_index += 1
        return out["logits"][:S]

    def step_inputs(self, first: int, sessions, tokens: list[int]):
        """(S, KV, inputs, caches, n_kv_swa) of one decode-seqs run (Model.run_seqs) of checked tokens,
        one for each of sessions (the batch's from index first); nothing runs."""
        m, S = self.model, len(sessions)
        used = np.array([s.n_past + 1 for s in sessions])
        cells = np.array([m.n_kv(u) for u in used], np.int32)
        KV = int(cells.max())
        pos = (used - 1).astype(np.int32)
        # row i sees its session's cells below used[i] (a decode's mask row), -inf after
        mask = np.where(np.arange(KV)[None, :] < used[:, None], np.float16(0), np.float16(-np.inf)).astype(np.float16)
        inputs = {"tokens": np.asarray(tokens, np.int64), "pos": pos, "kq_mask": mask,
                  "out_ids": np.arange(S, dtype=np.int64), "kv_cells": cells}
        n_kv_swa = None
        if m.kv_size_swa:           # each session's own sliding-window cells, as its _ubatch finds them
            idxs, swa_cells, masks = zip(*(s.swa.place(pos[i:i + 1]) for i, s in enumerate(sessions)))
            n_kv_swa = max(swa_cells)
            mask_swa = np.full((S, n_kv_swa), -np.inf, np.float16)
            for i, row in enumerate(masks):
                mask_swa[i, :row.shape[1]] = row[0]
            inputs.update(swa_idxs=np.concatenate(idxs).astype(np.int32), kq_mask_swa=mask_swa,
                          kv_cells_swa=np.asarray(swa_cells, np.int32))
        caches = self._caches.get(first)
        if caches is None:
            caches = self._caches[first] = {key: [s.caches[key] for s in sessions] for key in sessions[0].caches}
        return S, KV, inputs, caches, n_kv_swa
