"""Whether the example third-party family (examples/third_party_runner) is installed."""

from __future__ import annotations

import importlib.metadata

import pytest

TOY_ENTRY_POINT = "rlxtoy"


def toy_installed() -> bool:
    """True when the rlx_lm.runners entry point of the example package is installed."""
    eps = importlib.metadata.entry_points(group="rlx_lm.runners")
    return any(ep.name == TOY_ENTRY_POINT for ep in eps)


needs_toy = pytest.mark.skipif(
    not toy_installed(),
    reason="examples/third_party_runner is not installed "
    "(pip install ./examples/third_party_runner; make dev and .ci/run do)",
)
