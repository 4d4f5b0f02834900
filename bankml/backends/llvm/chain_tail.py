"""The sampler chain after top-k, as native code: top-p, min-p, temperature and dist on the sorted
candidates top-k left, in one call; with top-k itself (std::partial_sort, k <= 128) in the same call.

    steps = Program([(TOP_P, 0.95, 0), (MIN_P, logf(0.05), 0), (TEMP, 0.8, 0)])
    sel, n, has_p, total = steps.run(logit, p, e, rnd)   # logit: the k sorted candidates' (written)
    sel, n, has_p, total = steps.top_k(row, 40, rnd)     # top-k of the whole row first; then
    ids, logit, p, e = steps.ids, steps.keys, steps.p, steps.e   # their first n hold the candidates

After a decode step Python runs on cold caches (the step streamed the weights through them), and
each numpy call or array address taken costs tens of microseconds there: `top_k` reads the row
through one call with every buffer address prepared, which is most of a sampled token's cost.

Each step is runtime/sampler_filters.py's on sorted candidates, which is src/llama-sampler.cpp's
(the readable spec; tests/runtime/test_chain_tail.py holds the two to the bit):
- TOP_P(p, min_keep): softmax (max = the first logit, glibc expf(l - max), their f32 sum in
  order, each p = e / sum), then keep up to the first i whose f32 running sum of p is >= p with
  i + 1 >= min_keep (min_keep a size_t: compared unsigned);
- MIN_P(logf(p), min_keep): cut = first logit + logf(p) in f32; keep the first i candidates, i the
  first from 1 with logit < cut and i >= min_keep;
- TEMP(t): t <= 0 keeps the first of the highest (strictly higher replaces; NaN never is) and sets
  every other logit to -inf; otherwise each logit / t in f32;
- then dist(rnd): one candidate: weight 1, total 1; else e = expf(l - first logit), their running
  double sum, the first whose running sum is >= total * rnd (the last when none is).
Steps a sampler takes as off (top-p >= 1, min-p <= 0, temperature 1) are left out of the program
by its caller. Comparisons are ordered (`fcmp o..`): a NaN compares false, as in C. No fast-math,
no FMA: every operation rounds as the C code's does. expf is the process's glibc expf.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit, stdsort
from bankml.backends.llvm.emit.core import Var, f32, f64, for_range, i1, i32, i64, intrinsic, new_function

TOP_P, MIN_P, TEMP = 1, 2, 3
TOP_K_MAX = 128             # above it llama.cpp sorts in buckets (sampler_filters.bucket_partial_sort)
f32p, f64p, i32p, i64p = f32.as_pointer(), f64.as_pointer(), i32.as_pointer(), i64.as_pointer()
_NEG_INF = float("-inf")


class _First:
    """The first index i of a loop where a condition holds: `at` keeps `default` until then."""

    def __init__(self, b: ir.IRBuilder, default, name: str):
        self.b = b
        self.at = Var(b, default, name)
        self.found = Var(b, i1(0), f"{name}.found")

    def offer(self, cond, i) -> None:
        b = self.b
        hit = b.and_(cond, b.not_(self.found.get()))
        self.at.set(b.select(hit, i, self.at.get()))
        self.found.set(b.or_(self.found.get(), cond))


def _define_tail(m: ir.Module) -> ir.Function:
    """i64 chain_tail(float* logit, float* p, float* e, i64 n, i32* ops, float* fargs, i64* iargs,
    i64 nops, double rnd, double* total, i64* state): returns the selected position; state[0] the
    candidates left, state[1] 1 when p holds their probabilities (a TOP_P ran), total[0] dist's sum."""
    fn, b = new_function(m, "chain_tail", ir.FunctionType(
        i64, [f32p, f32p, f32p, i64, i32p, f32p, i64p, i64, f64, f64p, i64p]))
    logit, p, e, n0, ops, fargs, iargs, nops, rnd, total_out, state = fn.args
    expf = intrinsic(m, "expf", f32, [f32])
    n = Var(b, n0, "n")
    has_p = Var(b, i64(0), "has_p")

    def at(arr, i):
        return b.gep(arr, [i])

    def softmax(count):
        """p = expf(l - l[0]) / their f32 sum in order."""
        first = b.load(at(logit, i64(0)))
        s = Var(b, f32(0.0), "sum")
        with for_range(b, 0, count, name="sm") as i:
            x = b.call(expf, [b.fsub(b.load(at(logit, i)), first)])
            b.store(x, at(p, i))
            s.set(b.fadd(s.get(), x))
        total = s.get()
        with for_range(b, 0, count, name="norm") as i:
            b.store(b.fdiv(b.load(at(p, i)), total), at(p, i))

    with for_range(b, 0, nops, name="step") as k:
        op, farg, iarg = b.load(at(ops, k)), b.load(at(fargs, k)), b.load(at(iargs, k))
        count = n.get()
        top_p, not_top_p = b.append_basic_block("top_p"), b.append_basic_block("not_top_p")
        min_p, temp, done = (b.append_basic_block(s) for s in ("min_p", "temp", "step.done"))
        b.cbranch(b.icmp_signed("==", op, i32(TOP_P)), top_p, not_top_p)

        b.position_at_end(top_p)
        softmax(count)
        has_p.set(i64(1))
        cum = Var(b, f32(0.0), "cum")
        last = _First(b, count, "last")
        with for_range(b, 0, count, name="tp") as i:
            cum.set(b.fadd(cum.get(), b.load(at(p, i))))
            i1_ = b.add(i, i64(1))
            last.offer(b.and_(b.fcmp_ordered(">=", cum.get(), farg), b.icmp_unsigned(">=", i1_, iarg)), i1_)
        n.set(last.at.get())
        b.branch(done)

        b.position_at_end(not_top_p)
        b.cbranch(b.icmp_signed("==", op, i32(MIN_P)), min_p, temp)

        b.position_at_end(min_p)
        cut = b.fadd(b.load(at(logit, i64(0))), farg)
        keep = _First(b, count, "keep")
        with for_range(b, 1, count, name="mp") as i:
            keep.offer(b.and_(b.fcmp_ordered("<", b.load(at(logit, i)), cut), b.icmp_unsigned(">=", i, iarg)), i)
        n.set(keep.at.get())
        b.branch(done)

        b.position_at_end(temp)
        greedy, scaled = b.append_basic_block("temp.greedy"), b.append_basic_block("temp.scaled")
        b.cbranch(b.fcmp_ordered("<=", farg, f32(0.0)), greedy, scaled)
        b.position_at_end(greedy)
        best, best_l = Var(b, i64(0), "best"), Var(b, b.load(at(logit, i64(0))), "best_l")
        with for_range(b, 1, count, name="tg") as i:
            x = b.load(at(logit, i))
            gt = b.fcmp_ordered(">", x, best_l.get())
            best.set(b.select(gt, i, best.get()))
            best_l.set(b.select(gt, x, best_l.get()))
        with for_range(b, 0, count, name="tm") as i:
            keep_it = b.icmp_signed("==", i, best.get())
            b.store(b.select(keep_it, b.load(at(logit, i)), f32(_NEG_INF)), at(logit, i))
        b.branch(done)
        b.position_at_end(scaled)
        with for_range(b, 0, count, name="ts") as i:
            b.store(b.fdiv(b.load(at(logit, i)), farg), at(logit, i))
        b.branch(done)
        b.position_at_end(done)

    # dist
    count = n.get()
    one, many, end = (b.append_basic_block(s) for s in ("dist.one", "dist.many", "dist.end"))
    b.store(count, at(state, i64(0)))
    b.store(has_p.get(), at(state, i64(1)))
    b.cbranch(b.icmp_signed("==", count, i64(1)), one, many)
    b.position_at_end(one)
    b.store(f32(1.0), at(e, i64(0)))
    b.store(f64(1.0), total_out)
    b.ret(i64(0))

    b.position_at_end(many)
    first = b.load(at(logit, i64(0)))
    run = Var(b, f64(0.0), "run")
    with for_range(b, 0, count, name="de") as i:
        x = b.call(expf, [b.fsub(b.load(at(logit, i)), first)])
        b.store(x, at(e, i))
        run.set(b.fadd(run.get(), b.fpext(x, f64)))
    total = run.get()
    b.store(total, total_out)
    threshold = b.fmul(total, rnd)
    run.set(f64(0.0))
    sel = _First(b, b.sub(count, i64(1)), "sel")
    with for_range(b, 0, count, name="ds") as i:
        run.set(b.fadd(run.get(), b.fpext(b.load(at(e, i)), f64)))
        sel.offer(b.fcmp_ordered(">=", run.get(), threshold), i)
    b.branch(end)
    b.position_at_end(end)
    b.ret(sel.at.get())
    return fn


