"""The portable profile's Gated-DeltaNet functions, as the decode-arithmetic document defines them.

A Gated-DeltaNet memory is, per value head, one state row per value element (row r holds the
key-sized weights that value r reads through). A token with key k, values v, decay and update
gate beta changes row r by the rank-one update

    coef = beta * (v[r] - decay * (row . k))        row <- decay * row + coef * k

and reads it out through its query. Every step below is one rounded f32 operation of arith.py
(no FMA), every dot `fdot` (LANES lanes, then the tree). A head may keep its rows lazily: the
tokens since the last flush stay in a log (`Logged`), a read folds the query back through the log
(`gdn_fold`) and reads the stored row (`gdn_read`), a flush replays the log over the row
(`gdn_flush`) and gives the same row the token-by-token memory has.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bankml.profiles.portable.arith import F32, add, canon, fdot, mul, sub
from bankml.profiles.portable.funcs import exp, silu

Store = Callable[[np.ndarray], np.ndarray]


def conv(ring, x, kernel) -> np.ndarray:
    """A Gated-DeltaNet block's causal convolution through SiLU, channel by channel: the ring's rows,
    oldest first, against the channel's first taps, then the token's row x against its last, the
    products summed in tap order from +0. kernel holds each channel's taps weights together.

    ring [taps - 1, channels] (oldest first), x [channels], kernel [channels, taps] -> [channels].
    """
    return silu(conv_sum(ring, x, kernel))


def conv_sum(ring, x, kernel) -> np.ndarray:
    """conv's sum before the SiLU (the graph's SSM_CONV; its SILU node applies funcs.silu): the
    products of the ring's rows and then x with the taps, added in tap order from +0."""
    ring, x, kernel = canon(ring), canon(x), canon(kernel)
    taps = kernel.shape[-1]
    if ring.shape[0] != taps - 1:
        raise ValueError(f"conv: a ring of {ring.shape[0]} rows for {taps} taps (needs {taps - 1})")
    acc = np.zeros(x.shape, F32)
    for t in range(taps - 1):
        acc = add(acc, mul(ring[t], kernel[:, t]))
    return add(acc, mul(x, kernel[:, taps - 1]))


def gdn_update(row: np.ndarray, k, v, decay, beta, store: Store | None = None) -> np.float32:
    """One value row of a Gated-DeltaNet memory through one token's rank-one update:
    coef = beta·(v − decay·(row·k)), each element decay·m + coef·k written back through store;
    returns coef.

    `row` (f32, updated in place) is the row, `v` its value element of the token; `store` rounds
    what is written (default: the f32 itself). Rows stacked on leading axes (row [..., S_k], v
    [...]) are each updated as alone; coef has v's shape."""
    k = canon(k)
    coef = mul(beta, sub(v, mul(decay, fdot(row, k))))
    new = add(mul(decay, row), mul(np.asarray(coef)[..., None], k))
    row[...] = new if store is None else store(new)
    return F32(coef) if np.ndim(coef) == 0 else coef


def gdn_row(row: np.ndarray, k, q, v, decay, beta, kq, scale, store: Store | None = None) -> np.float32:
    """One value row of a Gated-DeltaNet memory through one token, in one pass over the row: its dots
    with the token's key and query, the rank-one update (gdn_update), and the row's read-out
    (decay·(row·q) + coef·(k·q))·scale of the row as it was. kq is the head's k·q.

    `row` is updated in place; returns the read-out (rows stacked as gdn_update's: one each)."""
    rq = fdot(row, canon(q))
    coef = gdn_update(row, k, v, decay, beta, store)
    out = mul(add(mul(decay, rq), mul(coef, kq)), scale)
    return F32(out) if np.ndim(out) == 0 else out


def gdn_read(row, y, carried, scale) -> np.float32:
    """A lazily flushed state row's read-out through its head's folded query: (row·y + carried)·scale."""
    return F32(mul(add(fdot(canon(row), canon(y)), carried), scale))


@dataclass(frozen=True)
class Logged:
    """One logged token as a lazily flushed head reads it: its key group's key, the head's values, the
    exponent of its decay and its update gate, as the log stores them.

    key [S_k], values [S_v] f32; the decay is exp(g) (funcs.exp), the gate beta."""
    key: np.ndarray
    values: np.ndarray
    g: np.float32
    beta: np.float32

    @property
    def decay(self) -> np.float32:
        return F32(exp(self.g))


