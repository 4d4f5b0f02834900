"""Shared helpers: structured views of ggml block bytes."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Unpacked(NamedTuple):
    """A weight matrix as the integer dot products see it.

    q: int8 [rows, n], the integer weight entering the int8 dot (Q4_1: nibble 0..15,
       Q1_0: +-1, Q2_0: q-1 in -1..2, Q4_0: nibble-8, Q5_0: code-16, Q5_1: code 0..31);
       d: f32 [rows, n/block] scales; m: Q4_1 / Q5_1 mins or None.
    """
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None


def blocks(raw: np.ndarray, dtype: np.dtype, nb: int) -> np.ndarray:
    """View [rows, row_bytes] uint8 as [rows, nb] structured blocks (no copy when contiguous)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    return raw[:, : nb * dtype.itemsize].view(dtype).reshape(len(raw), nb)
