"""Load progress: a per-thread callback any family's loader reports to.

`load_progress` lets a caller that builds through `LmRunnerBuilder` (which
takes no callback) follow a load; a loader reads the callback in force with
`current_load_progress` and calls it with ``(done, total)``. The setting is a
context variable, so it is per thread and per asyncio task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["ProgressCallback", "current_load_progress", "load_progress"]

ProgressCallback = Callable[[int, int], None]
"""Called with ``(done, total)`` as work advances."""

_LOAD_PROGRESS: ContextVar[ProgressCallback | None] = ContextVar(
    "rlx_lm_load_progress", default=None
)


@contextmanager
def load_progress(callback: ProgressCallback | None) -> Iterator[None]:
    """Within this block, loads report ``(done, total)`` to ``callback``."""
    token = _LOAD_PROGRESS.set(callback)
    try:
        yield
    finally:
        _LOAD_PROGRESS.reset(token)


def current_load_progress() -> ProgressCallback | None:
    """The callback of the innermost enclosing `load_progress` block, or None."""
    return _LOAD_PROGRESS.get()
