"""One output of the reference mul_mat, in the table's vec_dot order, equals ggml-cpu's vec_dot of that row and column."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference.matmul import mul_mat
from bankml.oracle import ggml as G
from bankml.quants import WEIGHT_TYPES

pytestmark = pytest.mark.oracle

VEC_DOT = {t: wt.vec_dot for t, wt in WEIGHT_TYPES.items()}      # the table's (K-quants: one column is vec_dot)
CASES = [(t, k) for t in VEC_DOT for k in (128, 576, 1536, 2048, 40) if k % max(WEIGHT_TYPES[t].block, 32) == 0
         or (t == G.TYPE_F16 and k == 40)]       # 40: vec_dot_f16's f64 leftovers after 32


@pytest.mark.parametrize("ggml_type,k", CASES, ids=[f"{WEIGHT_TYPES[t].name}-K{k}" for t, k in CASES])
def test_vec_dot_bits_equal_ggml(ggml_type, k):
    rng = np.random.default_rng(k + ggml_type)
    w = rng.standard_normal((5, k)).astype(np.float32)
    x = (rng.standard_normal((3, k)) * np.array([1.0, 1e-3, 50.0])[:, None]).astype(np.float32)
    x[0, :32] = 0
    raw = w.astype(np.float16).view(np.uint8) if ggml_type == G.TYPE_F16 else G.quantize_chunk(ggml_type, w)
    act = G.vec_dot_type(ggml_type)
    mine = np.stack([mul_mat(raw, ggml_type, xr[None], VEC_DOT[ggml_type])[0] for xr in x])
    ref = np.array([[G.vec_dot(ggml_type, k, wr.tobytes(), G.from_float(act, xr)) for wr in raw] for xr in x],
                   np.float32)
    assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32))
