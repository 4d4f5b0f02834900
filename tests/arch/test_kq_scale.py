"""kq_scale as llama.cpp computes it: 1.0f/sqrtf(float(n_embd_head)) (src/models/llama.cpp,
qwen3.cpp), an f32 sqrt and an f32 division, not 1/sqrt in f64 rounded to f32 afterwards."""
from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
import pytest
from gguf_fixtures import write_model

import bankml
from bankml.ir.ops import Op
from bankml.numerics.floats import inv_sqrtf

f32 = np.float32
_sqrtf = ctypes.CDLL(ctypes.util.find_library("m")).sqrtf
_sqrtf.restype, _sqrtf.argtypes = ctypes.c_float, [ctypes.c_float]


def f64_scale(d: int) -> np.float32:
    """The old computation: 1/sqrt(d) in f64, rounded to f32 when the kernels take it."""
    return f32(1.0 / math.sqrt(d))


def test_f64_scale_differs_for_head_sizes_96_and_112_not_64_128_256():
    """Why it matters: the two computations round apart for 242 sizes of 1..1024."""
    differ = [d for d in range(1, 1025) if f32(inv_sqrtf(d)) != f64_scale(d)]
    assert 96 in differ and 112 in differ
    assert not {64, 80, 128, 160, 192, 256} & set(differ)
    assert len(differ) == 242


@pytest.mark.parametrize("d", [64, 80, 96, 112, 128, 160, 192, 256, 6, 7, 1000])
def test_inv_sqrtf_is_glibc_sqrtf_then_an_f32_division(d):
    assert inv_sqrtf(d) == float(f32(1) / f32(_sqrtf(float(d))))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("head_dim", [96, 112])
def test_flash_attn_scale_is_the_f32_one_where_f64_rounds_apart(tmp_path, arch, head_dim):
    path = write_model(tmp_path / "m.gguf", arch=arch, n_embd=2 * head_dim, n_head=2)
    with bankml.load(path, backend="reference", threads=1) as m:
        fa = [n for n in m.build_graph(1, 256, 1) if n.op is Op.FLASH_ATTN]
    assert len(fa) == 2
    for n in fa:
        assert n.params["scale"] == float(f32(1) / f32(_sqrtf(float(head_dim))))
        assert f32(n.params["scale"]) != f64_scale(head_dim)
