"""JIT-compile an llvmlite module for the haswell target: AVX2, FMA, F16C, never AVX-512.

    eng = compile_module(m)                  # an llvmlite MCJIT engine, kept alive by the caller
    addr = eng.get_function_address("name")  # call through ctypes

The target is the ggml variant we match (haswell), whatever the host has: generated code must
not use AVX-512 even on machines that have it. No fast-math anywhere: LLVM may then neither
contract a*b+c nor reassociate a sum.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

CPU = "haswell"
FEATURES = "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,-avx512f,-avx512vl,-avx512bw,-avx512dq,-avx512cd"


@functools.cache
def target_machine() -> llvm.TargetMachine:
    """The shared haswell target machine (passes, asm). Never hand it to an engine."""
    return _new_target_machine()


def _new_target_machine() -> llvm.TargetMachine:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.load_library_permanently(ctypes.util.find_library("m"))     # glibc expf, sincosf, powf, logf
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=CPU, features=FEATURES, opt=3, reloc="default", codemodel="jitdefault")


def compile_module(m: ir.Module) -> llvm.ExecutionEngine:
    """Parse, verify, optimize (O3, no fast-math) and JIT a module."""
    tm = target_machine()
    m.triple = tm.triple
    m.data_layout = str(tm.target_data)
    mod = llvm.parse_assembly(str(m))
    mod.verify()
    if os.environ.get("BANKML_LLVM_OPT", "3") != "0":
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(tm, pto)
        pm = pb.getModulePassManager()
        pm.run(mod, pb)
    # an MCJIT engine owns its target machine and destroys it with itself: give it its own
    eng = llvm.create_mcjit_compiler(mod, _new_target_machine())
    eng.finalize_object()
    eng._bankml_module = mod        # keep the module alive with the engine
    return eng


def asm(m: ir.Module, optimize: bool = False) -> str:
    """The machine code of a module as text (BANKML_DEBUG=4 inspection, tests that grep for vfmadd);
    optimize: after the O3 pipeline compile_module runs."""
    tm = target_machine()
    m.triple = tm.triple
    m.data_layout = str(tm.target_data)
    mod = llvm.parse_assembly(str(m))
    if optimize:
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


def pointer(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def call_kernel(eng: llvm.ExecutionEngine, name: str, out: np.ndarray, ins: list[np.ndarray],
                ith: int = 0, nth: int = 1) -> None:
    """Call one kernel of the contract in registry.py on numpy buffers (tests and debugging)."""
    n_ptr = 1 + len(ins)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_ptr), ctypes.c_int64, ctypes.c_int64)
    fn = proto(eng.get_function_address(name))
    fn(pointer(out), *[pointer(x) for x in ins], ith, nth)
