"""Benches measure ratios against a baseline taken in the same run."""

from __future__ import annotations

import pytest

import rlx_lm


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if rlx_lm.build_profile != "release" and config.getoption("--benchmark-only", False):
        raise pytest.UsageError(
            f"benches need a release build (this one is {rlx_lm.build_profile}): "
            "run `maturin develop --release` first"
        )
