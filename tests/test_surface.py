"""The Python surface as first users meet it: runtime protocols, typed loaders, len()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conformance_runners import CoreOnly, ToyRunner

from rlx_lm import KvCache, load_default, with_defaults
from rlx_lm.runner import (
    FullLmRunner,
    LmCore,
    LmRunner,
    SupportsHostDriven,
    SupportsPromptCache,
)

ROOT = Path(__file__).resolve().parents[1]


def test_protocols_are_runtime_checkable_by_attribute_presence() -> None:
    toy, core = ToyRunner(), CoreOnly()
    assert isinstance(toy, LmRunner)
    assert isinstance(toy, SupportsHostDriven)
    assert isinstance(toy, SupportsPromptCache)
    assert isinstance(core, LmCore)
    assert not isinstance(core, LmRunner)
    assert not isinstance(core, SupportsHostDriven)
    assert isinstance(with_defaults(core), FullLmRunner)

    class NotCallable:
        prefill_logits = 3
        decode_logits = 4

    # What isinstance does not prove: that the members are callable (the probes check that).
    from rlx_lm.runner import supports_host_driven

    assert isinstance(NotCallable(), SupportsHostDriven)
    assert not supports_host_driven(NotCallable())


def test_the_loaders_return_an_lm_runner() -> None:
    runner, tokenizer = load_default(max_seq=64)
    assert isinstance(runner, LmRunner)
    out = runner.generate(tokenizer.encode("hello"), 2, lambda _t: True)
    assert len(out) == 2


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True).returncode,
    reason="mypy is a dev dependency",
)
def test_runner_generate_type_checks_in_user_code() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            "pyproject.toml",
            "tests/typing/user_code.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_len_of_a_cache_and_a_snapshot() -> None:
    cache = KvCache(n_layers=2, n_kv_heads=1, head_dim=4, max_seq=8)
    assert len(cache) == 0
    rows = np.ones((1, 3, 4), np.float32)
    for layer in range(2):
        cache.append(layer, rows, rows)
    assert len(cache) == cache.len() == 3
    snap = cache.snapshot()
    assert len(snap) == snap.len() == 3
