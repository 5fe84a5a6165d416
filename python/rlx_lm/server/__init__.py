"""An OpenAI-compatible server with continuous batching and a shared prefix cache.

Needs the ``server`` extra (``pip install 'rlx-lm[server]'``: Starlette and uvicorn).

* `create_app` (``rlx_lm.server.app``): ``create_app(runner, tokenizer, config=...)`` is
  an ASGI app with ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
  ``/health`` and ``/metrics``; host it with uvicorn, Ray Serve or any ASGI server.
* `BatchScheduler` (``rlx_lm.server.scheduler``): the continuous-batching loop on its
  own thread, usable without HTTP (``submit`` with a sink, or blocking ``generate``).
* `ServerConfig` (``rlx_lm.server.config``): the limits.
* ``rlx_lm.server.protocol``: the request fields accepted and how they map to
  `SampleOpts`; ``rlx_lm.server.metrics``: the Prometheus names.
* `serve`: build the app and run it under uvicorn (what ``rlx-lm serve`` does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlx_lm.server.config import ServerConfig
from rlx_lm.server.metrics import ServerMetrics
from rlx_lm.server.scheduler import (
    BatchScheduler,
    Chunk,
    Completion,
    Finish,
    GenerationRequest,
    QueueFullError,
    RequestHandle,
    ShuttingDownError,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from rlx_lm.runner import LmCore
    from rlx_lm.tokenizer import Tokenizer

__all__ = [
    "BatchScheduler",
    "Chunk",
    "Completion",
    "Finish",
    "GenerationRequest",
    "QueueFullError",
    "RequestHandle",
    "ServerConfig",
    "ServerMetrics",
    "ShuttingDownError",
    "create_app",
    "serve",
]


def create_app(
    runner: LmCore,
    tokenizer: Tokenizer,
    *,
    config: ServerConfig | None = None,
    scheduler: BatchScheduler | None = None,
    stop_token_ids: tuple[int, ...] | None = None,
) -> Starlette:
    """The OpenAI-compatible ASGI app over ``runner`` (see `rlx_lm.server.app.create_app`)."""
    from rlx_lm.server.app import create_app as _create

    return _create(
        runner, tokenizer, config=config, scheduler=scheduler, stop_token_ids=stop_token_ids
    )


def serve(
    runner: LmCore,
    tokenizer: Tokenizer,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    config: ServerConfig | None = None,
    log_level: str = "info",
    **uvicorn_options: Any,
) -> None:
    """Serve ``runner`` on ``host:port`` with uvicorn until interrupted (Ctrl-C, SIGTERM).

    On shutdown uvicorn stops accepting connections, lets open requests finish for
    ``config.shutdown_timeout`` seconds, then the scheduler cancels what is left.
    """
    import uvicorn

    config = config if config is not None else ServerConfig()
    app = create_app(runner, tokenizer, config=config)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, int(config.shutdown_timeout)),
        **uvicorn_options,
    )
