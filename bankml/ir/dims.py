"""Symbolic sizes: the dimensions of a micro-batch that change during use.

A generic graph has `Dim`s where a concrete graph has numbers: `T` (tokens in the
micro-batch), `KV` (cache cells the attention reads, a multiple of 256) and `O` (rows whose
logits are wanted). A Dim carries the range of values its graph is valid for, so a pass can
decide a float order for a whole variant at once (`decide`), and a backend can size its
buffers for the largest (`upper`). The values arrive at run time (`Bindings`); `instantiate`
turns a generic graph into the concrete one of those values.

    T = Dim("T", 2, 63)
    shape = (T, 576)                     # printed [T,576]
    concrete(shape, {"T": 7})            # (7, 576)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

# The slots of the run-time size vector every generic kernel reads (i64 dims[5]): the symbolic
# sizes (KVS: the cells of the sliding-window layers' own cache), and llama.cpp's thread count
# (split-KV chunks, tiled Q cut), always last.
DIM_SLOTS = ("T", "KV", "O", "KVS", "llama_threads")


@dataclass(frozen=True)
class Dim:
    name: str       # "T" | "KV" | "O" | "KVS"
    lo: int         # smallest value the graph is valid for
    hi: int         # largest

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    @property
    def slot(self) -> int:
        return DIM_SLOTS.index(self.name)


Bindings = Mapping[str, int]


def is_symbolic(shape) -> bool:
    return any(isinstance(d, Dim) for d in shape)


def upper(shape) -> tuple[int, ...]:
    """The largest concrete shape: every Dim at its hi."""
    return tuple(d.hi if isinstance(d, Dim) else d for d in shape)


def concrete(shape, values: Bindings) -> tuple[int, ...]:
    return tuple(values[d.name] if isinstance(d, Dim) else d for d in shape)


def prod_range(shape) -> tuple[int, int]:
    """(least, largest) value of the product of a shape's sizes."""
    lo = math.prod(d.lo if isinstance(d, Dim) else d for d in shape)
    return lo, math.prod(upper(shape))


def decide(rule: Callable[..., object], *ranges: tuple[int, int]):
    """rule's answer for every value in the ranges: it is asked at each corner (the rules here
    are threshold rules, monotone in each size), and every corner must agree."""
    answers = {rule(*corner) for corner in _corners(ranges)}
    if len(answers) != 1:
        raise ValueError(f"{rule.__name__} differs across sizes {ranges}: the variant must be split")
    return answers.pop()


def _corners(ranges):
    if not ranges:
        yield ()
        return
    lo, hi = ranges[0]
    for rest in _corners(ranges[1:]):
        yield (lo, *rest)
        if hi != lo:
            yield (hi, *rest)


def as_range(x) -> tuple[int, int]:
    return (x.lo, x.hi) if isinstance(x, Dim) else (x, x)
