"""libstdc++'s std::partial_sort and std::sort (GCC 12) on llama_token_data, as native code.

    pos = partial_sort(logits, 40)          # positions of the top 40, in std::partial_sort's order
    sort_buckets(keys, pos, lens, middle)   # llama.cpp's bucketed sort, in place: std::sort of each
                                            # bucket, std::partial_sort of the last

llama.cpp's sampler sorts llama_token_data {id, logit, p} with comp = a.logit > b.logit; equal
logits end where libstdc++'s heap and introsort moves leave them, which no stable sort gives,
and the heap's layout depends on every element that ever entered it (a numpy pre-selection of
the top k, run through the same algorithm, orders ties differently). So the whole algorithm
runs here, step for step as bankml/numerics/stdsort.py spells it (the readable spec), on two
arrays: the f32 keys and an i32 payload (positions in the caller's candidate arrays) that moves
with them. Comparisons are `fcmp ogt`, as the C++ `>` on floats (NaN compares false).

partial_sort reads the row and writes only the `middle` entries it keeps: std::__pop_heap would
also write the evicted element to the scanned position, which nobody reads again. Its scan passes
over eight elements at once when none is above the heap's top (the top only rises, so none of
them would have entered): the same moves, at the speed of reading the row.
"""
from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import (
    Var,
    f32,
    i1,
    i8,
    i32,
    i64,
    intrinsic,
    new_function,
    v8f32,
    void,
)
from bankml.backends.llvm.emit.simd import splat

f32p, i32p, i64p = f32.as_pointer(), i32.as_pointer(), i64.as_pointer()
THRESHOLD = 16                       # std::sort's _S_threshold
LANES = 8


class _Pairs:
    """llama_token_data's (logit, payload) as two arrays, with libstdc++'s moves and comp."""

    def __init__(self, b: ir.IRBuilder, keys, ids):
        self.b, self.keys, self.ids = b, keys, ids

    def key(self, i):
        return self.b.load(self.b.gep(self.keys, [i]), name="key")

    def get(self, i):
        return self.key(i), self.b.load(self.b.gep(self.ids, [i]), name="id")

    def put(self, i, v) -> None:
        self.b.store(v[0], self.b.gep(self.keys, [i]))
        self.b.store(v[1], self.b.gep(self.ids, [i]))

    def move(self, dst, src) -> None:
        self.put(dst, self.get(src))

    def swap(self, i, j) -> None:
        a, c = self.get(i), self.get(j)
        self.put(i, c)
        self.put(j, a)

    def gt(self, x, y):
        """comp(x, y) = x.logit > y.logit on two keys."""
        return self.b.fcmp_ordered(">", x, y)


@contextmanager
def _while(b: ir.IRBuilder, cond, name: str):
    """while (cond()) { body }; cond() is emitted in the loop's condition block. Yields the exit
    block (a body may branch there: break)."""
    head, body, end = (b.append_basic_block(f"{name}.{s}") for s in ("cond", "body", "end"))
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(cond(), body, end)
    b.position_at_end(body)
    yield end
    if not b.block.is_terminated:
        b.branch(head)
    b.position_at_end(end)


@contextmanager
def _for_each(b: ir.IRBuilder, lo, hi, name: str):
    """for (i = lo; i < hi; ++i), hi evaluated once; yields i."""
    i = Var(b, lo, name)
    with _while(b, lambda: b.icmp_signed("<", i.get(), hi), name):
        v = i.get()
        yield v
        i.set(b.add(v, i64(1)))


def _half(b, x):
    """(x) / 2 on i64, C's truncating division."""
    return b.sdiv(x, i64(2))


