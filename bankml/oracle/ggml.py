"""ggml itself through ctypes: run single ops of the reference build on numpy data.

Used by op-level tests: each bankml kernel is compared with the ggml op it mirrors,
bit for bit, before whole graphs are compared through the eval callback.

    ctx = Context()
    w = ctx.tensor(TYPE_Q8_0, (K, N), raw_bytes)     # ne order, as ggml writes shapes
    x = ctx.tensor(TYPE_F32, (K, M), np_array)
    y = ctx.op("ggml_mul_mat", w, x)
    out = ctx.compute(y, threads=2)                  # np.float32 of shape (M, N)
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from bankml.errors import OracleError
from bankml.oracle.paths import bin_dir

TYPE_F32, TYPE_F16, TYPE_Q4_0, TYPE_Q4_1, TYPE_Q8_0, TYPE_I32 = 0, 1, 2, 3, 8, 26
TYPE_I64, TYPE_Q1_0, TYPE_Q2_0 = 27, 41, 42
TYPE_Q5_0, TYPE_Q5_1 = 6, 7
TYPE_Q4_K, TYPE_Q6_K, TYPE_Q8_K = 12, 14, 15

_P = ctypes.c_void_p
_F = ctypes.c_float
_I = ctypes.c_int
_I64 = ctypes.c_int64


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _P), ("no_alloc", ctypes.c_bool)]


class TypeTraits(ctypes.Structure):
    """struct ggml_type_traits (ggml.h)."""
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", _I64), ("blck_size_interleave", _I64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool),
                ("to_float", _P), ("from_float_ref", _P)]


class TypeTraitsCPU(ctypes.Structure):
    """struct ggml_type_traits_cpu (ggml-cpu.h)."""
    _fields_ = [("from_float", _P), ("vec_dot", _P), ("vec_dot_type", _I), ("nrows", _I64)]


# name -> (restype, argtypes after ctx); tensors are void pointers
_OPS = {
    "ggml_mul_mat": (_P, [_P, _P]),
    "ggml_add": (_P, [_P, _P]),
    "ggml_mul": (_P, [_P, _P]),
    "ggml_rms_norm": (_P, [_P, _F]),
    "ggml_get_rows": (_P, [_P, _P]),
    "ggml_swiglu_split": (_P, [_P, _P]),
    "ggml_silu": (_P, [_P]),
    "ggml_sigmoid": (_P, [_P]),
    "ggml_softplus": (_P, [_P]),
    "ggml_ssm_conv": (_P, [_P, _P]),
    "ggml_gated_delta_net": (_P, [_P, _P, _P, _P, _P, _P, _I64]),
    "ggml_soft_max_ext": (_P, [_P, _P, _F, _F]),
    "ggml_rope_ext": (_P, [_P, _P, _P, _I, _I, _I, _F, _F, _F, _F, _F, _F]),
    "ggml_flash_attn_ext": (_P, [_P, _P, _P, _P, _F, _F, _F]),
    "ggml_cpy": (_P, [_P, _P]),
    "ggml_permute": (_P, [_P, _I, _I, _I, _I]),
    "ggml_cont": (_P, [_P]),
}

_REPACK_BUFT = "_Z35ggml_backend_cpu_repack_buffer_typev"   # ggml-cpu/repack.cpp, a C++ symbol

VEC_DOT = ctypes.CFUNCTYPE(None, _I, ctypes.POINTER(_F), ctypes.c_size_t, _P, ctypes.c_size_t, _P,
                           ctypes.c_size_t, _I)
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.POINTER(_F), _P, _I64)
TO_FLOAT = ctypes.CFUNCTYPE(None, _P, ctypes.POINTER(_F), _I64)


@functools.cache
def lib() -> ctypes.CDLL:
    """libggml-base + libggml-cpu of the oracle build, argtypes set."""
    d = bin_dir()
    try:
        ctypes.CDLL(str(d / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(d / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise OracleError(f"ggml libraries not found in {d}: run `python -m bankml.oracle build` ({e})")
    L = _Both(ctypes.CDLL(str(d / "libggml-base.so")), cpu)
    L.ggml_init.restype, L.ggml_init.argtypes = _P, [_InitParams]
    L.ggml_free.argtypes = [_P]
    L.ggml_new_tensor.restype, L.ggml_new_tensor.argtypes = _P, [_P, _I, _I, ctypes.POINTER(_I64)]
    L.ggml_get_data.restype, L.ggml_get_data.argtypes = _P, [_P]
    L.ggml_nbytes.restype, L.ggml_nbytes.argtypes = ctypes.c_size_t, [_P]
    L.ggml_new_graph.restype, L.ggml_new_graph.argtypes = _P, [_P]
    L.ggml_build_forward_expand.argtypes = [_P, _P]
    L.ggml_graph_compute_with_ctx.restype, L.ggml_graph_compute_with_ctx.argtypes = _I, [_P, _P, _I]
    L.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    L.ggml_get_type_traits.argtypes = [_I]
    L.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCPU)
    L.ggml_get_type_traits_cpu.argtypes = [_I]
    L.ggml_row_size.restype, L.ggml_row_size.argtypes = ctypes.c_size_t, [_I, _I64]
    L.ggml_backend_alloc_ctx_tensors_from_buft.restype = _P
    L.ggml_backend_alloc_ctx_tensors_from_buft.argtypes = [_P, _P]
    L.ggml_backend_tensor_set.argtypes = [_P, _P, ctypes.c_size_t, ctypes.c_size_t]
    L.ggml_backend_buffer_free.argtypes = [_P]
    getattr(cpu, _REPACK_BUFT).restype = _P
    for name, (res, args) in _OPS.items():
        fn = getattr(L, name)
        fn.restype, fn.argtypes = res, [_P] + args
    L.ggml_cpu_init()
    return L


class _Both:
    """Look a symbol up in libggml-base, then libggml-cpu."""

    def __init__(self, *libs):
        self._libs = libs

    def __getattr__(self, name):
        for lb in self._libs:
            try:
                fn = getattr(lb, name)
            except AttributeError:
                continue
            setattr(self, name, fn)
            return fn
        raise AttributeError(name)


def row_size(ggml_type: int, n: int) -> int:
    return lib().ggml_row_size(ggml_type, n)


def type_traits(ggml_type: int) -> tuple[str, int, int]:
    """ggml_get_type_traits(type): (type_name, blck_size, type_size)."""
    tr = lib().ggml_get_type_traits(ggml_type).contents
    return tr.type_name.decode(), tr.blck_size, tr.type_size


def vec_dot(ggml_type: int, n: int, x: bytes, y: bytes) -> np.float32:
    """ggml_get_type_traits_cpu(type)->vec_dot on one row x and one row y (already of vec_dot_type)."""
    tr = lib().ggml_get_type_traits_cpu(ggml_type).contents
    out = (_F * 1)()
    xb, yb = ctypes.create_string_buffer(bytes(x), len(x)), ctypes.create_string_buffer(bytes(y), len(y))
    VEC_DOT(tr.vec_dot)(n, out, 0, ctypes.cast(xb, _P), 0, ctypes.cast(yb, _P), 0, 1)
    return np.float32(out[0])


def from_float(ggml_type: int, x: np.ndarray) -> bytes:
    """ggml-cpu's from_float of a type (quantize_row_q8_0 etc., the AVX2 path) for one row."""
    x = np.ascontiguousarray(x, np.float32)
    tr = lib().ggml_get_type_traits_cpu(ggml_type).contents
    buf = ctypes.create_string_buffer(row_size(ggml_type, x.size))
    FROM_FLOAT(tr.from_float)(x.ctypes.data_as(ctypes.POINTER(_F)), ctypes.cast(buf, _P), x.size)
    return buf.raw


