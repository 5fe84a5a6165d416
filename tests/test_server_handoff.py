"""The hand-over of events from the scheduler thread to the event loop (`_Outbox`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rlx_lm.server.app import _Outbox


def test_a_burst_of_events_wakes_the_loop_once_and_keeps_their_order() -> None:
    async def main() -> tuple[int, list[list[int]]]:
        loop = asyncio.get_running_loop()
        box = _Outbox(loop)
        queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in range(8)]

        def burst() -> None:  # one step's events: one per running sequence, many steps
            for i in range(400):
                box.put(queues[i % 8], i)

        t = threading.Thread(target=burst)
        t.start()
        t.join()  # the loop is not running meanwhile: every put finds the wake pending
        got = [[await q.get() for _ in range(50)] for q in queues]
        return box.wakes, got

    wakes, got = asyncio.run(main())
    assert wakes == 1
    assert got == [list(range(k, 400, 8)) for k in range(8)]


def test_events_put_while_the_loop_drains_are_never_left_behind() -> None:
    # ~0.3 s: a producer racing the loop's drains
    async def main() -> tuple[int, list[int]]:
        loop = asyncio.get_running_loop()
        box = _Outbox(loop)
        q: asyncio.Queue[int] = asyncio.Queue()

        def produce() -> None:
            for i in range(3000):
                box.put(q, i)
                if i % 7 == 0:
                    time.sleep(0)  # let the loop run a drain in between

        t = threading.Thread(target=produce)
        t.start()
        got = [await asyncio.wait_for(q.get(), 10) for _ in range(3000)]
        t.join()
        return box.wakes, got

    wakes, got = asyncio.run(main())
    assert got == list(range(3000))
    assert 1 <= wakes <= 3000


def test_a_closed_loop_does_not_break_the_putter() -> None:
    loop = asyncio.new_event_loop()
    box = _Outbox(loop)
    loop.close()
    q: asyncio.Queue[int] = asyncio.Queue()
    box.put(q, 1)  # no RuntimeError reaches the scheduler thread
    box.put(q, 2)
    assert box.wakes == 2  # each put tried to wake it, none is left pending