def _define_adjust_heap(m: ir.Module) -> ir.Function:
    """std::__adjust_heap(first, hole, len, value) then std::__push_heap(first, hole, top, value)."""
    fn, b = new_function(m, "adjust_heap", ir.FunctionType(void, [f32p, i32p, i64, i64, f32, i32]))
    fn.linkage = "internal"
    keys, ids, hole0, n, vk, vid = fn.args
    a = _Pairs(b, keys, ids)
    hole, child = Var(b, hole0, "hole"), Var(b, hole0, "child")
    with _while(b, lambda: b.icmp_signed("<", child.get(), _half(b, b.sub(n, i64(1)))), "down"):
        c = b.mul(i64(2), b.add(child.get(), i64(1)))
        c = b.select(a.gt(a.key(c), a.key(b.sub(c, i64(1)))), b.sub(c, i64(1)), c)
        a.move(hole.get(), c)
        hole.set(c)
        child.set(c)
    even = b.icmp_signed("==", b.and_(n, i64(1)), i64(0))
    at_last = b.icmp_signed("==", child.get(), _half(b, b.sub(n, i64(2))))
    with b.if_then(b.and_(even, at_last)):
        c = b.mul(i64(2), b.add(child.get(), i64(1)))
        a.move(hole.get(), b.sub(c, i64(1)))
        hole.set(b.sub(c, i64(1)))

    def rising():
        up = b.icmp_signed(">", hole.get(), hole0)
        parent = _half(b, b.sub(hole.get(), i64(1)))
        return b.and_(up, a.gt(a.key(parent), vk))      # comp(parent, value); safe when hole == top
    with _while(b, rising, "up"):
        parent = _half(b, b.sub(hole.get(), i64(1)))
        a.move(hole.get(), parent)
        hole.set(parent)
    a.put(hole.get(), (vk, vid))
    b.ret_void()
    return fn


def _define_make_heap(m: ir.Module, adjust: ir.Function) -> ir.Function:
    """std::__make_heap: adjust every parent from (len - 2) / 2 down to 0."""
    fn, b = new_function(m, "make_heap", ir.FunctionType(void, [f32p, i32p, i64]))
    fn.linkage = "internal"
    keys, ids, n = fn.args
    a = _Pairs(b, keys, ids)
    parent = Var(b, _half(b, b.sub(n, i64(2))), "parent")
    with b.if_then(b.icmp_signed(">=", n, i64(2))), \
            _while(b, lambda: b.icmp_signed(">=", parent.get(), i64(0)), "parent"):
        vk, vid = a.get(parent.get())
        b.call(adjust, [keys, ids, parent.get(), n, vk, vid])
        parent.set(b.sub(parent.get(), i64(1)))
    b.ret_void()
    return fn


def _define_sort_heap(m: ir.Module, adjust: ir.Function) -> ir.Function:
    """std::__sort_heap: pop the top to the end, last = len - 1 down to 1."""
    fn, b = new_function(m, "sort_heap", ir.FunctionType(void, [f32p, i32p, i64]))
    fn.linkage = "internal"
    keys, ids, n = fn.args
    a = _Pairs(b, keys, ids)
    last = Var(b, b.sub(n, i64(1)), "last")
    with _while(b, lambda: b.icmp_signed(">", last.get(), i64(0)), "pop"):
        v = a.get(last.get())
        a.move(last.get(), i64(0))
        b.call(adjust, [keys, ids, i64(0), last.get(), *v])
        last.set(b.sub(last.get(), i64(1)))
    b.ret_void()
    return fn


