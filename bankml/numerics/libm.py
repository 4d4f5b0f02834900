"""glibc's expf, logf, log2f, tanhf, powf, sincosf, exp and pow over numpy arrays (pow, powf: scalars).

ggml calls these libm functions (GGML_MAP §7, §4); numpy's own exp/sin/cos give other
bits. A few lines of LLVM IR, JIT-compiled once with llvmlite, loop over an array and
call the process's libm, so each element gets exactly what ggml's call gets. One more loop
is C's `float acc; acc += (double)term;` (each add in double, rounded to float), which
llama.cpp's top-n-sigma runs and no numpy reduction spells.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np

_UNARY = ("expf", "logf", "log2f", "tanhf")
_UNARY_LOOP = r"""
define void @v_{f}(float* %x, float* %y, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %n
  br i1 %done, label %exit, label %body
body:
  %px = getelementptr float, float* %x, i64 %i
  %v = load float, float* %px
  %r = call float @{f}(float %v)
  %py = getelementptr float, float* %y, i64 %i
  store float %r, float* %py
  %next = add i64 %i, 1
  br label %loop
exit:
  ret void
}}
"""
_IR = "".join(f"declare float @{f}(float)\n" for f in _UNARY) + r"""
declare float @powf(float, float)
declare void @sincosf(float, float*, float*)
declare double @exp(double)

define void @v_exp(double* %x, double* %y, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %n
  br i1 %done, label %exit, label %body
body:
  %px = getelementptr double, double* %x, i64 %i
  %v = load double, double* %px
  %r = call double @exp(double %v)
  %py = getelementptr double, double* %y, i64 %i
  store double %r, double* %py
  %next = add i64 %i, 1
  br label %loop
exit:
  ret void
}

define float @sum_f32_of_f64(double* %x, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %body]
  %acc = phi float [0.0, %entry], [%acc.next, %body]
  %done = icmp sge i64 %i, %n
  br i1 %done, label %exit, label %body
body:
  %px = getelementptr double, double* %x, i64 %i
  %v = load double, double* %px
  %wide = fpext float %acc to double
  %s = fadd double %wide, %v
  %acc.next = fptrunc double %s to float
  %next = add i64 %i, 1
  br label %loop
exit:
  ret float %acc
}
""" + "".join(_UNARY_LOOP.format(f=f) for f in _UNARY) + r"""
define void @v_sincosf(float* %x, float* %s, float* %c, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %body]
  %done = icmp sge i64 %i, %n
  br i1 %done, label %exit, label %body
body:
  %px = getelementptr float, float* %x, i64 %i
  %v = load float, float* %px
  %ps = getelementptr float, float* %s, i64 %i
  %pc = getelementptr float, float* %c, i64 %i
  call void @sincosf(float %v, float* %ps, float* %pc)
  %next = add i64 %i, 1
  br label %loop
exit:
  ret void
}
"""

_F32P = ctypes.POINTER(ctypes.c_float)
_UNARY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)   # (x, y, n), addresses


_building = threading.Lock()
_built: tuple | None = None


def _lib() -> tuple:
    """The engine and its functions, built once (the sampler calls these from server threads: a
    second engine made by a thread that lost a race would be freed under its caller)."""
    global _built
    if _built is None:
        with _building:
            if _built is None:
                _built = _build()
    return _built


def _build() -> tuple:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.load_library_permanently(ctypes.util.find_library("m"))
    mod = llvm.parse_assembly(_IR)
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(opt=0)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.powf.restype = ctypes.c_float
    libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    libm.pow.restype = ctypes.c_double
    libm.pow.argtypes = [ctypes.c_double, ctypes.c_double]
    fns = {
        **{f: _UNARY_FN(engine.get_function_address(f"v_{f}")) for f in _UNARY},
        "sincosf": ctypes.CFUNCTYPE(None, _F32P, _F32P, _F32P, ctypes.c_int64)(
            engine.get_function_address("v_sincosf")),
        "powf": libm.powf,
        "pow": libm.pow,
        "exp": _UNARY_FN(engine.get_function_address("v_exp")),
        "sum_f32_of_f64": ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_int64)(
            engine.get_function_address("sum_f32_of_f64")),
    }
    return engine, fns


def _unary(name: str, x) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    _lib()[1][name](x.ctypes.data, y.ctypes.data, x.size)
    return y


def expf(x) -> np.ndarray:
    """glibc expf, elementwise."""
    return _unary("expf", x)


def logf(x) -> np.ndarray:
    """glibc logf, elementwise."""
    return _unary("logf", x)


def log2f(x) -> np.ndarray:
    """glibc log2f, elementwise (mirostat's surprise)."""
    return _unary("log2f", x)


def tanhf(x) -> np.ndarray:
    """glibc tanhf, elementwise (ggml_gelu_f32 calls it to fill the GELU table)."""
    return _unary("tanhf", x)


def sincosf(x) -> tuple[np.ndarray, np.ndarray]:
    """glibc sincosf, elementwise: (sin, cos)."""
    x = np.ascontiguousarray(x, np.float32)
    s, c = np.empty_like(x), np.empty_like(x)
    _lib()[1]["sincosf"](x.ctypes.data_as(_F32P), s.ctypes.data_as(_F32P), c.ctypes.data_as(_F32P), x.size)
    return s, c


def powf(x: float, y: float) -> np.float32:
    """glibc powf of two scalars."""
    return np.float32(_lib()[1]["powf"](x, y))


def pow(x: float, y: float) -> float:
    """glibc pow (double) of two scalars (std::pow(float, int) promotes both to double)."""
    return float(_lib()[1]["pow"](x, y))


def exp(x) -> np.ndarray:
    """glibc exp (double), elementwise."""
    x = np.ascontiguousarray(x, np.float64)
    y = np.empty_like(x)
    _lib()[1]["exp"](x.ctypes.data, y.ctypes.data, x.size)
    return y


def sum_f32_of_f64(terms) -> np.float32:
    """`float acc = 0; for (...) acc += terms[i];` with double terms: each add in double, then
    rounded to float (C's float += double), in order."""
    terms = np.ascontiguousarray(terms, np.float64)
    return np.float32(_lib()[1]["sum_f32_of_f64"](terms.ctypes.data, terms.size))
