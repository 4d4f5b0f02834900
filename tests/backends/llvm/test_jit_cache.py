"""The disk cache of compiled objects (jit.compile_module, backends/llvm/jit_cache.py): a hit
skips O3 and codegen and gives the same bits; a bad entry is recompiled, never a crash."""
from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm import jit_cache
from bankml.testing import models

f32, i64 = ir.FloatType(), ir.IntType(64)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder for this test; the folder of jit entries."""
    monkeypatch.setenv("BANKML_CACHE", str(tmp_path))
    monkeypatch.delenv("BANKML_JIT_CACHE", raising=False)
    monkeypatch.delenv("BANKML_LLVM_OPT", raising=False)
    return tmp_path / "jit"


@pytest.fixture
def o3_calls(monkeypatch):
    """How many times the O3 pipeline ran."""
    calls = []
    real = jit.run_o3

    def counted(mod, tm):
        calls.append(1)
        real(mod, tm)
    monkeypatch.setattr(jit, "run_o3", counted)
    return calls


def dot_module() -> ir.Module:
    """float dot(float* a, float* b, i64 n): fmul then fadd in order (rounds twice; order matters)."""
    m = ir.Module(name="dot")
    fn = ir.Function(m, ir.FunctionType(f32, [f32.as_pointer(), f32.as_pointer(), i64]), "dot")
    a, b_, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    acc = b.alloca(f32, name="acc")
    b.store(ir.Constant(f32, 0.0), acc)
    with _loop(b, n) as i:
        x = b.load(b.gep(a, [i]))
        y = b.load(b.gep(b_, [i]))
        b.store(b.fadd(b.load(acc), b.fmul(x, y)), acc)
    b.ret(b.load(acc))
    return m


class _loop:
    """for (i = 0; i < n; i++), as cgutils.for_range."""

    def __init__(self, b: ir.IRBuilder, n):
        self.b, self.n = b, n

    def __enter__(self):
        b = self.b
        self.pre = b.block
        self.cond = b.append_basic_block("for.cond")
        self.body = b.append_basic_block("for.body")
        self.end = b.append_basic_block("for.end")
        b.branch(self.cond)
        b.position_at_end(self.cond)
        self.i = b.phi(i64, name="i")
        self.i.add_incoming(ir.Constant(i64, 0), self.pre)
        b.cbranch(b.icmp_signed("<", self.i, self.n), self.body, self.end)
        b.position_at_end(self.body)
        return self.i

    def __exit__(self, *exc):
        b = self.b
        nxt = b.add(self.i, ir.Constant(i64, 1))
        self.i.add_incoming(nxt, b.block)
        b.branch(self.cond)
        b.position_at_end(self.end)


def run_dot(eng) -> np.float32:
    import ctypes
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, 1000), dtype=np.float32)
    fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        eng.get_function_address("dot"))
    return np.float32(fn(a.ctypes.data, b.ctypes.data, a.size))


def bits(x) -> bytes:
    return np.asarray(x, np.float32).tobytes()


def test_hit_skips_o3_and_gives_the_same_bits(cache, o3_calls):
    first = jit.compile_module(dot_module())
    assert first._bankml_cache == "miss" and len(o3_calls) == 1
    assert len(list(cache.glob("*.o"))) == 1
    second = jit.compile_module(dot_module())
    assert second._bankml_cache == "hit" and len(o3_calls) == 1
    assert bits(run_dot(first)) == bits(run_dot(second))


def test_hit_loads_no_codegen_object(cache, monkeypatch):
    """On a hit MCJIT takes the saved object: nothing is handed back to be saved again."""
    jit.compile_module(dot_module())
    saved = []
    monkeypatch.setattr(jit_cache, "put", lambda k, obj: saved.append(k))
    assert jit.compile_module(dot_module())._bankml_cache == "hit" and saved == []


@pytest.mark.parametrize("damage", ["truncated", "flipped_bit", "empty", "garbage", "not_elf"])
def test_corrupt_entry_is_recompiled_and_rewritten(cache, o3_calls, damage):
    want = bits(run_dot(jit.compile_module(dot_module())))
    (entry,) = cache.glob("*.o")
    data = entry.read_bytes()
    head = len(jit_cache.MAGIC) + 32
    if damage == "truncated":
        entry.write_bytes(data[:len(data) // 2])
    elif damage == "flipped_bit":
        entry.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "garbage":
        entry.write_bytes(b"\x00garbage" * 100)
    else:                               # a well-formed entry of something that is not an object file
        import hashlib
        obj = b"not an object" * 10
        entry.write_bytes(jit_cache.MAGIC + hashlib.sha256(obj).digest() + obj)
    eng = jit.compile_module(dot_module())
    assert eng._bankml_cache == "miss" and len(o3_calls) == 2
    assert bits(run_dot(eng)) == want
    assert jit_cache.get(entry.stem) is not None and entry.read_bytes()[head:].startswith(b"\x7fELF")
    assert jit.compile_module(dot_module())._bankml_cache == "hit"


def test_disabled_cache_writes_nothing_and_always_optimizes(cache, o3_calls, monkeypatch):
    monkeypatch.setenv("BANKML_JIT_CACHE", "0")
    for _ in range(2):
        assert jit.compile_module(dot_module())._bankml_cache == "off"
    assert len(o3_calls) == 2 and not cache.exists()


def test_unwritable_cache_still_compiles(tmp_path, monkeypatch, o3_calls):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("BANKML_CACHE", str(blocker))
    monkeypatch.delenv("BANKML_JIT_CACHE", raising=False)
    eng = jit.compile_module(dot_module())
    assert eng._bankml_cache == "miss" and np.isfinite(run_dot(eng))


def test_writes_leave_no_tmp_files(cache):
    jit.compile_module(dot_module())
    assert [p.suffix for p in cache.iterdir()] == [".o"]


def test_key_changes_with_opt_level_and_ir():
    text = str(dot_module())
    assert jit.cache_key(text, True) == jit.cache_key(text, True)
    assert jit.cache_key(text, True) != jit.cache_key(text, False)
    assert jit.cache_key(text + " ", True) != jit.cache_key(text, True)
    assert jit_cache.key("ab", "c") != jit_cache.key("a", "bc")


def test_opt_level_0_is_cached_apart(cache, o3_calls, monkeypatch):
    jit.compile_module(dot_module())
    monkeypatch.setenv("BANKML_LLVM_OPT", "0")
    assert jit.compile_module(dot_module())._bankml_cache == "miss"
    assert len(list(cache.glob("*.o"))) == 2 and len(o3_calls) == 1


def test_engines_from_cache_each_own_a_target_machine(cache):
    """MCJIT frees the target machine it is given: hits must not share one either."""
    jit.compile_module(dot_module())
    engines = [jit.compile_module(dot_module()) for _ in range(3)]
    want = bits(run_dot(engines[0]))
    del engines[:2]
    gc.collect()
    assert bits(run_dot(engines[0])) == want
    assert bits(run_dot(jit.compile_module(dot_module()))) == want
    assert jit.asm(dot_module(), optimize=True)           # the shared target machine is still alive


def test_engines_in_cyclic_garbage_are_collected_without_a_crash(tmp_path):
    """A cyclic collection finalizes its garbage in any order: an engine's LLVM context must not
    be disposed before the engine (its module deleted twice: a segfault). In a child process, so
    a crash fails this test; with the disk cache (loaded engines) and without."""
    prog = """