def _define_partial_sort(m: ir.Module, adjust, make_heap, sort_heap) -> ir.Function:
    """std::partial_sort(first, first + middle, first + n): the first `middle` of src (keys; ids,
    or the positions 0.. when null) into keys/ids (which may be src itself): copy, __make_heap,
    __heap_select (each later element above the heap's top replaces it), __sort_heap."""
    fn, b = new_function(m, "partial_sort", ir.FunctionType(void, [f32p, i32p, i64, i64, f32p, i32p]))
    src_k, src_id, n, middle, keys, ids = fn.args
    a = _Pairs(b, keys, ids)
    positional = b.icmp_unsigned("==", src_id, ir.Constant(i32p, None), name="positional")

    def payload(i):
        with b.if_else(positional) as (then, other):
            with then:
                pos, pos_block = b.trunc(i, i32), b.block
            with other:
                given, given_block = b.load(b.gep(src_id, [i])), b.block
        phi = b.phi(i32, name="id")
        phi.add_incoming(pos, pos_block)
        phi.add_incoming(given, given_block)
        return phi

    i = Var(b, i64(0), "i")
    with _while(b, lambda: b.icmp_signed("<", i.get(), middle), "copy"):
        a.put(i.get(), (b.load(b.gep(src_k, [i.get()])), payload(i.get())))
        i.set(b.add(i.get(), i64(1)))
    b.call(make_heap, [keys, ids, middle])
    top = Var(b, a.key(i64(0)), "top")

    def select(j):                                  # __heap_select's step: a later element above the top replaces it
        v = b.load(b.gep(src_k, [j]), name="v")
        with b.if_then(a.gt(v, top.get())):
            b.call(adjust, [keys, ids, i64(0), middle, v, payload(j)])
            top.set(a.key(i64(0)))

    # The top only rises: eight elements none of which is above it now are passed over together.
    with _while(b, lambda: b.icmp_signed("<=", b.add(i.get(), i64(LANES)), n), "select8"):
        v8 = b.load(b.bitcast(b.gep(src_k, [i.get()]), v8f32.as_pointer()), align=4, name="v8")
        above = b.bitcast(a.gt(v8, splat(b, top.get())), i8)
        any_above = b.icmp_unsigned("!=", above, i8(0))
        with b.if_then(any_above), _for_each(b, i.get(), b.add(i.get(), i64(LANES)), "lane") as j:
            select(j)
        i.set(b.add(i.get(), i64(LANES)))
    with _while(b, lambda: b.icmp_signed("<", i.get(), n), "select"):
        select(i.get())
        i.set(b.add(i.get(), i64(1)))
    b.call(sort_heap, [keys, ids, middle])
    b.ret_void()
    return fn


def _define_linear_insert(m: ir.Module) -> ir.Function:
    """std::__unguarded_linear_insert(first + i): move a[i] down past every smaller-ranked one."""
    fn, b = new_function(m, "linear_insert", ir.FunctionType(void, [f32p, i32p, i64]))
    fn.linkage = "internal"
    keys, ids, i0 = fn.args
    a = _Pairs(b, keys, ids)
    v = a.get(i0)
    i = Var(b, i0, "i")
    with _while(b, lambda: a.gt(v[0], a.key(b.sub(i.get(), i64(1)))), "shift"):
        a.move(i.get(), b.sub(i.get(), i64(1)))
        i.set(b.sub(i.get(), i64(1)))
    a.put(i.get(), v)
    b.ret_void()
    return fn


def _define_insertion_sort(m: ir.Module, insert) -> ir.Function:
    """std::__insertion_sort(first + lo, first + hi)."""
    fn, b = new_function(m, "insertion_sort", ir.FunctionType(void, [f32p, i32p, i64, i64]))
    fn.linkage = "internal"
    keys, ids, lo, hi = fn.args
    a = _Pairs(b, keys, ids)
    i = Var(b, b.add(lo, i64(1)), "i")
    with _while(b, lambda: b.icmp_signed("<", i.get(), hi), "insert"):
        v = a.get(i.get())
        with b.if_else(a.gt(v[0], a.key(lo))) as (first, other):
            with first:                                   # move_backward(lo, i, i + 1); a[lo] = v
                j = Var(b, i.get(), "j")
                with _while(b, lambda: b.icmp_signed(">", j.get(), lo), "back"):
                    a.move(j.get(), b.sub(j.get(), i64(1)))
                    j.set(b.sub(j.get(), i64(1)))
                a.put(lo, v)
            with other:
                b.call(insert, [keys, ids, i.get()])
        i.set(b.add(i.get(), i64(1)))
    b.ret_void()
    return fn