def gdn_flush(row: np.ndarray, log: list[Logged], r: int, store: Store | None = None) -> None:
    """A lazily flushed state row's flush: every logged update replayed over the row in order
    (gdn_update with value r of each token), exactly as the token-by-token memory makes them, and
    the row stored once through store.

    Each replayed step rounds its elements through `store` as the token-by-token memory's writes
    do (so the row is that memory's row bit for bit); the row is written back once, at the end."""
    work = np.array(row, F32, copy=True)
    for tok in log:
        gdn_update(work, tok.key, tok.values[r], tok.decay, tok.beta, store)
    row[...] = work


def gdn_fold(log: list[Logged], q, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A query folded back through a lazily flushed head's log, newest token first: per token, its gate
    times the key's dot with the folded query; that coefficient times the token's values collected
    into width sums; the query decayed past the token's update, y ← decay·(y − coef·k). Returns the
    folded query and the collected values."""
    (y, carried), = _walk(log, q, width, [0])
    return y, carried


def gdn_fold_trailing(log: list[Logged], q, width: int, older: int):
    """gdn_fold over a log whose oldest `older` tokens a trailing flush is replaying, in one walk: first
    through the newer tokens alone, the fold a row the flush has replayed reads, then on through the
    older ones, the fold every other row reads. The walk is newest first, so the first is where the
    second has reached after the newer tokens: each is gdn_fold over its own tokens, bit for bit.

    Returns ((y, carried) over the newer tokens, (y, carried) over the whole log)."""
    if not 0 <= older <= len(log):
        raise ValueError(f"gdn_fold_trailing: {older} older tokens in a log of {len(log)}")
    newer, whole = _walk(log, q, width, [older, 0])
    return newer, whole


def _walk(log, q, width, stops):
    """Fold newest first; the (y, carried) reached when only the oldest `stop` tokens are left, for
    each of `stops` (descending)."""
    y = canon(q)                    # a copy: canon always makes one
    carried = np.zeros(width, F32)
    out = []
    for i in range(len(log), -1, -1):
        while stops and i == stops[0]:
            out.append((y.copy(), carried.copy()))
            stops = stops[1:]
        if i == 0:
            break
        tok = log[i - 1]
        key = canon(tok.key)
        coef = mul(tok.beta, fdot(key, y))
        carried = add(carried, mul(coef, canon(tok.values)[:width]))
        y = mul(tok.decay, sub(y, mul(coef, key)))
    return out


def log_arrays(log: list[Logged], s_k: int, s_v: int) -> tuple[np.ndarray, ...]:
    """A non-empty log as a backend's buffers: keys [L, S_k], values [L, S_v], g [L], beta [L] (f32);
    ValueError naming what does not fit."""
    if not log or any(np.shape(t.key) != (s_k,) or np.shape(t.values) != (s_v,) for t in log):
        raise ValueError(f"a log of {len(log)} tokens does not fit keys of {s_k} and values of {s_v}")
    return (np.ascontiguousarray([t.key for t in log], F32), np.ascontiguousarray([t.values for t in log], F32),
            np.array([t.g for t in log], F32), np.array([t.beta for t in log], F32))


def check_fold(log: list[Logged], q, width: int, older: int) -> tuple[int, int]:
    """(S_k, S_v) of a fold's arguments (gdn_fold_trailing's), or ValueError."""
    s_k, s_v = np.shape(q)[0], (np.shape(log[0].values)[0] if log else 0)
    if not log or not 0 <= older <= len(log) or not 0 < width <= s_v:
        raise ValueError(f"a fold of {len(log)} tokens, {older} older, width {width} of {s_v} values")
    return s_k, s_v


def check_read(rows, y, carried) -> None:
    """gdn_read's arguments for rows [R, S_k] at once: y [S_k], carried [R]; or ValueError."""
    R, s_k = np.shape(rows)
    if np.shape(y) != (s_k,) or np.shape(carried) != (R,):
        raise ValueError(f"a read of rows {list(np.shape(rows))} through y {list(np.shape(y))} and carried "
                         f"{list(np.shape(carried))}")
