"""JIT-compile an llvmlite module for the haswell target: AVX2, FMA, F16C, never AVX-512.

    eng = compile_module(m)                  # an llvmlite MCJIT engine, kept alive by the caller
    addr = eng.get_function_address("name")  # call through ctypes

The target is the ggml variant we match (haswell), whatever the host has: generated code must
not use AVX-512 even on machines that have it. No fast-math anywhere: LLVM may then neither
contract a*b+c nor reassociate a sum.

Compiled objects are kept on disk (bankml/backends/llvm/jit_cache.py), keyed by the sha256 of the
module's IR text, CPU, FEATURES, the optimization level, llvmlite/LLVM and bankml versions: on
a hit the O3 pipeline and codegen are skipped and MCJIT loads the saved object through its
object cache (llvmlite's ExecutionEngine.set_object_cache). A graph's kernel is saved under a
second key too, its spec (graph.kernel_spec: what its IR depends on, with a digest of bankml's
source): load_cached finds it from the spec alone, so a warm start emits and prints no kernel
IR (Gemma 3: 3.2 s to the first token before, 1.2 s after).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import llvmlite
import numpy as np
from llvmlite import binding as llvm
from llvmlite.binding import ffi
from llvmlite import ir

from bankml._version import __version__
from bankml.backends.llvm import jit_cache

CPU = "haswell"
FEATURES = "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,-avx512f,-avx512vl,-avx512bw,-avx512dq,-avx512cd"


@functools.cache
def target_machine() -> llvm.TargetMachine:
    """The shared haswell target machine (passes, asm). Never hand it to an engine."""
    return _new_target_machine()


@functools.cache
def _initialise() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.load_library_permanently(ctypes.util.find_library("m"))     # glibc expf, sincosf, powf, logf
    libc = ctypes.CDLL(ctypes.util.find_library("c"))                 # the barriers' and the pool's waits
    for name in ("sched_yield", "syscall"):
        llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)


def _new_target_machine() -> llvm.TargetMachine:
    _initialise()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=CPU, features=FEATURES, opt=3, reloc="default", codemodel="jitdefault")


def module_text(m: ir.Module) -> str:
    """m's IR text for this target (triple and data layout set)."""
    tm = target_machine()
    m.triple = tm.triple
    m.data_layout = str(tm.target_data)
    return str(m)


def compile_module(m: ir.Module) -> llvm.ExecutionEngine:
    """Parse, verify, optimize (O3, no fast-math) and JIT a module; the object from the disk
    cache when this IR was compiled before (engine._bankml_cache says "hit", "miss" or "off")."""
    return compile_text(module_text(m))


def _optimize() -> bool:
    """Whether the O3 pipeline runs (BANKML_LLVM_OPT=0: it does not; objects are cached apart)."""
    return os.environ.get("BANKML_LLVM_OPT", "3") != "0"


def compile_text(text: str, also: Sequence[str] = ()) -> llvm.ExecutionEngine:
    """compile_module of module_text's text, in an LLVM context of its own (freed with the engine).
    also: specs (load_cached) under which the object is saved too."""
    opt = _optimize()
    use_cache = jit_cache.enabled()
    key = cache_key(text, opt)
    keys = [key] + [spec_key(s, opt) for s in also]
    cached = jit_cache.get(key) if use_cache else None
    for k in keys[1:] if cached is not None else ():
        jit_cache.put(k, cached)
    ctx = llvm.create_context()
    mod = llvm.parse_assembly(text, context=ctx)
    mod.verify()
    # an MCJIT engine owns its target machine and destroys it with itself: give it its own
    tm = _new_target_machine()
    if opt and cached is None:
        run_o3(mod, tm)
    eng = _engine(mod, tm, ctx)
    if use_cache:
        # getbuffer: MCJIT loads these bytes instead of running codegen; notify: the object it made
        eng.set_object_cache(lambda _mod, obj: [jit_cache.put(k, obj) for k in keys], lambda _mod: cached)
    eng.finalize_object()
    eng._bankml_cache = "off" if not use_cache else "hit" if cached is not None else "miss"
    return eng


