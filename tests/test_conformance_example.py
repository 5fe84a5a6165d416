"""The example third-party package (examples/third_party_runner) keeps the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx_lm.testing import check_runner

toy = pytest.importorskip(
    "rlx_toy_runner",
    reason="the example package is not installed: pip install ./examples/third_party_runner",
)


def test_the_example_third_party_runner_passes_the_kit(tmp_path: Path) -> None:
    weights = tmp_path / "bigram.gguf"
    toy.write_toy_gguf(weights, vocab=16)
    report = check_runner(lambda: toy.ToyRunner(weights), name="rlx_toy_runner.ToyRunner")
    report.raise_for_failures()
    # It has its own cached pair, no sessions and no multimodal members.
    assert report["host_driven.decode"].passed
    assert "HostDriven" not in report["host_driven.decode"].message
    assert {r.clause for r in report.skips} == {
        "sessions.roundtrip",
        "sessions.reuse",
        "sessions.foreign",
        "multimodal.phases",
    }
