"""Running the conformance clauses: `check_runner` for all of them, `run_clause` for one.

The kit works on any object: a third-party runner need not import rlx_lm. Members are
found by attribute probes and checked with `inspect.signature`; capabilities (a cached
prefill/decode pair, sessions, multimodal generation) are tested when the runner has
them, and the defaults rlx_lm supplies (`with_defaults`, `HostDriven`) are tested when
it does not. Prompts and continuations are drawn by hypothesis from the runner's
vocabulary; a failure is shrunk to a minimal example, which the report prints.

Every example builds its runners afresh from the factory, so examples are independent
and a printed example reproduces on its own. A factory should therefore be cheap: load
weights once at module level and build the runner around them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from rlx_lm.errors import InvalidOptionError
from rlx_lm.testing.capabilities import Capabilities, Factory, probe_capabilities
from rlx_lm.testing.checks import ClauseContext, ClauseFailure, ClauseSkip
from rlx_lm.testing.clauses import CLAUSES, Clause, clause_names
from rlx_lm.testing.options import (
    DEFAULT_ATOL,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_PROMPT_LEN,
    DEFAULT_RTOL,
    CheckOptions,
    require_hypothesis,
)
from rlx_lm.testing.report import ClauseResult, Report

__all__ = ["check_runner", "run_clause"]


def _select(names: Iterable[str] | None) -> list[Clause]:
    if names is None:
        return list(CLAUSES)
    wanted = list(names)
    chosen = [c for c in CLAUSES if any(c.name == n or c.name.startswith(n + ".") for n in wanted)]
    unknown = [
        n for n in wanted if not any(c.name == n or c.name.startswith(n + ".") for c in CLAUSES)
    ]
    if unknown:
        raise InvalidOptionError(
            f"unknown clause(s) {unknown}; the clauses are {clause_names()} (a prefix such as "
            f"'sessions' selects a group)"
        )
    return chosen


def _run(clause: Clause, factory: Factory, opts: CheckOptions, caps: Capabilities) -> ClauseResult:
    start = time.perf_counter()

    def result(status: Any, message: str = "", example: Any = None) -> ClauseResult:
        return ClauseResult(clause.name, status, message, example, time.perf_counter() - start)

    if clause.needs_core and caps.core_problem is not None:
        return result("skip", f"cannot run: {caps.core_problem} (see the structure.* clauses)")
    broken = [m for m in clause.uses if m in caps.bad_signatures]
    if broken:
        return result(
            "skip",
            f"cannot run: {', '.join(broken)} has an incompatible signature "
            f"(see structure.members)",
        )
    try:
        note = clause.check(ClauseContext(factory, opts, caps))
    except ClauseSkip as exc:
        return result("skip", str(exc))
    except ClauseFailure as exc:
        return result("fail", exc.message, exc.example)
    return result("pass", note or "")


def _describe(factory: Factory) -> str:
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or repr(factory)
    return f"{module}:{name}" if module else name


def run_clause(name: str, factory: Factory, options: CheckOptions | None = None) -> ClauseResult:
    """Run the one clause called ``name`` against runners from ``factory``."""
    require_hypothesis()
    clauses = [c for c in CLAUSES if c.name == name]
    if not clauses:
        raise InvalidOptionError(f"unknown clause {name!r}; the clauses are {clause_names()}")
    opts = options or CheckOptions()
    return _run(clauses[0], factory, opts, probe_capabilities(factory))


def check_runner(
    factory: Factory,
    *,
    clauses: Iterable[str] | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    max_prompt_len: int = DEFAULT_MAX_PROMPT_LEN,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    seed: int | None = 0,
    image_size: tuple[int, int] = (8, 8),
    multimodal_prompt: str = CheckOptions.multimodal_prompt,
    name: str | None = None,
) -> Report:
    """Check runners built by ``factory`` against every clause (or those named in ``clauses``).

    ``atol``/``rtol`` bound the difference between logits rows that must agree;
    ``max_examples`` is the hypothesis budget per clause; ``seed`` fixes the drawn
    examples (None draws new ones each run). The report lists pass/fail/skip per
    clause; call `Report.raise_for_failures` to turn failures into an exception.
    """
    if not callable(factory):
        raise InvalidOptionError(
            f"check_runner needs a factory that builds a fresh runner, got a "
            f"{type(factory).__name__} instance; pass its class or a function that returns one"
        )
    require_hypothesis()
    opts = CheckOptions(
        atol=atol,
        rtol=rtol,
        max_examples=max_examples,
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        seed=seed,
        image_size=image_size,
        multimodal_prompt=multimodal_prompt,
    )
    chosen = _select(clauses)
    caps = probe_capabilities(factory)
    results = tuple(_run(c, factory, opts, caps) for c in chosen)
    return Report(name or _describe(factory), results)
