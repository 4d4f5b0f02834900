"""The llvm backend's thread pool: nth - 1 workers that wait for jobs in native code.

    pool = Pool(nth)
    pool.run(part, bufs, dims, lo, hi)      # graph_part(bufs, ith, nth, barrier, dims, lo, hi) on every thread
    pool.close()

A job is a compiled graph's graph_part (compile.py). Each worker is a Python thread that makes one
ctypes call, pool_worker, and stays in it (the GIL released) until the pool closes: it spins on
the job generation, SPIN_PAUSES pauses and then sched_yield between checks, and after
SPIN_YIELDS yields sleeps on it in the kernel (futex), so an idle model costs no CPU. pool_run
posts a job, runs thread 0's share on the calling thread and returns when every worker has
finished. (Python queues did the same with a thread wake-up and a GIL hand-off each way:
0.1-0.3 ms a call, 2-8% of a decode step.) The pool decides no bits: which thread runs a
kernel's share never changes its result.

The state, one cache line per field: the generation (i32: the futex word) at 0, the count of
workers done at 64, of workers asleep at 128, the job at 192 (graph_part's address, bufs,
nth, barrier, dims, lo, hi, stop).
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import i8p, i32, i64, intrinsic, new_function, void

SPIN_PAUSES = 100
SPIN_YIELDS = 20000                # then the futex: a few ms of sched_yield when the core is otherwise idle
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129      # x86-64 Linux
GEN, DONE, SLEEPERS, JOB = 0, 64, 128, 192
STATE_BYTES = 256
JOB_FIELDS = ("fn", "bufs", "nth", "barrier", "dims", "lo", "hi", "stop")

_PART = ir.FunctionType(void, [i8p.as_pointer(), i64, i64, i8p, i64.as_pointer(), i64, i64])


def _field(b: ir.IRBuilder, st, offset: int, t: ir.Type):
    return b.bitcast(b.gep(st, [i64(offset)]), t.as_pointer())


def _job(b: ir.IRBuilder, st, name: str):
    return _field(b, st, JOB + 8 * JOB_FIELDS.index(name), i64)


def _futex(b: ir.IRBuilder, m: ir.Module, word, op: int, val) -> None:
    syscall = m.globals.get("syscall") or ir.Function(m, ir.FunctionType(i64, [i64], var_arg=True), name="syscall")
    b.call(syscall, [i64(SYS_FUTEX), b.ptrtoint(word, i64), i64(op), val, i64(0)])


def _call_part(b: ir.IRBuilder, st, ith) -> None:
    """graph_part(bufs, ith, nth, barrier, dims, lo, hi) of the posted job."""
    get = lambda name: b.load(_job(b, st, name))       # noqa: E731
    fn = b.inttoptr(get("fn"), _PART.as_pointer())
    b.call(fn, [b.inttoptr(get("bufs"), i8p.as_pointer()), ith, get("nth"), b.inttoptr(get("barrier"), i8p),
                b.inttoptr(get("dims"), i64.as_pointer()), get("lo"), get("hi")])


def _spin(b: ir.IRBuilder, m: ir.Module, spins, yields: bool = True) -> ir.Value:
    """One step of a wait: a pause, or past SPIN_PAUSES steps a sched_yield; the new count."""
    n = b.add(b.load(spins), i64(1))
    b.store(n, spins)
    with b.if_else(b.icmp_signed("<", n, i64(SPIN_PAUSES))) as (then, other):
        with then:
            b.call(intrinsic(m, "llvm.x86.sse2.pause", void, []), [])
        with other:
            b.call(intrinsic(m, "sched_yield", i32, []), [])
    return n


def module() -> ir.Module:
    """pool_worker(state, ith), pool_run(state), pool_close(state)."""
    m = ir.Module(name="bankml_pool")
    # pool_worker: wait for a new generation, run the job, count it done; return on stop
    fn, b = new_function(m, "pool_worker", ir.FunctionType(void, [i8p, i64]))
    st, ith = fn.args
    gen, sleepers = _field(b, st, GEN, i32), _field(b, st, SLEEPERS, i32)
    seen, spins = b.alloca(i32, name="seen"), b.alloca(i64, name="spins")
    b.store(i32(0), seen)           # the state's first generation, not what gen holds when this thread
    #                                 starts: a job posted before the thread ran would be missed
    b.store(i64(0), spins)
    wait, idle, run, sleep, out = (fn.append_basic_block(s) for s in ("wait", "idle", "run", "sleep", "out"))
    b.branch(wait)
    b.position_at_end(wait)
    now = b.load_atomic(gen, "acquire", 4)
    b.cbranch(b.icmp_unsigned("!=", now, b.load(seen)), run, idle)
    b.position_at_end(idle)
    n = _spin(b, m, spins)
    b.cbranch(b.icmp_signed(">", n, i64(SPIN_PAUSES + SPIN_YIELDS)), sleep, wait)
    b.position_at_end(sleep)                # sleepers += 1 before the last look: pool_run reads it after its bump
    b.atomic_rmw("add", sleepers, i32(1), "seq_cst")
    with b.if_then(b.icmp_unsigned("==", b.load_atomic(gen, "seq_cst", 4), b.load(seen))):
        _futex(b, m, gen, FUTEX_WAIT_PRIVATE, b.zext(b.load(seen), i64))
    b.atomic_rmw("sub", sleepers, i32(1), "seq_cst")
    b.store(i64(0), spins)
    b.branch(wait)
    b.position_at_end(run)
    b.store(now, seen)
    b.store(i64(0), spins)
    with b.if_then(b.icmp_signed("!=", b.load(_job(b, st, "stop")), i64(0))):
        b.branch(out)
    _call_part(b, st, ith)
    b.atomic_rmw("add", _field(b, st, DONE, i64), i64(1), "release")
    b.branch(wait)
    b.position_at_end(out)
    b.ret_void()

    # pool_run: the job's fields are stored; bump the generation, wake sleepers, run share 0, wait
    fn, b = new_function(m, "pool_run", ir.FunctionType(void, [i8p]))
    st, = fn.args
    spins = b.alloca(i64, name="spins")
    gen, done = _field(b, st, GEN, i32), _field(b, st, DONE, i64)
    b.store_atomic(i64(0), done, "monotonic", 8)
    b.atomic_rmw("add", gen, i32(1), "seq_cst")
    with b.if_then(b.icmp_unsigned("!=", b.load_atomic(_field(b, st, SLEEPERS, i32), "seq_cst", 4), i32(0))):
        _futex(b, m, gen, FUTEX_WAKE_PRIVATE, i64(2 ** 31 - 1))
    _call_part(b, st, i64(0))
    b.store(i64(0), spins)
    others = b.sub(b.load(_job(b, st, "nth")), i64(1))
    wait, step, out = (fn.append_basic_block(s) for s in ("wait", "step", "out"))
    b.branch(wait)
    b.position_at_end(wait)
    b.cbranch(b.icmp_signed("==", b.load_atomic(done, "acquire", 8), others), out, step)
    b.position_at_end(step)
    _spin(b, m, spins)
    b.branch(wait)
    b.position_at_end(out)
    b.ret_void()

    # pool_close: stop set; every worker woken, it returns from pool_worker
    fn, b = new_function(m, "pool_close", ir.FunctionType(void, [i8p]))
    st, = fn.args
    b.store(i64(1), _job(b, st, "stop"))
    gen = _field(b, st, GEN, i32)
    b.atomic_rmw("add", gen, i32(1), "seq_cst")
    _futex(b, m, gen, FUTEX_WAKE_PRIVATE, i64(2 ** 31 - 1))
    b.ret_void()
    return m


class Pool:
    """nth - 1 worker threads in pool_worker; the caller of run is thread 0. A worker holds the
    engine and the state memory itself, so a pool dropped without close() (its model never
    closed) frees neither under a running worker: __del__ tells the workers to return."""

    def __init__(self, nth: int):
        self.nth = nth
        self.engine = jit.compile_module(module())
        c = ctypes
        addr = self.engine.get_function_address
        worker = c.CFUNCTYPE(None, c.c_void_p, c.c_int64)(addr("pool_worker"))
        self._run = c.CFUNCTYPE(None, c.c_void_p)(addr("pool_run"))
        self._close = c.CFUNCTYPE(None, c.c_void_p)(addr("pool_close"))
        self.memory = np.zeros(STATE_BYTES + 2 * 64 + 64, np.uint8)      # the state, then the barrier
        base = self.memory.ctypes.data
        self.state = base + (-base) % 64
        self.barrier = self.state + STATE_BYTES
        self.job = (ctypes.c_int64 * len(JOB_FIELDS)).from_address(self.state + JOB)
        self.lock = threading.Lock()
        self._last: tuple = (None, None)        # (part, bufs, their addresses) of the last job
        keep = (self.engine, self.memory)
        self.threads = [threading.Thread(target=_serve, args=(worker, self.state, k, keep), daemon=True,
                                         name=f"bankml-llvm-{k}") for k in range(1, nth)]
        for t in self.threads:
            t.start()

    def run(self, part, bufs, dims: int, lo: int, hi: int) -> None:
        """part(bufs, ith, nth, barrier, dims, lo, hi) on every thread; returns when all are done."""
        with self.lock:
            if not self.threads:
                raise RuntimeError("the thread pool is closed")
            if self._last[:2] != (part, bufs):      # a decode posts the same graph and table each token
                self._last = (part, bufs, ctypes.cast(part, ctypes.c_void_p).value, ctypes.addressof(bufs))
            self.job[:] = [self._last[2], self._last[3], self.nth, self.barrier, dims, lo, hi, 0]
            self._run(self.state)

    def close(self) -> None:
        """Stop the workers and wait for them."""
        with self.lock:
            threads, self.threads = self.threads, []
            if threads:
                self._close(self.state)
            for t in threads:
                t.join()

    def __del__(self) -> None:
        if getattr(self, "threads", None):
            self._close(self.state)             # the workers return; no join in a finalizer


def _serve(worker, state: int, ith: int, keep: tuple) -> None:
    """A worker thread: in pool_worker until the pool closes; `keep` (the engine, the state's
    memory) lives as long as this frame does."""
    worker(state, ith)