# top_k's context: one i64 array, so that a call passes three arguments
CTX = ("n", "k", "keys", "ids", "p", "e", "ops", "fargs", "iargs", "nops", "total", "state")


def _define_top_k(m: ir.Module, tail: ir.Function) -> None:
    """i64 top_k_tail(float* row, i64* ctx, double rnd): std::partial_sort of the row's first k
    into ctx's keys/ids (positions), then chain_tail on them."""
    fn, b = new_function(m, "top_k_tail", ir.FunctionType(i64, [f32p, i64p, f64]))
    row, ctx, rnd = fn.args
    get = {name: b.load(b.gep(ctx, [i64(i)]), name=name) for i, name in enumerate(CTX)}
    ptr = lambda name, t: b.inttoptr(get[name], t)         # noqa: E731
    b.call(m.globals["partial_sort"], [row, ir.Constant(i32p, None), get["n"], get["k"], ptr("keys", f32p),
                                       ptr("ids", i32p)])
    b.ret(b.call(tail, [ptr("keys", f32p), ptr("p", f32p), ptr("e", f32p), get["k"], ptr("ops", i32p),
                        ptr("fargs", f32p), ptr("iargs", i64p), get["nops"], rnd, ptr("total", f64p),
                        ptr("state", i64p)]))


def module() -> ir.Module:
    """libstdc++'s sorts (stdsort.module) with the tail and top_k_tail beside them."""
    m = stdsort.module()
    m.name = "bankml_chain_tail"
    _define_top_k(m, _define_tail(m))
    return m


