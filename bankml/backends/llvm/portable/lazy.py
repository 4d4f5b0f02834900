"""A lazily flushed Gated-DeltaNet head on llvm (gdn.py: Logged, gdn_flush, gdn_fold(_trailing),
gdn_read), as JIT functions over numpy buffers, each the numpy spec step for step with the
emitters of backends/llvm/portable/funcs.py (no graph op uses them yet: the qwen35 graph keeps
its state row by row):

    heads = LazyHeads()
    rows = heads.gdn_flush(rows, log, nth=2)                   # every row r with value r
    (y, c), (y_all, c_all) = heads.gdn_fold_trailing(log, q, width, older)
    out = heads.gdn_read(rows, y, carried, scale)

Every dot is arith.fdot: 8 lanes from -0.0 (element i in lane i mod 8, index order; a tail of
fewer than 8 in lanes 0..), then the tree. gdn_flush splits the rows over nth calls (ith =
0..nth-1, as the kernels' threads do); no bit depends on the split.
"""
from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import f32, for_range, i32, i64, new_function, thread_range, typed, v8f32
from bankml.backends.llvm.portable import funcs as pm
from bankml.backends.llvm.portable.ops import NEG0, _load
from bankml.errors import BankmlError
from bankml.profiles.portable import gdn

F32 = np.float32
_P = ctypes.c_void_p
_I = ctypes.c_int64


def fdot(b: ir.IRBuilder, pa, pb, n) -> ir.Value:
    """arith.fdot of the n floats at pa and pb (n an i64 value)."""
    body = b.mul(b.sdiv(n, i64(8)), i64(8))
    entry = ir.IRBuilder()
    entry.position_at_start(b.function.entry_basic_block)
    acc = entry.alloca(v8f32)                       # in the entry block: one slot, not one per call's loop trip
    b.store(pm.const(v8f32, NEG0), acc)
    with for_range(b, 0, body, 8, name="d8") as i:
        b.store(pm.add(b, b.load(acc), pm.mul(b, _load(b, pa, i, v8f32), _load(b, pb, i, v8f32))), acc)
    with for_range(b, body, n, name="dt") as i:              # the tail: lane i - body
        lane = b.trunc(b.sub(i, body), i32)
        lanes = b.load(acc)
        x = pm.add(b, b.extract_element(lanes, lane), pm.mul(b, _load(b, pa, i), _load(b, pb, i)))
        b.store(b.insert_element(lanes, x, lane), acc)
    return pm.tree(b, b.load(acc))


def _flush(m: ir.Module) -> None:
    """gdn_flush(rows, keys, values, g, beta, L, S_k, S_v, ith, nth): rows [ith's share of S_v]."""
    fn, b = new_function(m, "gdn_flush", ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] * 5 + [i64] * 5))
    rows, keys, values, gs, betas = (typed(b, p, f32) for p in fn.args[:5])
    L, Sk, Sv, ith, nth = fn.args[5:]
    lo, hi = thread_range(b, Sv, ith, nth)
    with for_range(b, lo, hi, name="r") as r:
        row = b.gep(rows, [b.mul(r, Sk)])
        with for_range(b, 0, L, name="t") as t:
            key = b.gep(keys, [b.mul(t, Sk)])
            decay, beta = pm.exp(b, _load(b, gs, t)), _load(b, betas, t)
            vr = _load(b, values, b.add(b.mul(t, Sv), r))
            coef = pm.mul(b, beta, pm.sub(b, vr, pm.mul(b, decay, fdot(b, row, key, Sk))))
            with for_range(b, 0, Sk, name="i") as i:
                x = pm.add(b, pm.mul(b, decay, _load(b, row, i)), pm.mul(b, coef, _load(b, key, i)))
                b.store(x, b.gep(row, [i]))
    b.ret_void()


def _fold(m: ir.Module) -> None:
    """gdn_fold(keys, values, g, beta, q, y [2 S_k], carried [2 width], L, S_k, S_v, width, older):
    the walk newest first, (y, carried) kept in the second halves and copied to the first when
    only the oldest `older` tokens are left."""
    fn, b = new_function(m, "gdn_fold", ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] * 7 + [i64] * 5))
    keys, values, gs, betas, q, ys, cs = (typed(b, p, f32) for p in fn.args[:7])
    L, Sk, Sv, width, older = fn.args[7:]
    y, c = b.gep(ys, [Sk]), b.gep(cs, [width])

    def snapshot():
        with for_range(b, 0, Sk, name="sy") as i:
            b.store(b.load(b.gep(y, [i])), b.gep(ys, [i]))
        with for_range(b, 0, width, name="sc") as i:
            b.store(b.load(b.gep(c, [i])), b.gep(cs, [i]))
    with for_range(b, 0, Sk, name="y0") as i:
        b.store(_load(b, q, i), b.gep(y, [i]))
    with for_range(b, 0, width, name="c0") as i:
        b.store(f32(0.0), b.gep(c, [i]))
    with for_range(b, 0, L, name="w") as w:
        t = b.sub(b.sub(L, w), i64(1))                                     # newest first
        with b.if_then(b.icmp_signed("==", b.add(t, i64(1)), older)):
            snapshot()
        key = b.gep(keys, [b.mul(t, Sk)])
        coef = pm.mul(b, _load(b, betas, t), fdot(b, key, y, Sk))
        decay = pm.exp(b, _load(b, gs, t))
        with for_range(b, 0, width, name="cv") as i:
            x = pm.add(b, _load(b, c, i), pm.mul(b, coef, _load(b, values, b.add(b.mul(t, Sv), i))))
            b.store(x, b.gep(c, [i]))
        with for_range(b, 0, Sk, name="yd") as i:
            x = pm.mul(b, decay, pm.sub(b, _load(b, y, i), pm.mul(b, coef, _load(b, key, i))))
            b.store(x, b.gep(y, [i]))
    with b.if_then(b.icmp_signed("==", older, i64(0))):
        snapshot()
    b.ret_void()