def _define_introsort_loop(m: ir.Module, make_heap, sort_heap) -> ir.Function:
    """std::__introsort_loop: median of three to the front, unguarded partition, recurse on the
    right part, loop on the left; past the depth limit std::__partial_sort(lo, hi, hi)."""
    fn, b = new_function(m, "introsort_loop", ir.FunctionType(void, [f32p, i32p, i64, i64, i64]))
    fn.linkage = "internal"
    keys, ids, lo, hi0, depth0 = fn.args
    a = _Pairs(b, keys, ids)
    hi, depth = Var(b, hi0, "hi"), Var(b, depth0, "depth")
    with _while(b, lambda: b.icmp_signed(">", b.sub(hi.get(), lo), i64(THRESHOLD)), "intro") as done:
        with b.if_then(b.icmp_signed("==", depth.get(), i64(0))):
            n = b.sub(hi.get(), lo)
            first_k, first_id = b.gep(keys, [lo]), b.gep(ids, [lo])
            b.call(make_heap, [first_k, first_id, n])
            b.call(sort_heap, [first_k, first_id, n])
            b.branch(done)
        depth.set(b.sub(depth.get(), i64(1)))
        mid = b.add(lo, _half(b, b.sub(hi.get(), lo)))
        x, y, z = b.add(lo, i64(1)), mid, b.sub(hi.get(), i64(1))
        kx, ky, kz = a.key(x), a.key(y), a.key(z)
        # __move_median_to_first(lo, x, y, z)
        m_xy = b.select(a.gt(ky, kz), y, b.select(a.gt(kx, kz), z, x))
        m_not = b.select(a.gt(kx, kz), x, b.select(a.gt(ky, kz), z, y))
        a.swap(lo, b.select(a.gt(kx, ky), m_xy, m_not))
        pivot = a.key(lo)
        f, l = Var(b, b.add(lo, i64(1)), "f"), Var(b, hi.get(), "l")
        with _while(b, lambda: i1(1), "part") as cut:      # __unguarded_partition(lo + 1, hi, lo)
            with _while(b, lambda: a.gt(a.key(f.get()), pivot), "right"):
                f.set(b.add(f.get(), i64(1)))
            l.set(b.sub(l.get(), i64(1)))
            with _while(b, lambda: a.gt(pivot, a.key(l.get())), "left"):
                l.set(b.sub(l.get(), i64(1)))
            go_on = b.append_basic_block("part.swap")
            b.cbranch(b.icmp_signed("<", f.get(), l.get()), go_on, cut)
            b.position_at_end(go_on)
            a.swap(f.get(), l.get())
            f.set(b.add(f.get(), i64(1)))
        b.call(fn, [keys, ids, f.get(), hi.get(), depth.get()])
        hi.set(f.get())
    b.ret_void()
    return fn


def _define_sort(m: ir.Module, intro, insertion, insert) -> ir.Function:
    """std::sort: __introsort_loop with depth 2 * __lg(n), then __final_insertion_sort."""
    fn, b = new_function(m, "std_sort", ir.FunctionType(void, [f32p, i32p, i64]))
    keys, ids, n = fn.args
    with b.if_then(b.icmp_signed(">=", n, i64(2))):
        ctlz = intrinsic(m, "llvm.ctlz.i64", i64, [i64, i1])
        lg = b.sub(i64(63), b.call(ctlz, [n, ir.Constant(i1, 0)]), name="lg")       # std::__lg(n)
        b.call(intro, [keys, ids, i64(0), n, b.mul(i64(2), lg)])
        with b.if_else(b.icmp_signed(">", n, i64(THRESHOLD))) as (big, small):
            with big:
                b.call(insertion, [keys, ids, i64(0), i64(THRESHOLD)])
                with _for_each(b, i64(THRESHOLD), n, "tail") as i:     # __unguarded_insertion_sort
                    b.call(insert, [keys, ids, i])
            with small:
                b.call(insertion, [keys, ids, i64(0), n])
    b.ret_void()
    return fn


def _define_sort_buckets(m: ir.Module, sort, partial) -> ir.Function:
    """The end of llama_token_data_array_partial_sort: std::sort of each full bucket (lens[0..nb-1),
    gathered one after another), std::partial_sort of the last one's first `middle - done`."""
    fn, b = new_function(m, "sort_buckets", ir.FunctionType(void, [f32p, i32p, i64p, i64, i64]))
    keys, ids, lens, nb, middle = fn.args
    at = Var(b, i64(0), "at")
    with _for_each(b, i64(0), b.sub(nb, i64(1)), "bucket") as j:
        n = b.load(b.gep(lens, [j]))
        b.call(sort, [b.gep(keys, [at.get()]), b.gep(ids, [at.get()]), n])
        at.set(b.add(at.get(), n))
    k, p = b.gep(keys, [at.get()]), b.gep(ids, [at.get()])
    b.call(partial, [k, p, b.load(b.gep(lens, [b.sub(nb, i64(1))])), b.sub(middle, at.get()), k, p])
    b.ret_void()
    return fn


