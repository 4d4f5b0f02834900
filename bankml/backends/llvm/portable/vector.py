"""The portable profile's row functions that no graph op lowers on llvm (funcs.py: fmax, absmax,
argmax, softmax, hadamard), as JIT functions over the rows of an f32 matrix, each the numpy spec
step for step with the emitters of backends/llvm/portable/funcs.py:

    vf = VectorFuncs()
    m = vf.fmax(x, nth=2)          # x f32 [R, n] -> f32 [R]; rows split over nth calls

- fmax, absmax: 8 lanes, each keeps the larger (a NaN compares false, so it is passed over),
  then the lanes; the spec's result depends on no order (fmax's zero is +0, absmax reads a
  denormal as 0), so neither does this one.
- argmax: one pass in index order keeping the first largest non-NaN (the two zeros equal); 0
  when every element is NaN.
- softmax: fmax, e = exp(x - max) in 8 lanes, their fold_sum (lanes from -0.0 in index order,
  a tail of fewer than 8 in lanes 0.., then the tree), one recip, the products.
- hadamard: each stride h = 1, 2, 4, .. in turn, every pair (x[j], x[j+h]) of a 2h-block
  becomes (x[j] + x[j+h], x[j] - x[j+h]); pairs never meet within a stride, so in place.
Inputs are read canonical (a denormal as a zero of its sign, any NaN the one NaN), as the spec's.
"""
from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import f32, for_range, i32, i64, new_function, thread_range, typed, v8f32
from bankml.backends.llvm.portable import funcs as pm
from bankml.backends.llvm.portable.ops import NEG0, _load, _vstore
from bankml.errors import BankmlError

F32 = np.float32
_P = ctypes.c_void_p
_I = ctypes.c_int64
_ARGS = [ir.IntType(8).as_pointer()] * 2 + [i64] * 4          # x, out, R, n, ith, nth


def _rows(m: ir.Module, name: str, body) -> None:
    """name(x, out, R, n, ith, nth): body(b, x_row, r, out, n) for the thread's share of the R rows."""
    fn, b = new_function(m, name, ir.FunctionType(ir.VoidType(), _ARGS))
    xs, out = (typed(b, p, f32) for p in fn.args[:2])
    R, n, ith, nth = fn.args[2:]
    lo, hi = thread_range(b, R, ith, nth)
    with for_range(b, lo, hi, name="r") as r:
        body(b, b.gep(xs, [b.mul(r, n)]), r, out, n)
    b.ret_void()


def _slot(b: ir.IRBuilder, t: ir.Type, init) -> ir.Value:
    """A stack slot in the entry block (one, not one per loop trip), set to init here."""
    entry = ir.IRBuilder()
    entry.position_at_start(b.function.entry_basic_block)
    p = entry.alloca(t)
    b.store(init, p)
    return p


def _larger(b: ir.IRBuilder, x, best):
    """x where x > best (a NaN is never larger), else best."""
    return b.select(b.fcmp_ordered(">", x, best), x, best)


def _fold_max(b: ir.IRBuilder, row, n, start: float, value) -> ir.Value:
    """The largest value(x) of the row's canonical x, from `start`, 8 lanes then the lanes."""
    body = b.mul(b.sdiv(n, i64(8)), i64(8))
    acc = _slot(b, v8f32, pm.const(v8f32, start))
    with for_range(b, 0, body, 8, name="m8") as i:
        b.store(_larger(b, value(b, _load(b, row, i, v8f32)), b.load(acc)), acc)
    best = b.load(acc)
    out = _slot(b, f32, b.extract_element(best, i32(0)))
    for lane in range(1, 8):
        b.store(_larger(b, b.extract_element(best, i32(lane)), b.load(out)), out)
    with for_range(b, body, n, name="mt") as i:
        b.store(_larger(b, value(b, _load(b, row, i)), b.load(out)), out)
    return b.load(out)


def _fmax(b: ir.IRBuilder, row, n) -> ir.Value:
    """funcs.fmax of a row: from -inf, a zero maximum +0."""
    mx = _fold_max(b, row, n, -np.inf, lambda b, x: x)
    return b.select(b.fcmp_ordered("==", mx, f32(0.0)), f32(0.0), mx)


def _emit_fmax(b, row, r, out, n) -> None:
    b.store(_fmax(b, row, n), b.gep(out, [r]))


def _emit_absmax(b, row, r, out, n) -> None:
    b.store(pm.canon(b, _fold_max(b, row, n, 0.0, pm.fabs)), b.gep(out, [r]))


def _emit_argmax(b, row, r, out, n) -> None:
    best, idx = _slot(b, f32, f32(-np.inf)), _slot(b, i64, i64(-1))
    with for_range(b, 0, n, name="a") as i:
        x = _load(b, row, i)
        none_yet = b.and_(b.icmp_signed("<", b.load(idx), i64(0)), b.fcmp_ordered("ord", x, x))
        take = b.or_(b.fcmp_ordered(">", x, b.load(best)), none_yet)
        b.store(b.select(take, x, b.load(best)), best)
        b.store(b.select(take, i, b.load(idx)), idx)
    i_out = b.bitcast(out, i64.as_pointer())
    b.store(b.select(b.icmp_signed("<", b.load(idx), i64(0)), i64(0), b.load(idx)), b.gep(i_out, [r]))


