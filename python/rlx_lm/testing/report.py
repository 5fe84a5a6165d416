"""The outcome of a conformance run: one result per clause, and the report that lists them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ClauseResult", "ConformanceError", "Report", "Status", "format_error", "format_example"]

Status = Literal["pass", "fail", "skip"]
"""How a clause ended: it held, it was broken, or it did not apply to this runner."""


class ConformanceError(AssertionError):
    """A runner broke one or more conformance clauses; the message lists them."""


def format_error(exc: BaseException) -> str:
    """An exception as ``Type: message`` (just ``Type`` when the message is empty)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def format_example(example: Mapping[str, object]) -> str:
    """Render a falsifying example as ``name=value`` pairs a reader can paste into a call."""
    return ", ".join(f"{name}={value!r}" for name, value in example.items())


@dataclass(frozen=True)
class ClauseResult:
    """One clause's verdict, with what was expected and what came back when it failed."""

    clause: str
    status: Status
    message: str = ""
    example: Mapping[str, object] | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Whether the clause held."""
        return self.status == "pass"

    @property
    def failed(self) -> bool:
        """Whether the clause was broken."""
        return self.status == "fail"

    @property
    def skipped(self) -> bool:
        """Whether the clause did not apply (the message says why)."""
        return self.status == "skip"

    def describe(self) -> str:
        """The message, followed by the shrunk falsifying example when there is one."""
        lines = [self.message] if self.message else []
        if self.example is not None:
            lines.append(f"falsifying example: {format_example(self.example)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Report:
    """Every clause's result for one runner, in the order the clauses ran."""

    target: str
    results: tuple[ClauseResult, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[ClauseResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, clause: str) -> ClauseResult:
        for result in self.results:
            if result.clause == clause:
                return result
        raise KeyError(f"no clause {clause!r} in this report; it has {self.clauses()}")

    def clauses(self) -> list[str]:
        """Names of the clauses that ran."""
        return [r.clause for r in self.results]

    @property
    def failures(self) -> tuple[ClauseResult, ...]:
        """The clauses that were broken."""
        return tuple(r for r in self.results if r.failed)

    @property
    def passes(self) -> tuple[ClauseResult, ...]:
        """The clauses that held."""
        return tuple(r for r in self.results if r.passed)

    @property
    def skips(self) -> tuple[ClauseResult, ...]:
        """The clauses that did not apply."""
        return tuple(r for r in self.results if r.skipped)

    @property
    def failed_clauses(self) -> frozenset[str]:
        """Names of the broken clauses."""
        return frozenset(r.clause for r in self.failures)

    @property
    def ok(self) -> bool:
        """True when no clause failed (skips do not count against a runner)."""
        return not self.failures

    def summary(self) -> str:
        """One line: how many clauses passed, failed and were skipped."""
        return f"{len(self.passes)} passed, {len(self.failures)} failed, {len(self.skips)} skipped"

    def format(self, *, verbose: bool = True) -> str:
        """The report as text: a line per clause, failure details indented under it."""
        width = max((len(r.clause) for r in self.results), default=0)
        lines = [f"rlx-lm conformance: {self.target}"]
        for r in self.results:
            head = f"  {r.status.upper():<4}  {r.clause:<{width}}"
            if r.skipped or (r.passed and r.message):
                head += f"  ({r.message})" if verbose else ""
                lines.append(head.rstrip())
                continue
            lines.append(head.rstrip())
            if r.failed:
                lines.extend(f"        {line}" for line in r.describe().splitlines())
        lines.append(self.summary())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def raise_for_failures(self) -> None:
        """Raise `ConformanceError` listing every failed clause; return quietly otherwise."""
        if self.ok:
            return
        parts = [f"{len(self.failures)} conformance clause(s) failed for {self.target}:"]
        for r in self.failures:
            parts.append(f"- {r.clause}:")
            parts.extend(f"    {line}" for line in r.describe().splitlines())
        raise ConformanceError("\n".join(parts))
