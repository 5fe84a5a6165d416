"""Bench conventions: every group has one baseline, timed in the same run.

A bench marks itself as its group's baseline with
``benchmark.extra_info["baseline"] = True``; the summary then prints each
other bench of the group as a ratio of the baseline's median. Run with
``make bench`` (release build required); ``make check`` runs each bench once,
untimed, as a smoke test.
"""

from __future__ import annotations

from typing import Any

import pytest

import rlx_lm


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if rlx_lm.build_profile != "release" and config.getoption("--benchmark-only", False):
        raise pytest.UsageError(
            f"benches need a release build (this one is {rlx_lm.build_profile}): "
            "run `maturin develop --release` first"
        )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = getattr(config, "_benchmarksession", None)
    if session is None or session.disabled:
        return
    groups: dict[str, list[Any]] = {}
    for bench in session.benchmarks:
        if bench.stats is None:
            continue
        groups.setdefault(bench.group or "", []).append(bench)
    lines = []
    for group, benches in sorted(groups.items()):
        base = [b for b in benches if b.extra_info.get("baseline")]
        if len(base) != 1:
            continue
        floor = base[0].stats.median
        for b in benches:
            if b is base[0]:
                continue
            lines.append(
                f"{group:40s} {b.name:50s} {b.stats.median * 1e6:10.2f} us"
                f"  = {b.stats.median / floor:6.2f}x {base[0].name}"
            )
    if lines:
        terminalreporter.section("ratios to each group's baseline (medians, same run)")
        for line in lines:
            terminalreporter.write_line(line)
