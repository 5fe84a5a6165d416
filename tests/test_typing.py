"""mypy --strict accepts a third-party runner as an LmRunner and rejects a wrong signature."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is a dev dependency (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "tests" / "typing"


def run_mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "pyproject.toml", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_runner_importing_nothing_from_rlx_lm_type_checks() -> None:
    result = run_mypy(TYPING / "third_party_runner.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_a_runner_with_a_wrong_signature_is_rejected() -> None:
    result = run_mypy(TYPING / "bad_runner.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'incompatible type "WrongSignature"; expected "LmRunner"  [arg-type]' in result.stdout
    assert "def predict_logits(self, prompt: str)" in result.stdout
    assert "Found 1 error in 1 file" in result.stdout