def vec_dot_type(ggml_type: int) -> int:
    return lib().ggml_get_type_traits_cpu(ggml_type).contents.vec_dot_type


def to_float(ggml_type: int, raw: bytes, n: int) -> np.ndarray:
    """ggml-base's to_float (dequantize_row_*) for n values."""
    tr = lib().ggml_get_type_traits(ggml_type).contents
    out = np.empty(n, np.float32)
    rb = ctypes.create_string_buffer(bytes(raw), len(raw))
    TO_FLOAT(tr.to_float)(ctypes.cast(rb, _P), out.ctypes.data_as(ctypes.POINTER(_F)), n)
    return out


class Context:
    """A ggml context owning its tensors' memory; build ops, then compute one."""

    def __init__(self, mem: int = 512 << 20):
        self.L = lib()
        self.ctx = self.L.ggml_init(_InitParams(mem, None, False))
        if not self.ctx:
            raise OracleError("ggml_init failed")

    def __del__(self):
        for buf in getattr(self, "_buffers", []):
            self.L.ggml_backend_buffer_free(buf)
        for c in getattr(self, "_weight_ctxs", []):
            self.L.ggml_free(c)
        if getattr(self, "ctx", None):
            self.L.ggml_free(self.ctx)
            self.ctx = None

    def repacked(self, ggml_type: int, ne: tuple[int, int], data) -> int:
        """A weight in ggml-cpu's CPU_REPACK buffer, as llama.cpp loads matrices by default:
        setting its data repacks it (ggml-cpu/repack.cpp: Q4_0 and Q4_K with ne1 % 8 == 0 become
        q4_0_8x8 and q4_K_8x8 on AVX2), and a mul_mat of it runs the repack's forward_mul_mat."""
        wctx = self.L.ggml_init(_InitParams(1 << 12, None, True))
        self.__dict__.setdefault("_weight_ctxs", []).append(wctx)
        t = self.L.ggml_new_tensor(wctx, ggml_type, len(ne), (_I64 * len(ne))(*ne))
        buft = getattr(self.L, _REPACK_BUFT)()
        buf = self.L.ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft)
        if not buf:
            raise OracleError("CPU_REPACK buffer allocation failed")
        self.__dict__.setdefault("_buffers", []).append(buf)
        raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        if len(raw) != self.L.ggml_nbytes(t):
            raise OracleError(f"tensor of {self.L.ggml_nbytes(t)} bytes given {len(raw)}")
        self.L.ggml_backend_tensor_set(t, raw, 0, len(raw))
        return t

    def tensor(self, ggml_type: int, ne: tuple[int, ...], data=None) -> int:
        """A new tensor of shape ne (ggml order, ne0 first); data: numpy array or raw bytes."""
        ne_arr = (_I64 * len(ne))(*ne)
        t = self.L.ggml_new_tensor(self.ctx, ggml_type, len(ne), ne_arr)
        if data is not None:
            raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
            n = self.L.ggml_nbytes(t)
            if len(raw) != n:
                raise OracleError(f"tensor of {n} bytes given {len(raw)}")
            ctypes.memmove(self.L.ggml_get_data(t), raw, n)
        return t

    def op(self, name: str, *args) -> int:
        return getattr(self.L, name)(self.ctx, *args)

    def compute(self, t: int, threads: int = 1, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Compute the graph ending in t; return its f32 data (shape: numpy order, default flat)."""
        gf = self.L.ggml_new_graph(self.ctx)
        self.L.ggml_build_forward_expand(gf, t)
        if self.L.ggml_graph_compute_with_ctx(self.ctx, gf, threads) != 0:
            raise OracleError(f"ggml_graph_compute failed for {self.L}")
        return self.read(t, shape)

    def read(self, t: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
        n = self.L.ggml_nbytes(t)
        out = np.frombuffer(ctypes.string_at(self.L.ggml_get_data(t), n), np.float32).copy()
        return out.reshape(shape) if shape else out


def vec_soft_max_f32(x: np.ndarray, max_: float) -> tuple[np.ndarray, float]:
    """ggml-cpu's exported ggml_vec_soft_max_f32: y = exp(x - max) (ggml_v_expf in 8-lane chunks,
    glibc expf for the n%8 tail) and the f64 sum it returns. With max = 0, y is ggml_v_expf(x)."""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    fn = lib().ggml_vec_soft_max_f32
    fn.restype, fn.argtypes = ctypes.c_double, [_I, ctypes.POINTER(_F), ctypes.POINTER(_F), _F]
    s = fn(x.size, y.ctypes.data_as(ctypes.POINTER(_F)), x.ctypes.data_as(ctypes.POINTER(_F)), max_)
    return y, s


def quantize_chunk(ggml_type: int, x: np.ndarray) -> np.ndarray:
    """ggml-base's ggml_quantize_chunk (the *_ref quantizers, no imatrix) of x f32 [rows, n]:
    the weight bytes [rows, row_size] as llama-quantize would write them."""
    x = np.ascontiguousarray(x, np.float32)
    rows, n = x.shape
    out = np.zeros((rows, row_size(ggml_type, n)), np.uint8)
    fn = lib().ggml_quantize_chunk
    fn.restype, fn.argtypes = ctypes.c_size_t, [_I, ctypes.POINTER(_F), _P, _I64, _I64, _I64, _P]
    fn(ggml_type, x.ctypes.data_as(ctypes.POINTER(_F)), out.ctypes.data, 0, rows, n, None)
    return out


def mul_mat_repacked(ggml_type: int, w_raw: np.ndarray, x: np.ndarray, threads: int = 1) -> np.ndarray:
    """ggml_mul_mat(w, x) with w in ggml-cpu's repack buffer (Context.repacked), as llama.cpp loads
    weights: a Q4_0/Q4_K matrix with rows % 8 == 0 is repacked into its interleaved layout and runs
    the gemm/gemv kernels of repack.cpp. w_raw uint8 [N, row_bytes], x f32 [M, K] -> f32 [M, N]."""
    N, (M, K) = len(w_raw), x.shape
    ctx = Context()
    w = ctx.repacked(ggml_type, (K, N), np.ascontiguousarray(w_raw, np.uint8))
    xt = ctx.tensor(TYPE_F32, (K, M), np.ascontiguousarray(x, np.float32))
    return ctx.compute(ctx.op("ggml_mul_mat", w, xt), threads=threads, shape=(M, N))