import gc
from llvmlite import ir
from bankml.backends.llvm import jit
m = ir.Module(name="seven")
b = ir.IRBuilder(ir.Function(m, ir.FunctionType(ir.IntType(32), []), "seven").append_basic_block())
b.ret(ir.IntType(32)(7))
text = jit.module_text(m)
class Holder: pass
for i in range(40):
    h = Holder()
    h.eng = jit.compile_text(text, also=["seven"]) if i % 2 else jit.load_cached("seven") or jit.compile_text(text)
    h.me = h
    del h
    if i % 5 == 4: gc.collect()
print("collected")
"""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[3]
    for env in ({}, {"BANKML_JIT_CACHE": "0"}):
        r = subprocess.run([sys.executable, "-c", prog], cwd=root, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "BANKML_CACHE": str(tmp_path), **env})
        assert r.returncode == 0 and r.stdout.strip() == "collected", (env, r.returncode, r.stderr[-2000:])


@pytest.fixture(scope="module")
def gqa_path():
    return models.path("llama-gqa-f16")


def test_model_logits_from_cached_graphs_are_the_same_bits(gqa_path, cache, o3_calls):
    import bankml

    def logits():                                             # a new model: nothing compiled in memory
        with bankml.load(gqa_path, backend="llvm", threads=2, n_ctx=256) as m:
            s = m.session()
            rows = s.prefill([1, 5, 9, 3], outputs="all")
            return np.concatenate([rows, s.decode(11)[None]])

    first = logits()
    n_o3 = len(o3_calls)
    assert n_o3 > 2               # the small-all and decode variants: two glue modules, their distinct kernels
    second = logits()
    assert len(o3_calls) == n_o3
    assert np.array_equal(first.view(np.uint32), second.view(np.uint32))


@pytest.fixture
def defines(monkeypatch):
    """How many kernel functions were emitted (registry.define calls)."""
    from bankml.backends.llvm import compile as llvm_graph
    calls = []
    real = llvm_graph.registry.define

    def counted(m, g, n):
        calls.append(n.op)
        return real(m, g, n)
    monkeypatch.setattr(llvm_graph.registry, "define", counted)
    return calls


def _gqa_logits(path):
    import bankml
    with bankml.load(path, backend="llvm", threads=2, n_ctx=256) as m:      # nothing compiled in memory
        s = m.session()
        rows = s.prefill([1, 5, 9, 3], outputs="all")
        return np.concatenate([rows, s.decode(11)[None]])


def test_a_kernel_compiled_before_is_loaded_by_its_spec_without_emitting_ir(gqa_path, cache, o3_calls, defines):
    first = _gqa_logits(gqa_path)
    assert defines, "the first load emits every kernel"
    n_o3, n_defines = len(o3_calls), len(defines)
    second = _gqa_logits(gqa_path)
    assert len(defines) == n_defines and len(o3_calls) == n_o3
    assert np.array_equal(first.view(np.uint32), second.view(np.uint32))


def test_a_code_change_emits_the_kernels_again_but_compiles_none(gqa_path, cache, o3_calls, defines, monkeypatch):
    first = _gqa_logits(gqa_path)
    n_o3, n_defines = len(o3_calls), len(defines)
    monkeypatch.setattr(jit, "source_digest", lambda: "another bankml")
    second = _gqa_logits(gqa_path)
    assert len(defines) == 2 * n_defines             # every spec is new: the IR is emitted again,
    assert len(o3_calls) == n_o3                     # and found by its text
    assert np.array_equal(first.view(np.uint32), second.view(np.uint32))


def test_kernel_spec_writes_out_dim_ranges_and_exact_values():
    from bankml.backends.llvm.compile import kernel_spec
    from bankml.ir.dims import Dim
    from bankml.ir.graph import Graph
    from bankml.ir.node import Node
    from bankml.ir.ops import Op
    from bankml.ir.order import SCALE

    def spec(rows, scale):
        g = Graph()
        g.add(Node(0, Op.INPUT, (), (rows, 64), "f32", params={"input": "x"}))
        g.add(Node(1, Op.SCALE, (0,), (rows, 64), "f32", order=SCALE, params={"scale": scale}))
        return kernel_spec(g, g[1])

    assert spec(Dim("T", 2, 63), 0.5) != spec(Dim("T", 2, 64), 0.5) != spec(7, 0.5)
    assert spec(7, 0.1) != spec(7, 0.1 + 1e-17 * 2)
    assert spec(7, 0.1) == spec(7, 0.1)
    assert spec(7, np.float32(0.5)) is None          # no exact text: emitted every time
