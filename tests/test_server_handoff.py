"""The hand-over of events from the scheduler thread to the event loop (`_Outbox`)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from rlx_lm.server.app import _Outbox

T = TypeVar("T")


def _on_uvloop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` run on a uvloop loop, the one `rlx-lm serve` runs on (uvicorn's "auto")."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


LOOPS: dict[str, Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]] = {
    "asyncio": lambda main: asyncio.run(main()),
    "uvloop": _on_uvloop,
}


@pytest.mark.parametrize("loop_kind", list(LOOPS))
def test_a_burst_of_events_wakes_the_loop_once_and_keeps_their_order(loop_kind: str) -> None:
    async def main() -> tuple[int, list[list[int]]]:
        loop = asyncio.get_running_loop()
        box = _Outbox(loop)
        queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in range(8)]

        def step(k: int) -> None:  # one step's events, one per running sequence
            for i in range(8):
                box.put(queues[i], 8 * k + i)
            box.flush()

        t = threading.Thread(target=step, args=(0,))
        t.start()
        t.join()
        assert box.wakes == 1  # eight events, one wake-up
        first = [await q.get() for q in queues]
        for k in range(1, 50):  # a step whose wake-up is still pending adds none
            step(k)
            await asyncio.sleep(0)
        got = [[first[i]] + [await q.get() for _ in range(49)] for i, q in enumerate(queues)]
        box.close()
        return box.wakes, got

    wakes, got = LOOPS[loop_kind](main)
    assert 2 <= wakes <= 50
    assert got == [list(range(k, 400, 8)) for k in range(8)]


def test_the_loop_is_woken_from_the_outboxs_thread_once_the_gil_is_let_go() -> None:
    # ~20 ms of spinning. The flushing thread keeps the GIL (a switch interval of 5 s
    # forces no hand-over): the drain must wait for it to let go, and the loop's
    # wake-up is asked for by the outbox's own thread, so no socket write (which
    # releases the GIL) happens on the flushing thread.
    seen: list[bool] = []
    wakers: list[str] = []
    state = {"spinning": True}

    class Probe(_Outbox):
        __slots__ = ()

        def _drain(self) -> None:
            seen.append(state["spinning"])
            super()._drain()

    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:

        async def main() -> list[int]:
            loop = asyncio.get_running_loop()
            wake = loop.call_soon_threadsafe

            def recording(*args: Any) -> Any:
                wakers.append(threading.current_thread().name)
                return wake(*args)

            loop.call_soon_threadsafe = recording  # type: ignore[method-assign]
            box = Probe(loop)
            q: asyncio.Queue[int] = asyncio.Queue()

            def flusher() -> None:
                box.put(q, 1)
                box.flush()
                x = 0
                for i in range(400_000):  # pure bytecode: the GIL stays here
                    x += i
                state["spinning"] = False

            t = threading.Thread(target=flusher, name="flusher")
            t.start()
            got = [await asyncio.wait_for(q.get(), 30)]
            t.join()
            box.close()
            return got

        assert asyncio.run(main()) == [1]
    finally:
        sys.setswitchinterval(old)
    assert seen == [False]
    assert wakers == ["rlx-lm-outbox"]


def test_puts_without_a_flush_do_not_wake_the_loop() -> None:
    async def main() -> int:
        box = _Outbox(asyncio.get_running_loop())
        q: asyncio.Queue[int] = asyncio.Queue()
        for i in range(5):
            box.put(q, i)
        await asyncio.sleep(0.01)
        assert q.empty()
        box.flush()
        box.flush()  # a wake-up is pending: no second one
        assert [await q.get() for _ in range(5)] == list(range(5))
        box.close()
        return box.wakes

    assert asyncio.run(main()) == 1


def test_events_put_while_the_loop_drains_are_never_left_behind() -> None:
    # ~0.3 s: a producer racing the loop's drains
    async def main() -> tuple[int, list[int]]:
        loop = asyncio.get_running_loop()
        box = _Outbox(loop)
        q: asyncio.Queue[int] = asyncio.Queue()

        def produce() -> None:
            for i in range(3000):
                box.put(q, i)
                if i % 3 == 0:
                    box.flush()
                if i % 7 == 0:
                    time.sleep(0)  # let the loop run a drain in between
            box.flush()

        t = threading.Thread(target=produce)
        t.start()
        got = [await asyncio.wait_for(q.get(), 10) for _ in range(3000)]
        t.join()
        box.close()
        return box.wakes, got

    wakes, got = asyncio.run(main())
    assert got == list(range(3000))
    assert 1 <= wakes <= 3000


def test_a_closed_loop_does_not_break_the_putter() -> None:
    loop = asyncio.new_event_loop()
    box = _Outbox(loop)
    loop.close()
    q: asyncio.Queue[int] = asyncio.Queue()
    box.put(q, 1)
    box.flush()  # the outbox's thread meets the RuntimeError, not the scheduler's
    deadline = time.monotonic() + 10
    while not box._closed and time.monotonic() < deadline:
        time.sleep(0.001)
    assert box._closed
    box.put(q, 2)
    box.flush()  # a closed outbox wakes nobody
    assert box.wakes == 1


def test_the_server_extra_runs_uvicorn_on_uvloop_and_httptools() -> None:
    """The server extra brings uvloop and httptools, and uvicorn picks both by itself
    ("auto"). Measured with ``benches/bench_server.py --overhead``: the event loop's CPU
    per streamed token 125-155 us against 196-224 us on asyncio and h11."""
    import importlib.metadata
    import re

    extra = {
        re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower()
        for r in importlib.metadata.requires("rlx-lm") or []
        if re.search(r"extra\s*==\s*['\"]server['\"]", r)
    }
    assert {"starlette", "uvicorn", "uvloop", "httptools"} <= extra, extra
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("uvloop")

    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
        pass

    config = uvicorn.Config(app)
    config.load()
    assert config.http_protocol_class.__module__.endswith("httptools_impl")
    if hasattr(config, "get_loop_factory"):  # uvicorn >= 0.36
        loop = config.get_loop_factory()()
    else:  # uvicorn < 0.36 sets the policy
        config.setup_event_loop()
        loop = asyncio.new_event_loop()
    try:
        assert type(loop).__module__.startswith("uvloop"), type(loop)
    finally:
        loop.close()
        asyncio.set_event_loop_policy(None)
