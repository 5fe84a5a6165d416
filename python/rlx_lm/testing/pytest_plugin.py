"""pytest plugin: ``pytest --rlx-runner=pkg.module:factory`` runs each conformance clause as a test.

Registered through the ``pytest11`` entry point, so it is active wherever rlx-lm is
installed; without ``--rlx-runner`` it adds nothing and imports nothing heavy. The items
are named ``rlx-conformance[<spec>]::<clause>``, so ``-k`` selects clauses and a CI log
shows which clause broke. ``-p no:rlx_lm`` turns the plugin off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rlx_lm.testing.capabilities import Factory
    from rlx_lm.testing.options import CheckOptions
    from rlx_lm.testing.report import ClauseResult

__all__ = ["ClauseFailed", "ClauseItem", "RunnerCollector"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``--rlx-*`` options."""
    group = parser.getgroup("rlx-lm", "rlx-lm runner conformance")
    group.addoption(
        "--rlx-runner",
        action="append",
        default=[],
        metavar="PKG.MODULE:FACTORY",
        help="check runners built by this factory against every conformance clause (repeatable)",
    )
    group.addoption("--rlx-max-examples", type=int, default=None, help="examples per clause")
    group.addoption("--rlx-atol", type=float, default=None, help="absolute logits tolerance")
    group.addoption("--rlx-rtol", type=float, default=None, help="relative logits tolerance")
    group.addoption(
        "--rlx-seed", default="0", help="hypothesis seed: an int, or 'random' for new examples"
    )


def _options(config: pytest.Config) -> CheckOptions:
    from rlx_lm.errors import InvalidOptionError
    from rlx_lm.testing.options import CheckOptions

    kw: dict[str, Any] = {}
    for option, field in (
        ("rlx_max_examples", "max_examples"),
        ("rlx_atol", "atol"),
        ("rlx_rtol", "rtol"),
    ):
        value = config.getoption(option)
        if value is not None:
            kw[field] = value
    seed = config.getoption("rlx_seed")
    try:
        kw["seed"] = None if seed == "random" else int(seed)
        return CheckOptions(**kw)
    except (ValueError, InvalidOptionError) as exc:
        raise pytest.UsageError(f"--rlx-* options: {exc}") from exc


class ClauseFailed(AssertionError):
    """Raised by a `ClauseItem` whose clause failed; carries the clause's result."""

    def __init__(self, result: ClauseResult) -> None:
        super().__init__(result.describe())
        self.result = result


class ClauseItem(pytest.Item):
    """One conformance clause run against one runner factory."""

    def __init__(
        self, *, factory: Factory, clause: str, options: CheckOptions, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.factory = factory
        self.clause = clause
        self.options = options

    def runtest(self) -> None:
        """Run the clause; skip or fail the item as the clause did."""
        from rlx_lm.testing.conformance import run_clause

        result = run_clause(self.clause, self.factory, self.options)
        if result.skipped:
            pytest.skip(result.message)
        if result.failed:
            raise ClauseFailed(result)
        if result.message:
            self.user_properties.append(("note", result.message))

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: Any = None,
    ) -> str:
        """The clause's message and falsifying example, without a traceback into the kit."""
        if isinstance(excinfo.value, ClauseFailed):
            return f"conformance clause {self.clause} failed:\n{excinfo.value}"
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        """Where the item comes from, for pytest's report headers."""
        return self.path, None, f"{self.parent.name if self.parent else ''}::{self.clause}"


class RunnerCollector(pytest.Collector):
    """The clauses for one ``--rlx-runner`` spec."""

    def __init__(self, *, spec: str, options: CheckOptions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.options = options

    def collect(self) -> list[pytest.Item | pytest.Collector]:
        """One `ClauseItem` per clause."""
        from rlx_lm.errors import InvalidOptionError
        from rlx_lm.testing.clauses import clause_names
        from rlx_lm.testing.cli import load_factory
        from rlx_lm.testing.options import require_hypothesis

        try:
            require_hypothesis()
            factory = load_factory(self.spec)
        except (ImportError, InvalidOptionError) as exc:
            raise pytest.UsageError(f"--rlx-runner={self.spec}: {exc}") from exc
        return [
            ClauseItem.from_parent(
                self, name=name, factory=factory, clause=name, options=self.options
            )
            for name in clause_names()
        ]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Append the clause items before other plugins filter the list (so ``-k`` applies)."""
    specs: list[str] = config.getoption("rlx_runner")
    if not specs:
        return
    options = _options(config)
    for spec in specs:
        name = f"rlx-conformance[{spec}]"
        collector = RunnerCollector.from_parent(
            session, name=name, nodeid=name, spec=spec, options=options
        )
        for node in collector.collect():
            assert isinstance(node, pytest.Item)
            items.append(node)