_compiling = threading.Lock()
_compiled: tuple | None = None
_P = ctypes.c_void_p


def _functions() -> tuple:
    """chain_tail and top_k_tail, compiled once (a second engine made by a thread that lost a race
    would be freed under its caller)."""
    global _compiled
    if _compiled is None:
        with _compiling:
            if _compiled is None:
                import llvmlite.binding as llvm
                llvm.load_library_permanently(ctypes.util.find_library("m"))   # expf: glibc's
                eng = jit.compile_module(module())
                addr = eng.get_function_address
                tail = ctypes.CFUNCTYPE(ctypes.c_int64, _P, _P, _P, ctypes.c_int64, _P, _P, _P, ctypes.c_int64,
                                        ctypes.c_double, _P, _P)(addr("chain_tail"))
                top_k = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double)(
                    addr("top_k_tail"))
                _compiled = (eng, tail, top_k)
    return _compiled


def prepare() -> None:
    """Compile the tail now (or load it from the JIT cache): `bankml compile` calls it."""
    _functions()


class Program:
    """The steps of one chain's tail, as chain_tail takes them: (op, float arg, int arg) each, the
    float args already C floats (MIN_P's is logf(p)), the int args size_t values."""

    def __init__(self, steps: list[tuple[int, float, int]], k: int = 0):
        """k: the top-k that `top_k` runs first (at most TOP_K_MAX)."""
        if not 0 <= k <= TOP_K_MAX:
            raise ValueError(f"chain_tail: top-k {k} outside 0..{TOP_K_MAX}")
        self.ops = np.array([s[0] for s in steps] or [0], np.int32)
        self.fargs = np.array([s[1] for s in steps] or [0], np.float32)
        self.iargs = np.array([s[2] % 2 ** 64 for s in steps] or [0], np.uint64).view(np.int64)
        self.nops = len(steps)
        self.total = np.zeros(1, np.float64)
        self.state = np.zeros(2, np.int64)
        self._addr = tuple(a.ctypes.data for a in (self.ops, self.fargs, self.iargs, self.total, self.state))
        # top_k's buffers and its context (CTX); n is set per row
        self.k = k
        self.keys, self.p, self.e = (np.empty(max(k, 1), np.float32) for _ in range(3))
        self.ids = np.empty(max(k, 1), np.int32)
        ctx = dict(n=0, k=k, keys=self.keys, ids=self.ids, p=self.p, e=self.e, ops=self.ops, fargs=self.fargs,
                   iargs=self.iargs, nops=self.nops, total=self.total, state=self.state)
        self.ctx = np.array([v if isinstance(v, int) else v.ctypes.data for v in (ctx[c] for c in CTX)], np.int64)
        self._ctx, self._n = self.ctx.ctypes.data, 0

    def run(self, logit: np.ndarray, p: np.ndarray, e: np.ndarray, rnd: float) -> tuple[int, int, bool, float]:
        """The steps then dist on the len(logit) sorted candidates: (selected position, candidates
        left, whether p holds their probabilities, dist's double sum). logit (f32, written: the
        candidates' logits after the steps), p and e (f32, as long) must be contiguous."""
        n = len(logit)
        if not (n >= 1 and len(p) >= n and len(e) >= n and all(
                a.dtype == np.float32 and a.flags.c_contiguous for a in (logit, p, e))) or not logit.flags.writeable:
            raise TypeError("chain_tail: logit, p and e must be contiguous float32 arrays of n >= 1 (logit writable)")
        ops, fargs, iargs, total, state = self._addr
        sel = _functions()[1](logit.ctypes.data, p.ctypes.data, e.ctypes.data, n, ops, fargs, iargs, self.nops,
                          rnd, total, state)
        return int(sel), int(self.state[0]), bool(self.state[1]), float(self.total[0])

    def top_k(self, row: np.ndarray, rnd: float) -> tuple[int, int, bool, float]:
        """std::partial_sort of the row's top min(k, len(row)) (positions into self.ids, their logits
        into self.keys), then the steps and dist on them: as run(). The buffers are overwritten by
        the next call. row: contiguous float32 (checked by the caller, whose hot path this is)."""
        n = len(row)
        if n != self._n:
            if n < 1:
                raise ValueError("chain_tail: an empty row")
            self.ctx[0], self.ctx[1], self._n = n, min(self.k, n), n
        sel = _functions()[2](row.__array_interface__["data"][0], self._ctx, rnd)
        return sel, int(self.state[0]), bool(self.state[1]), float(self.total[0])
