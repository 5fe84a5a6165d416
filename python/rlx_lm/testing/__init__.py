"""A conformance kit for runners: does an object keep the `rlx_lm.LmRunner` contract?

Three ways in, all running the same named clauses:

* Python: ``check_runner(factory).raise_for_failures()``
* pytest: ``pytest --rlx-runner=pkg.module:factory`` (one test item per clause)
* shell: ``rlx-lm check pkg.module:factory`` (or ``python -m rlx_lm.testing ...``)

``factory`` builds a fresh runner each call. Prompts are drawn with hypothesis, which
this package needs at run time: ``pip install 'rlx-lm[testing]'``. Hypothesis
strategies for logits rows, token histories and sampler options are in
`rlx_lm.testing.strategies`.
"""

from __future__ import annotations

from rlx_lm.testing.capabilities import Factory
from rlx_lm.testing.clauses import CLAUSES, Clause, clause_names
from rlx_lm.testing.cli import cli_check, load_factory
from rlx_lm.testing.conformance import check_runner, run_clause
from rlx_lm.testing.options import (
    DEFAULT_ATOL,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MAX_PROMPT_LEN,
    DEFAULT_RTOL,
    CheckOptions,
    require_hypothesis,
)
from rlx_lm.testing.report import ClauseResult, ConformanceError, Report, Status

__all__ = [
    "CLAUSES",
    "DEFAULT_ATOL",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_PROMPT_LEN",
    "DEFAULT_RTOL",
    "CheckOptions",
    "Clause",
    "ClauseResult",
    "ConformanceError",
    "Factory",
    "Report",
    "Status",
    "check_runner",
    "clause_names",
    "cli_check",
    "load_factory",
    "require_hypothesis",
    "run_clause",
]
