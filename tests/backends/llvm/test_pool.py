"""The native thread pool (bankml/backends/llvm/pool.py): every thread runs every job once with its
own ith, jobs after the workers fell asleep still run, an idle pool burns no CPU, close() returns."""
import ctypes
import gc
import threading
import time

import numpy as np
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.emit.core import i8p, i64, new_function, void
from bankml.backends.llvm.pool import SPIN_YIELDS, Pool

PART = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_int64, ctypes.c_int64)


def _counting_part():
    """A graph_part stand-in: out = (i64*) bufs[0]; out[ith] += 1, out[8 + ith] = nth,
    out[16 + ith] = hi - lo, out[24 + ith] = dims[0]."""
    m = ir.Module(name="pool_test")
    fn, b = new_function(m, "part", ir.FunctionType(void, [i8p.as_pointer(), i64, i64, i8p, i64.as_pointer(), i64, i64]))
    bufs, ith, nth, _, dims, lo, hi = fn.args
    out = b.bitcast(b.load(bufs), i64.as_pointer())
    at = lambda k: b.gep(out, [b.add(ith, i64(k))])      # noqa: E731
    b.store(b.add(b.load(at(0)), i64(1)), at(0))
    b.store(nth, at(8))
    b.store(b.sub(hi, lo), at(16))
    b.store(b.load(dims), at(24))
    b.ret_void()
    eng = jit.compile_module(m)
    return eng, PART(eng.get_function_address("part"))


def _job(out: np.ndarray, dims: np.ndarray):
    table = (ctypes.c_void_p * 1)(out.ctypes.data)
    return table, dims.ctypes.data


def test_every_thread_runs_every_job_with_its_ith():
    eng, part = _counting_part()
    out, dims = np.zeros(32, np.int64), np.array([7], np.int64)
    table, dp = _job(out, dims)
    pool = Pool(3)
    try:
        for k in range(2000):
            pool.run(part, table, dp, k, 2 * k + 5)
            assert out[0] == out[1] == out[2] == k + 1          # the job was over when run returned
        assert list(out[8:11]) == [3, 3, 3] and list(out[16:19]) == [2004] * 3 and list(out[24:27]) == [7] * 3
        assert not out[3:8].any()
    finally:
        pool.close()
    assert all(not t.is_alive() for t in pool.threads) and pool.threads == []


def test_workers_sleep_when_idle_and_wake_for_the_next_job():
    eng, part = _counting_part()
    out, dims = np.zeros(32, np.int64), np.zeros(1, np.int64)
    table, dp = _job(out, dims)
    pool = Pool(2)
    try:
        pool.run(part, table, dp, 0, 1)
        time.sleep(0.5 + SPIN_YIELDS * 20e-6)        # past the spin phase: the worker is in the futex
        t0 = time.process_time()
        time.sleep(0.3)
        idle_cpu = time.process_time() - t0
        assert idle_cpu < 0.05, f"an idle pool used {idle_cpu:.3f} s of CPU in 0.3 s"
        pool.run(part, table, dp, 0, 1)
        assert out[0] == out[1] == 2
    finally:
        pool.close()


def test_close_wakes_sleeping_workers():
    pool = Pool(4)
    time.sleep(0.5 + SPIN_YIELDS * 20e-6)
    t0 = time.perf_counter()
    pool.close()
    assert time.perf_counter() - t0 < 5 and pool.threads == []


def test_a_pool_dropped_without_close_stops_its_workers():
    """A model never closed drops its backend's pool: the workers return, nothing is freed
    under them (they hold the engine and the state themselves)."""
    eng, part = _counting_part()
    out, dims = np.zeros(32, np.int64), np.zeros(1, np.int64)
    table, dp = _job(out, dims)
    pool = Pool(3)
    pool.run(part, table, dp, 0, 1)
    threads = list(pool.threads)
    del pool
    gc.collect()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads) and list(out[:3]) == [1, 1, 1]


def test_a_job_posted_before_the_workers_start_still_runs(monkeypatch):
    """Workers that start after the first job was posted run it (they wait from the state's
    first generation, not from the one they find when they start)."""
    eng, part = _counting_part()
    out, dims = np.zeros(32, np.int64), np.zeros(1, np.int64)
    table, dp = _job(out, dims)
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda t: real_start(threading.Timer(0.3, real_start, (t,))))
    pool = Pool(3)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    poster = threading.Thread(target=pool.run, args=(part, table, dp, 0, 1), daemon=True)
    poster.start()
    poster.join(timeout=20)
    assert not poster.is_alive(), "the job posted before the workers started never finished"
    assert list(out[:3]) == [1, 1, 1]
    pool.close()
