"""The portable profile's row functions that no graph op lowers on llvm (funcs.py: fmax, absmax,
argmax, softmax, hadamard; attention.py: attend_vector), as JIT functions over the rows of an
f32 matrix, each the numpy spec step for step with the emitters of backends/llvm/portable/funcs.py:

    vf = VectorFuncs()
    m = vf.fmax(x, nth=2)          # x f32 [R, n] -> f32 [R]; rows split over nth calls

- fmax, absmax: 8 lanes, each keeps the larger (a NaN compares false, so it is passed over),
  then the lanes; the spec's result depends on no order (fmax's zero is +0, absmax reads a
  denormal as 0), so neither does this one.
- argmax: one pass in index order keeping the first largest non-NaN (the two zeros equal); 0
  when every element is NaN.
- softmax: fmax, e = exp(x - max) in 8 lanes, their fold_sum (lanes from -0.0 in index order,
  a tail of fewer than 8 in lanes 0.., then the tree), one recip, the products.
- attend_vector: per head (threads split the heads) each position's score fdot(k_j, q) (8
  lanes by element) times scale, the softmax of the scores as above, and each value element
  the fdot of the probabilities with that element across the positions (8 lanes by position).
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
from bankml.backends.llvm.portable.lazy import fdot
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
    _softmax_into(b, row, b.gep(out, [b.mul(r, n)]), n)


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


def _softmax_into(b: ir.IRBuilder, row, y, n) -> None:
    """y[0:n] = funcs.softmax of the n floats at row (y may be row itself)."""
    mx = pm.splat(b, _fmax(b, row, n), v8f32)
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


def _attend_vector(m: ir.Module) -> None:
    """attend_vector(q [H, D], k [H, n, D], v [H, n, D], p [H, n], lanes [H, D, 8] (-0.0), out [H, D],
    H, n, D, scale, ith, nth)."""
    fn, b = new_function(m, "attend_vector", ir.FunctionType(
        ir.VoidType(), [ir.IntType(8).as_pointer()] * 6 + [i64] * 3 + [f32] + [i64] * 2))
    qs, ks, vs, ps, ls, ys = (typed(b, p, f32) for p in fn.args[:6])
    H, n, D, scale, ith, nth = fn.args[6:]
    lo, hi = thread_range(b, H, ith, nth)
    with for_range(b, lo, hi, name="h") as h:
        q, p = b.gep(qs, [b.mul(h, D)]), b.gep(ps, [b.mul(h, n)])
        k, v = b.gep(ks, [b.mul(h, b.mul(n, D))]), b.gep(vs, [b.mul(h, b.mul(n, D))])
        with for_range(b, 0, n, name="s") as j:
            s = pm.mul(b, fdot(b, b.gep(k, [b.mul(j, D)]), q, D), scale)
            b.store(s, b.gep(p, [j]))
        _softmax_into(b, p, p, n)
        lanes, y = b.gep(ls, [b.mul(h, b.mul(D, i64(8)))]), b.gep(ys, [b.mul(h, D)])
        with for_range(b, 0, n, name="j") as j:                 # position j in lane j mod 8
            pj, lane = _load(b, p, j), b.urem(j, i64(8))
            with for_range(b, 0, D, name="d") as d:
                at = b.gep(lanes, [b.add(b.mul(d, i64(8)), lane)])
                b.store(pm.add(b, b.load(at), pm.mul(b, pj, _load(b, v, b.add(b.mul(j, D), d)))), at)
        with for_range(b, 0, D, name="t") as d:
            acc = b.load(b.bitcast(b.gep(lanes, [b.mul(d, i64(8))]), v8f32.as_pointer()), align=4)
            b.store(pm.tree(b, acc), b.gep(y, [d]))
    b.ret_void()


_FUNCS = {"fmax": _emit_fmax, "absmax": _emit_absmax, "argmax": _emit_argmax,
          "softmax": _emit_softmax, "hadamard": _emit_hadamard}


class VectorFuncs:
    """The six functions compiled once (an engine of this object's own)."""

    def __init__(self):
        m = ir.Module(name="portable_vector_funcs")
        for name, body in _FUNCS.items():
            _rows(m, name, body)
        _attend_vector(m)
        self.engine = jit.compile_module(m)
        self._fn = {name: ctypes.CFUNCTYPE(None, _P, _P, *[_I] * 4)(self.engine.get_function_address(name))
                    for name in _FUNCS}
        self._attend = ctypes.CFUNCTYPE(None, *[_P] * 6, *[_I] * 3, ctypes.c_float, _I, _I)(
            self.engine.get_function_address("attend_vector"))

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

    def attend_vector(self, q, k, v, scale: float, nth: int = 1) -> np.ndarray:
        """attention.attend_vector of each head: q f32 [H, D], k, v f32 [H, n, D] -> f32 [H, D]."""
        q, k, v = (np.ascontiguousarray(a, F32) for a in (q, k, v))
        H, D = q.shape
        if k.shape != v.shape or k.shape[::2] != (H, D):
            raise BankmlError(f"attend_vector: q {q.shape}, k {k.shape} and v {v.shape} do not agree")
        n = k.shape[1]
        p, lanes, out = np.empty((H, n), F32), np.full((H, D, 8), F32(-0.0)), np.empty((H, D), F32)
        for ith in range(nth):
            self._attend(q.ctypes.data, k.ctypes.data, v.ctypes.data, p.ctypes.data, lanes.ctypes.data,
                         out.ctypes.data, H, n, D, F32(scale), ith, nth)
        return out