def module() -> ir.Module:
    m = ir.Module(name="bankml_stdsort")
    adjust = _define_adjust_heap(m)
    make_heap, sort_heap = _define_make_heap(m, adjust), _define_sort_heap(m, adjust)
    partial = _define_partial_sort(m, adjust, make_heap, sort_heap)
    insert = _define_linear_insert(m)
    sort = _define_sort(m, _define_introsort_loop(m, make_heap, sort_heap), _define_insertion_sort(m, insert), insert)
    _define_sort_buckets(m, sort, partial)
    return m


_P = ctypes.c_void_p


_compiling = threading.Lock()
_compiled: tuple | None = None


def _functions() -> tuple:
    """The engine and its three functions, compiled once: a second engine made by a thread that
    lost a race would be freed under its caller."""
    global _compiled
    if _compiled is None:
        with _compiling:
            if _compiled is None:
                _compiled = _compile()
    return _compiled


def prepare() -> None:
    """Compile the sorts now (or load them from the JIT cache), before a first token needs them:
    `bankml compile` calls it so that a run compiles nothing."""
    _functions()


def _compile():
    eng = jit.compile_module(module())
    addr = eng.get_function_address
    c = ctypes.c_int64
    return (eng,
            ctypes.CFUNCTYPE(None, _P, _P, c, c, _P, _P)(addr("partial_sort")),
            ctypes.CFUNCTYPE(None, _P, _P, c)(addr("std_sort")),
            ctypes.CFUNCTYPE(None, _P, _P, _P, c, c)(addr("sort_buckets")))


def _f32(x: np.ndarray) -> np.ndarray:
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        raise TypeError("stdsort: keys must be a contiguous float32 array")
    return x


def partial_sort(keys: np.ndarray, middle: int) -> np.ndarray:
    """Positions (i32) of the first `middle` after std::partial_sort(first, first + middle, last)
    of keys with comp = a > b (their keys in that order: keys[result])."""
    keys = _f32(keys)
    if not 0 <= middle <= len(keys):
        raise ValueError(f"partial_sort: middle {middle} outside 0..{len(keys)}")
    if middle == 0:
        return np.zeros(0, np.int32)
    out_k, out_id = np.empty(middle, np.float32), np.empty(middle, np.int32)
    _functions()[1](keys.ctypes.data, None, len(keys), middle, out_k.ctypes.data, out_id.ctypes.data)
    return out_id


def std_sort(keys: np.ndarray, ids: np.ndarray) -> None:
    """std::sort of (keys, ids) pairs with comp = a.key > b.key, in place."""
    keys = _f32(keys)
    if ids.dtype != np.int32 or not ids.flags.c_contiguous or len(ids) != len(keys):
        raise TypeError("std_sort: ids must be a contiguous int32 array as long as keys")
    _functions()[2](keys.ctypes.data, ids.ctypes.data, len(keys))


def sort_buckets(keys: np.ndarray, ids: np.ndarray, lens: np.ndarray, middle: int) -> None:
    """llama_token_data_array_partial_sort's sorts, in place on (keys, ids) holding the buckets one
    after another (lens, highest first): std::sort of all but the last, std::partial_sort of the
    last up to `middle` in all. Only the first `middle` pairs are meaningful afterwards."""
    keys = _f32(keys)
    lens = np.ascontiguousarray(lens, np.int64)
    if ids.dtype != np.int32 or not ids.flags.c_contiguous or len(ids) != len(keys) or lens.sum() != len(keys):
        raise TypeError("sort_buckets: ids (int32) and the bucket lengths must cover keys")
    done = int(lens[:-1].sum())
    if not len(lens) or not done < middle <= len(keys):
        raise ValueError(f"sort_buckets: middle {middle} must fall in the last bucket")
    _functions()[3](keys.ctypes.data, ids.ctypes.data, lens.ctypes.data, len(lens), middle)
