"""The Q1_0 x q8_0 matvec on Vulkan (lavapipe in CI) equals ggml_vec_dot_q1_0_q8_0 bit for bit."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from bankml.backends.spirv.q1 import device_check, reference
from bankml.backends.spirv import runtime

CASES = device_check.oracle_cases()


@pytest.fixture(scope="module")
def dev():
    return runtime.open_device(0)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _ggml_rows(w: bytes, rows: int, k: int, act: bytes) -> np.ndarray:
    from bankml.oracle import ggml
    n = len(w) // rows
    return np.array([ggml.vec_dot(ggml.TYPE_Q1_0, k, w[r * n:(r + 1) * n], act) for r in range(rows)],
                    np.float32)


def _ggml_quantize_q1_0(x: np.ndarray) -> bytes:
    """ggml_quantize_chunk(GGML_TYPE_Q1_0) of f32 rows [rows, k]."""
    from bankml.oracle import ggml
    L = ggml.lib()
    fn = L.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    rows, k = x.shape
    out = ctypes.create_string_buffer(rows * ggml.row_size(ggml.TYPE_Q1_0, k))
    fn(ggml.TYPE_Q1_0, x.ctypes.data, ctypes.cast(out, ctypes.c_void_p), 0, rows, k, None)
    return out.raw


@pytest.mark.oracle
@pytest.mark.parametrize("case", CASES, ids=[c.name.replace(" ", "-") for c in CASES])
def test_q1_matvec_bits_equal_ggml_vec_dot(dev, case):
    got = runtime.Q1Matvec(dev).upload(case.w, case.rows, case.k).run(case.act)
    assert _bits_equal(got, _ggml_rows(case.w, case.rows, case.k, case.act))


@pytest.mark.oracle
@pytest.mark.parametrize("rows,k", [(512, 512), (1536, 512), (2048, 2048)])
def test_q1_matvec_of_ggml_quantized_weights_bits_equal_ggml(dev, rows, k):
    from bankml.oracle import ggml
    rng = np.random.default_rng(rows + k)
    w = _ggml_quantize_q1_0(rng.standard_normal((rows, k)).astype(np.float32) * 0.05)
    act = ggml.from_float(ggml.TYPE_Q8_0, rng.standard_normal(k).astype(np.float32))
    got = runtime.Q1Matvec(dev).upload(w, rows, k).run(act)
    assert _bits_equal(got, _ggml_rows(w, rows, k, act))


@pytest.mark.oracle
@pytest.mark.parametrize("case", CASES, ids=[c.name.replace(" ", "-") for c in CASES])
def test_numpy_reference_bits_equal_ggml_vec_dot(case):
    want = _ggml_rows(case.w, case.rows, case.k, case.act)
    assert _bits_equal(reference.q1_matvec(case.w, case.rows, case.k, case.act), want)


def test_q1_matvec_bits_equal_reference_backend_mul_mat(dev):
    """The same bits as bankml's reference backend (backends/reference/matmul.py, Q1_0_DOT)."""
    from bankml.backends.reference.matmul import mul_mat
    from bankml.ir.order import Q1_0_DOT
    from bankml.quants import Q1_0
    from bankml.quants.activation import quantize_q8_0, to_bytes
    rng = np.random.default_rng(5)
    case = device_check.random_case(1536, 512, seed=5)
    x = rng.standard_normal(512).astype(np.float32)
    act = to_bytes(quantize_q8_0(x[None]))
    got = runtime.Q1Matvec(dev).upload(case.w, case.rows, case.k).run(np.asarray(act).tobytes())
    w = np.frombuffer(case.w, np.uint8).reshape(case.rows, -1)
    assert _bits_equal(got, mul_mat(w, Q1_0, x[None], Q1_0_DOT)[0])


def test_rows_not_a_multiple_of_the_workgroup_are_all_written(dev):
    case = device_check.random_case(13, 256, seed=1)
    got = runtime.Q1Matvec(dev).upload(case.w, 13, 256).run(case.act)
    assert _bits_equal(got, reference.q1_matvec(case.w, 13, 256, case.act))


def test_one_matvec_object_runs_many_activations(dev):
    case = device_check.random_case(512, 512, seed=2)
    mv = runtime.Q1Matvec(dev).upload(case.w, 512, 512)
    for seed in range(3):
        act = device_check.random_case(1, 512, seed=100 + seed).act
        assert _bits_equal(mv.run(act), reference.q1_matvec(case.w, 512, 512, act))


def test_wrong_sizes_are_refused_in_one_line(dev):
    mv = runtime.Q1Matvec(dev)
    with pytest.raises(runtime.BankmlError, match="not 4 rows of 500"):
        mv.upload(b"\0" * 72, 4, 500)
    mv.upload(b"\0" * 288, 4, 512)
    with pytest.raises(runtime.BankmlError, match="activation of 3 bytes, want 544"):
        mv.run(b"abc")