def _read(m: ir.Module) -> None:
    """gdn_read(rows, y, carried, out, R, S_k, scale): out[r] = (row_r·y + carried[r])·scale."""
    fn, b = new_function(m, "gdn_read", ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] * 4 + [i64] * 2
                                                         + [f32]))
    rows, y, cs, out = (typed(b, p, f32) for p in fn.args[:4])
    R, Sk, scale = fn.args[4:]
    with for_range(b, 0, R, name="r") as r:
        dot = fdot(b, b.gep(rows, [b.mul(r, Sk)]), y, Sk)
        b.store(pm.mul(b, pm.add(b, dot, _load(b, cs, r)), pm.canon(b, scale)), b.gep(out, [r]))
    b.ret_void()


def _checked(f, *args):
    """f(*args), its ValueError as a BankmlError (one line)."""
    try:
        return f(*args)
    except ValueError as e:
        raise BankmlError(f"lazy head: {e}") from None


class LazyHeads:
    """The three functions compiled once (an engine of this object's own)."""

    def __init__(self):
        m = ir.Module(name="portable_lazy_heads")
        for emit in (_flush, _fold, _read):
            emit(m)
        self.engine = jit.compile_module(m)
        addr = self.engine.get_function_address
        self._flush = ctypes.CFUNCTYPE(None, *[_P] * 5, *[_I] * 5)(addr("gdn_flush"))
        self._fold = ctypes.CFUNCTYPE(None, *[_P] * 7, *[_I] * 5)(addr("gdn_fold"))
        self._read = ctypes.CFUNCTYPE(None, *[_P] * 4, _I, _I, ctypes.c_float)(addr("gdn_read"))

    def gdn_flush(self, rows: np.ndarray, log, nth: int = 1) -> np.ndarray:
        """gdn.gdn_flush of every row r (value r) of a head: rows f32 [S_v, S_k] -> the flushed rows."""
        out = np.array(rows, F32, copy=True, order="C")
        Sv, Sk = out.shape
        bufs = _checked(gdn.log_arrays, log, Sk, Sv)
        for ith in range(nth):
            self._flush(out.ctypes.data, *[a.ctypes.data for a in bufs], len(log), Sk, Sv, ith, nth)
        return out

    def gdn_fold_trailing(self, log, q: np.ndarray, width: int, older: int):
        """gdn.gdn_fold_trailing: ((y, carried) over the newer tokens, (y, carried) over the whole log)."""
        q = np.ascontiguousarray(q, F32)
        Sk, Sv = _checked(gdn.check_fold, log, q, width, older)
        bufs = gdn.log_arrays(log, Sk, Sv)
        y, c = np.zeros(2 * Sk, F32), np.zeros(2 * width, F32)
        self._fold(*[a.ctypes.data for a in bufs], q.ctypes.data, y.ctypes.data, c.ctypes.data,
                   len(log), Sk, Sv, width, older)
        return (y[:Sk], c[:width]), (y[Sk:], c[width:])

    def gdn_fold(self, log, q: np.ndarray, width: int):
        """gdn.gdn_fold: (the folded query, the collected values)."""
        return self.gdn_fold_trailing(log, q, width, 0)[1]

    def gdn_read(self, rows: np.ndarray, y: np.ndarray, carried: np.ndarray, scale: float) -> np.ndarray:
        """gdn.gdn_read of each row (rows f32 [R, S_k], carried [R]) -> f32 [R]."""
        rows, y, carried = (np.ascontiguousarray(a, F32) for a in (rows, y, carried))
        _checked(gdn.check_read, rows, y, carried)
        R, Sk = rows.shape
        out = np.empty(R, F32)
        self._read(rows.ctypes.data, y.ctypes.data, carried.ctypes.data, out.ctypes.data, R, Sk, F32(scale))
        return out
