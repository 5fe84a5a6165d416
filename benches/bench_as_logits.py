"""as_logits, the per-token validation behind RunnerAdapter and HostDriven, against np.argmax."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_lm

VOCABS = [32000, 151936]


def row(vocab: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(vocab).astype(np.float32)


@pytest.mark.parametrize("vocab", VOCABS)
def test_numpy_argmax_floor(benchmark: Any, vocab: int) -> None:
    logits = row(vocab)
    benchmark.group = f"as_logits V={vocab}"
    benchmark.extra_info["baseline"] = True
    benchmark(np.argmax, logits)


@pytest.mark.parametrize("vocab", VOCABS)
def test_as_logits_float32_row(benchmark: Any, vocab: int) -> None:
    logits = row(vocab)
    benchmark.group = f"as_logits V={vocab}"
    assert benchmark(rlx_lm.as_logits, logits, vocab) is logits


@pytest.mark.parametrize("vocab", VOCABS)
def test_as_logits_float64_row(benchmark: Any, vocab: int) -> None:
    logits = row(vocab).astype(np.float64)
    benchmark.group = f"as_logits V={vocab}"
    assert benchmark(rlx_lm.as_logits, logits, vocab).dtype == np.float32
