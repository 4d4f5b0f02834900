"""q8_0 / q8_1 activation quantization equals ggml-cpu's AVX2 quantize_row_q8_0/q8_1, byte for byte."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.oracle import ggml as G
from bankml.quants.activation import quantize_q8_0, quantize_q8_1, to_bytes

pytestmark = pytest.mark.oracle


def _rows(kind: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    K = 256
    if kind == "normal":
        return rng.standard_normal((6, K)).astype(np.float32)
    if kind == "zeros":                       # whole zero rows and zero blocks inside a row
        x = rng.standard_normal((3, K)).astype(np.float32)
        x[0] = 0
        x[1, 32:96] = 0
        x[2, ::2] = -0.0
        return x
    if kind == "ties":                        # x*id lands on k+0.5: amax 127 gives id 1, amax 254 gives 0.5
        a = (rng.integers(-127, 127, (2, K)) + 0.5).astype(np.float32)
        a[:, ::32] = 127
        b = (rng.integers(-127, 127, (2, K)) * 2 + 1).astype(np.float32)
        b[:, ::32] = -254
        return np.concatenate([a, b])
    if kind == "ranges":                      # tiny to huge scales, f16 overflow of d and s, subnormals
        scales = np.array([1e-30, 1e-6, 1.0, 1e4, 6e4 * 127, 1e30, 1e-44], np.float32)
        return (rng.standard_normal((len(scales), K)) * scales[:, None]).astype(np.float32)
    raise ValueError(kind)


KINDS = ["normal", "zeros", "ties", "ranges"]


def _oracle(ggml_type: int, x: np.ndarray) -> np.ndarray:
    return np.stack([np.frombuffer(G.from_float(ggml_type, r), np.uint8) for r in x])


@pytest.mark.parametrize("kind", KINDS)
def test_q8_0_activation_bytes_equal_quantize_row_q8_0(kind):
    x = _rows(kind)
    with np.errstate(all="ignore"):
        mine = to_bytes(quantize_q8_0(x))
    assert np.array_equal(mine, _oracle(G.TYPE_Q8_0, x))


@pytest.mark.parametrize("kind", KINDS)
def test_q8_1_activation_bytes_equal_quantize_row_q8_1(kind):
    x = _rows(kind)
    with np.errstate(all="ignore"):
        mine = to_bytes(quantize_q8_1(x))
    assert np.array_equal(mine, _oracle(9, x))


def test_ties_round_to_even_not_away():
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 127, 2.5, -3.5            # id = 1: 2.5 -> 2, -3.5 -> -4
    q = quantize_q8_0(x).q[0]
    assert (q[0], q[1], q[2]) == (127, 2, -4)