def _emit_softmax(b, row, r, out, n) -> None:
    mx = pm.splat(b, _fmax(b, row, n), v8f32)
    y = b.gep(out, [b.mul(r, n)])
    body = b.mul(b.sdiv(n, i64(8)), i64(8))
    acc = _slot(b, v8f32, pm.const(v8f32, NEG0))
    with for_range(b, 0, body, 8, name="e8") as i:              # e, kept in y, and the lane sums
        e = pm.exp(b, pm.sub(b, _load(b, row, i, v8f32), mx))
        _vstore(b, e, y, i)
        b.store(pm.add(b, b.load(acc), e), acc)
    mx1 = b.extract_element(mx, i32(0))
    with for_range(b, body, n, name="et") as i:                 # the tail: lane i - body
        e = pm.exp(b, pm.sub(b, _load(b, row, i), mx1))
        b.store(e, b.gep(y, [i]))
        lane = b.trunc(b.sub(i, body), i32)
        lanes = b.load(acc)
        b.store(b.insert_element(lanes, pm.add(b, b.extract_element(lanes, lane), e), lane), acc)
    rc = pm.recip(b, pm.tree(b, b.load(acc)))
    with for_range(b, 0, n, name="p") as i:
        b.store(pm.mul(b, b.load(b.gep(y, [i])), rc), b.gep(y, [i]))


def _emit_hadamard(b, row, r, out, n) -> None:
    y = b.gep(out, [b.mul(r, n)])
    with for_range(b, 0, n, name="c") as i:
        b.store(_load(b, row, i), b.gep(y, [i]))
    h = _slot(b, i64, i64(1))
    cond = b.append_basic_block("h.cond")
    step = b.append_basic_block("h.step")
    done = b.append_basic_block("h.done")
    b.branch(cond)
    b.position_at_end(cond)
    b.cbranch(b.icmp_signed("<", b.load(h), n), step, done)
    b.position_at_end(step)
    hv = b.load(h)
    with for_range(b, 0, b.udiv(n, i64(2)), name="j") as k:    # pair k: j = (k / h)·2h + k mod h
        j = b.add(b.mul(b.udiv(k, hv), b.mul(hv, i64(2))), b.urem(k, hv))
        plo, phi = b.gep(y, [j]), b.gep(y, [b.add(j, hv)])
        lo, hi = b.load(plo), b.load(phi)
        b.store(pm.add(b, lo, hi), plo)
        b.store(pm.sub(b, lo, hi), phi)
    b.store(b.mul(hv, i64(2)), h)
    b.branch(cond)
    b.position_at_end(done)


_FUNCS = {"fmax": _emit_fmax, "absmax": _emit_absmax, "argmax": _emit_argmax,
          "softmax": _emit_softmax, "hadamard": _emit_hadamard}


class VectorFuncs:
    """The five functions compiled once (an engine of this object's own)."""

    def __init__(self):
        m = ir.Module(name="portable_vector_funcs")
        for name, body in _FUNCS.items():
            _rows(m, name, body)
        self.engine = jit.compile_module(m)
        self._fn = {name: ctypes.CFUNCTYPE(None, _P, _P, *[_I] * 4)(self.engine.get_function_address(name))
                    for name in _FUNCS}

    def _run(self, name: str, x, out: np.ndarray, nth: int) -> np.ndarray:
        x = np.ascontiguousarray(x, F32)
        R, n = x.shape
        for ith in range(nth):
            self._fn[name](x.ctypes.data, out.ctypes.data, R, n, ith, nth)
        return out

    def fmax(self, x, nth: int = 1) -> np.ndarray:
        """funcs.fmax of each row of x [R, n] -> f32 [R]."""
        return self._run("fmax", x, np.empty(len(x), F32), nth)

    def absmax(self, x, nth: int = 1) -> np.ndarray:
        """funcs.absmax of each row of x [R, n] -> f32 [R]."""
        return self._run("absmax", x, np.empty(len(x), F32), nth)

    def argmax(self, x, nth: int = 1) -> np.ndarray:
        """funcs.argmax of each row of x [R, n] -> int64 [R]."""
        return self._run("argmax", x, np.empty(len(x), np.int64), nth)

    def softmax(self, x, nth: int = 1) -> np.ndarray:
        """funcs.softmax of each row of x [R, n] -> f32 [R, n]."""
        return self._run("softmax", x, np.empty(np.shape(x), F32), nth)

    def hadamard(self, x, nth: int = 1) -> np.ndarray:
        """funcs.hadamard of each row of x [R, n] (n a power of two) -> f32 [R, n]."""
        n = np.shape(x)[-1]
        if n < 1 or n & (n - 1):
            raise BankmlError(f"hadamard: length {n} is not a power of two")
        return self._run("hadamard", x, np.empty(np.shape(x), F32), nth)
