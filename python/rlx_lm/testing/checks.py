"""The machinery clauses are written with: failures that name the call, row comparisons, and
the context that builds runners and runs a property over hypothesis examples.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rlx_lm.host_driven import HostDriven
from rlx_lm.runner import with_defaults
from rlx_lm.testing.capabilities import Capabilities, Factory
from rlx_lm.testing.options import CheckOptions
from rlx_lm.testing.report import format_error

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "ClauseContext",
    "ClauseFailure",
    "ClauseSkip",
    "as_row",
    "as_tokens",
    "assert_close",
    "call",
    "show_tokens",
]


class ClauseFailure(Exception):
    """A clause was broken: what was expected, what came back, and the shrunk example."""

    def __init__(self, message: str, example: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.example = example


class ClauseSkip(Exception):
    """A clause does not apply to this runner; the message says why."""


def call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a runner member; any exception becomes a failure that names the call."""
    try:
        return fn(*args)
    except Exception as exc:
        raise ClauseFailure(f"{what} raised {format_error(exc)}") from exc


def show_tokens(tokens: Sequence[int]) -> str:
    """Tokens as a list literal, for messages."""
    return repr(list(tokens))


def as_row(out: object, what: str) -> npt.NDArray[np.float64]:
    """A private float64 copy of a returned logits row (copied, so later calls cannot alter it)."""
    try:
        arr = np.array(out, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ClauseFailure(
            f"{what} returned {type(out).__name__}, which does not convert to a row of "
            f"floats: {exc}"
        ) from exc
    if arr.ndim != 1:
        raise ClauseFailure(f"{what} returned an array of shape {arr.shape}; expected a 1-D row")
    return arr


def assert_close(
    got: npt.NDArray[np.float64],
    want: npt.NDArray[np.float64],
    got_what: str,
    want_what: str,
    opts: CheckOptions,
) -> None:
    """Fail unless the rows agree within the options' ``atol``/``rtol``, naming the worst index."""
    if got.shape != want.shape:
        raise ClauseFailure(f"{got_what} has {got.size} values but {want_what} has {want.size}")
    # NaN against NaN counts as agreement here: logits.row is the clause that reports NaN.
    close = np.isclose(got, want, rtol=opts.rtol, atol=opts.atol, equal_nan=True)
    if close.all():
        return
    with np.errstate(invalid="ignore"):
        diff = np.where(close, 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    i = int(np.argmax(diff))
    raise ClauseFailure(
        f"{got_what} differs from {want_what} at {int((~close).sum())} of {got.size} "
        f"positions; worst at index {i}: got {got[i]:.7g}, expected {want[i]:.7g} "
        f"(atol={opts.atol:g}, rtol={opts.rtol:g})"
    )


def as_tokens(out: object, what: str, vocab: int) -> list[int]:
    """``out`` as a list of token ids inside the vocabulary, or a failure saying why not."""
    try:
        tokens = [operator.index(t) for t in out]  # type: ignore[attr-defined]
    except TypeError as exc:
        raise ClauseFailure(f"{what} returned {out!r}; expected a list of int token ids") from exc
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        raise ClauseFailure(
            f"{what} returned tokens {outside} outside the vocabulary 0..{vocab - 1}"
        )
    return tokens


# -- running a property with hypothesis ---------------------------------------------


class ClauseContext:
    """What a clause works with: the factory, the options and the probed capabilities."""

    def __init__(self, factory: Factory, opts: CheckOptions, caps: Capabilities) -> None:
        self.factory = factory
        self.opts = opts
        self.caps = caps

    @property
    def vocab(self) -> int:
        """The runner's vocabulary size."""
        return self.caps.vocab

    def fresh(self) -> Any:
        """A new runner from the factory; a factory error is a failure."""
        try:
            return self.factory()
        except Exception as exc:
            raise ClauseFailure(f"factory() raised {format_error(exc)}") from exc

    def generator(self, runner: Any) -> Any:
        """The runner if it has its own generate, else rlx_lm's defaults adapter around it."""
        return runner if self.caps.own_generate else with_defaults(runner)

    def pair(self, runner: Any) -> Any:
        """The runner if it has a working prefill/decode pair, else `HostDriven` around it."""
        return runner if self.caps.own_pair else HostDriven(runner)

    def tokens(self, min_size: int, max_size: int) -> SearchStrategy[list[int]]:
        """Token lists of ``min_size`` to ``max_size`` ids from the vocabulary."""
        from hypothesis import strategies as st

        return st.lists(st.integers(0, self.vocab - 1), min_size=min_size, max_size=max_size)

    def prompts(self) -> SearchStrategy[list[int]]:
        """Non-empty prompts up to the options' ``max_prompt_len``."""
        return self.tokens(1, self.opts.max_prompt_len)

    def for_all(
        self,
        strategy: SearchStrategy[dict[str, Any]],
        body: Callable[[dict[str, Any]], None],
    ) -> None:
        """Run ``body`` on examples of ``strategy``; raise `ClauseFailure` with the shrunk one."""
        import hypothesis
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis.errors import Flaky

        last: list[tuple[dict[str, Any], str]] = []

        @settings(
            max_examples=self.opts.max_examples,
            deadline=None,
            database=None,
            derandomize=False,
            report_multiple_bugs=False,
            verbosity=Verbosity.quiet,
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def prop(example: dict[str, Any]) -> None:
            shown = {k: (list(v) if isinstance(v, list) else v) for k, v in example.items()}
            try:
                body(example)
            except ClauseFailure as exc:
                last[:] = [(shown, exc.message)]
                raise
            except Exception as exc:
                last[:] = [(shown, f"raised {format_error(exc)}")]
                raise

        if self.opts.seed is not None:
            prop = hypothesis.seed(self.opts.seed)(prop)
        try:
            prop()
        except Exception as exc:
            if not last:
                raise ClauseFailure(
                    f"hypothesis could not run this clause: {format_error(exc)}"
                ) from exc
            example, message = last[0]
            if isinstance(exc, Flaky):
                message += (
                    "\n(the failure did not reproduce when the example was replayed: the "
                    "runner's results are not a function of its inputs)"
                )
            raise ClauseFailure(message, example) from exc