def load_cached(spec: str) -> llvm.ExecutionEngine | None:
    """An engine with the object saved under spec (compile_text's also), or None: MCJIT loads the
    object into an engine of an empty module, so the kernel's IR is never emitted or parsed."""
    if not jit_cache.enabled():
        return None
    obj = jit_cache.get(spec_key(spec, _optimize()), count_miss=False)
    if obj is None:
        return None
    ctx = llvm.create_context()
    mod = llvm.parse_assembly(module_text(ir.Module(name="bankml_object")), context=ctx)
    eng = _engine(mod, _new_target_machine(), ctx)
    eng.add_object_file(llvm.ObjectFileRef.from_data(obj))
    eng.finalize_object()
    eng._bankml_cache = "hit"
    return eng


class _Engine(llvm.ExecutionEngine):
    """An MCJIT engine that disposes its module's LLVM context after itself."""

    def _dispose(self) -> None:
        super()._dispose()
        ffi.lib.LLVMPY_ContextDispose(self._bankml_context)


def _engine(mod: llvm.ModuleRef, tm: llvm.TargetMachine, ctx: llvm.ContextRef) -> _Engine:
    """The MCJIT engine of mod (parsed in ctx), owning ctx. ctx's own ref is detached: a cyclic
    garbage collection finalizes its objects in any order, and a context disposed before the
    engine deletes the engine's module, which the engine then deletes again (a segfault)."""
    eng = llvm.create_mcjit_compiler(mod, tm)
    eng.__class__ = _Engine
    eng._bankml_module, eng._bankml_context = mod, ctx._ptr
    ctx.detach()
    return eng


def spec_key(spec: str, opt: bool = True) -> str:
    """The disk cache key of a kernel's spec (graph.kernel_spec): the spec, this bankml's source
    (any edit makes every spec new), numpy's version (tables such as GELU's are computed with it)
    and what cache_key holds besides the IR text."""
    return cache_key(f"spec {spec} source {source_digest()} numpy {np.__version__}", opt)


@functools.cache
def source_digest() -> str:
    """sha256 of every .py file of the installed bankml package (names and bytes)."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(text: str, opt: bool = True) -> str:
    """The disk cache key of a module's IR text (triple and data layout set) for this target."""
    return jit_cache.key(text, CPU, FEATURES, f"O{3 if opt else 0}", f"llvmlite {llvmlite.__version__}",
                             "llvm " + ".".join(map(str, llvm.llvm_version_info)), f"bankml {__version__}")


def run_o3(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """The O3 pipeline, in place (no fast-math: the IR carries no flags that allow it)."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def asm(m: ir.Module, optimize: bool = False) -> str:
    """The machine code of a module as text (BANKML_DEBUG=4 inspection, tests that grep for vfmadd);
    optimize: after the O3 pipeline compile_module runs."""
    tm = target_machine()
    m.triple = tm.triple
    m.data_layout = str(tm.target_data)
    mod = llvm.parse_assembly(str(m))
    if optimize:
        run_o3(mod, tm)
    return tm.emit_assembly(mod)


def pointer(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def call_kernel(eng: llvm.ExecutionEngine, name: str, out: np.ndarray, ins: list[np.ndarray],
                ith: int = 0, nth: int = 1, sizes: dict | None = None, llama_threads: int = 1,
                arg: int = 0) -> None:
    """Call one kernel of the contract in registry.py on numpy buffers (tests and debugging);
    sizes: the values of a generic node's Dims ({"T": 7, "KV": 256}); arg: its kernel argument
    (registry.kernel_arg)."""
    from bankml.ir.dims import DIM_SLOTS
    sizes = {**(sizes or {}), "llama_threads": llama_threads}
    dims = np.array([sizes.get(k, 0) for k in DIM_SLOTS] + [arg], np.int64)
    n_ptr = 1 + len(ins)
    proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_ptr), ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
    fn = proto(eng.get_function_address(name))
    fn(pointer(out), *[pointer(x) for x in ins], ith, nth, pointer(dims))
