"""Weight types: registry facts and dequantize equal to ggml-base's to_float, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.oracle import ggml as G
from bankml.quants import WEIGHT_TYPES

TYPES = sorted(WEIGHT_TYPES)
IDS = [WEIGHT_TYPES[t].name for t in TYPES]
QUANT = [t for t in TYPES if t != G.TYPE_F16]


def weights(ggml_type: int, rows: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random f32 weights and their bytes: f16 rounding, or ggml_quantize_chunk."""
    w = np.random.default_rng(seed).standard_normal((rows, n)).astype(np.float32)
    w[0, :64] = 0                                          # a zero block (d = 0)
    if ggml_type == G.TYPE_F16:
        return w, w.astype(np.float16).view(np.uint8)
    return w, G.quantize_chunk(ggml_type, w)


@pytest.mark.oracle
@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_block_layout_matches_ggml(ggml_type):
    wt = WEIGHT_TYPES[ggml_type]
    assert wt.ggml_id == ggml_type
    assert wt.row_bytes(1024) == G.row_size(ggml_type, 1024)
    assert wt.act_type == G.vec_dot_type(ggml_type)


@pytest.mark.oracle
@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_dequantize_bits_equal_to_float(ggml_type):
    n = 1536
    _, raw = weights(ggml_type, 9, n)
    mine = WEIGHT_TYPES[ggml_type].dequantize(raw, n)
    ref = np.stack([G.to_float(ggml_type, r.tobytes(), n) for r in raw])
    assert mine.dtype == np.float32 and mine.shape == (9, n)
    assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("ggml_type", QUANT, ids=[WEIGHT_TYPES[t].name for t in QUANT])
def test_dequantize_of_every_code(ggml_type):
    """Random bytes (every nibble / bit pattern), with sane f16 scales, dequantize like ggml."""
    wt, n = WEIGHT_TYPES[ggml_type], 512
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (4, wt.row_bytes(n)), dtype=np.uint8)
    blocks = raw.reshape(4, -1, wt.block_bytes)
    halves = 2 if ggml_type in (G.TYPE_Q4_1, G.TYPE_Q5_1) else 1   # d (and m) at the start of each block
    scales = rng.standard_normal((4, blocks.shape[1], halves)).astype(np.float16)
    blocks[:, :, :2 * halves] = scales.view(np.uint8).reshape(4, blocks.shape[1], 2 * halves)
    mine = wt.dequantize(raw, n)
    ref = np.stack([G.to_float(ggml_type, r.tobytes(), n) for r in raw])
    assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32))
