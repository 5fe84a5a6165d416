"""A real uvicorn on 127.0.0.1 on a free port, in a thread, for the server's tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import uvicorn

from rlx_lm.session import SessionSnapshot


class LiveServer:
    """A server running ``app``; ``url`` is its base address."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        # Keep-alive well past any pause in a test: with uvicorn's default 5 s,
        # a loaded machine lets pooled connections idle out, and a request sent
        # on one just as the server closes it fails with a read error (a race
        # every HTTP client has; the OpenAI client retries it, raw httpx not).
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=300,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@contextmanager
def live_server(app: Any) -> Iterator[LiveServer]:
    """Start ``app`` under uvicorn on a free loopback port; stop it afterwards."""
    server = LiveServer(app).start()
    try:
        yield server
    finally:
        server.stop()


class FaultyRunner:
    """Forwards to a real runner, but fails on purpose.

    * a prompt containing ``poison_prompt`` makes ``prefill_logits`` raise;
    * decoding ``poison_token`` raises (reach it with ``logit_bias``).
    """

    def __init__(self, inner: Any, poison_prompt: int, poison_token: int) -> None:
        self.inner = inner
        self.poison_prompt = poison_prompt
        self.poison_token = poison_token
        self.family = inner.family
        self.vocab_size = inner.vocab_size
        self.max_seq = inner.max_seq

    def predict_logits(self, ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        return self.inner.predict_logits(ids)  # type: ignore[no-any-return]

    def _check(self, ids: Sequence[int]) -> None:
        if self.poison_prompt in [int(t) for t in ids]:
            raise RuntimeError("injected prefill failure")

    def prefill_logits(self, ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        self._check(ids)
        return self.inner.prefill_logits(ids)  # type: ignore[no-any-return]

    def prefill_logits_reusing(
        self, ids: Sequence[int], snap: SessionSnapshot, reuse: int, /
    ) -> npt.NDArray[np.float32]:
        self._check(ids)
        return self.inner.prefill_logits_reusing(ids, snap, reuse)  # type: ignore[no-any-return]

    def decode_logits(self, token: int, /) -> npt.NDArray[np.float32]:
        if int(token) == self.poison_token:
            raise RuntimeError("injected decode failure")
        return self.inner.decode_logits(token)  # type: ignore[no-any-return]

    def export_session(self) -> SessionSnapshot:
        return self.inner.export_session()  # type: ignore[no-any-return]

    def restore_session(self, snap: SessionSnapshot, /) -> bool:
        return bool(self.inner.restore_session(snap))


class SlowSteps:
    """The runner, ``delay`` seconds slower per decode step.

    The Rust engine finishes a few hundred tokens of the bundled model in well under a
    second, so a test that must act while a request is still running (cancel it, close
    the scheduler, drop the client) slows the steps down instead of racing the engine.
    """

    def __init__(self, inner: Any, delay: float = 0.01) -> None:
        self._inner = inner
        self._delay = delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def decode_batch(self, sessions: Any, tokens: Any) -> Any:
        time.sleep(self._delay)
        return self._inner.decode_batch(sessions, tokens)
