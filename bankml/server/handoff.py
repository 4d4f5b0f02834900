"""Calls from the slots' worker threads to the event loop, through one thread of their own.

    h = Handoff()
    h.put(loop, queue.put_nowait, ("text", "Hello"))    # from any thread: fn(*args) on loop, in order
    h.close()

A worker that calls loop.call_soon_threadsafe itself wakes the loop while it still has Python to
run before its next decode: the loop takes the GIL at once (the self-pipe write lets it go) and
the worker waits for the loop to write the token's chunk, every token (a 0.5 ms gap between two
SmolLM2 decodes, against 0.1 ms this way). Here a worker only puts the call in a queue, which
wakes this thread and nobody else; this thread gets the GIL when the worker next lets it go (in
the decode's kernels), and wakes the loop then, so the loop writes the chunk while the kernels
run, on a core the kernels leave free. Calls waiting together reach their loop in one wake-up.
"""
from __future__ import annotations

import asyncio
import queue
import threading

_STOP = object()


class Handoff:
    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="bankml-handoff")
        self._thread.start()

    def put(self, loop: asyncio.AbstractEventLoop, fn, *args) -> None:
        """fn(*args) on loop, after every call put before it."""
        self._calls.put((loop, fn, args))

    def close(self) -> None:
        """The calls put so far still reach their loops; then the thread ends."""
        self._calls.put(_STOP)

    def _serve(self) -> None:
        while True:
            batch = [self._calls.get()]
            while True:
                try:
                    batch.append(self._calls.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            if stop:
                batch = batch[:batch.index(_STOP)]
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            for loop, fn, args in batch:
                by_loop.setdefault(loop, []).append((fn, args))
            for loop, calls in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_run, calls)
                except RuntimeError:            # that loop is closed: nobody is left to hear
                    pass
            if stop:
                return


def _run(calls: list) -> None:
    for fn, args in calls:
        fn(*args)
