"""The workers' calls to the event loop (bankml/server/handoff.py): all of them, in order, on their loop."""
from __future__ import annotations

import asyncio
import threading

from bankml.server.handoff import Handoff


def test_calls_from_many_threads_reach_the_loop_in_each_threads_order():
    async def main():
        loop, got, done = asyncio.get_running_loop(), [], asyncio.Event()
        h = Handoff()

        def worker(k):
            for i in range(300):
                h.put(loop, got.append, (k, i))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        h.put(loop, done.set)
        await asyncio.wait_for(done.wait(), 10)
        h.close()
        return got
    got = asyncio.run(main())
    assert len(got) == 900
    for k in range(3):
        assert [i for kk, i in got if kk == k] == list(range(300))


def test_a_closed_loop_does_not_stop_the_others():
    old = asyncio.new_event_loop()
    old.close()
    h = Handoff()

    async def main():
        loop, done = asyncio.get_running_loop(), asyncio.Event()
        h.put(old, print, "never")          # its loop is gone: dropped
        h.put(loop, done.set)
        await asyncio.wait_for(done.wait(), 10)
    asyncio.run(main())
    h.close()
