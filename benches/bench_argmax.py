"""rlx_lm.argmax against np.argmax on the same LM-shaped rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_lm

VOCABS = [32000, 151936, 262144]


def lm_row(vocab: int, seed: int = 0) -> np.ndarray:
    """A row shaped like real logits: a heavy head over a Gaussian body."""
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(vocab).astype(np.float32) * 2.0
    head = rng.choice(vocab, size=64, replace=False)
    row[head] += rng.exponential(4.0, size=64).astype(np.float32)
    return row


@pytest.mark.parametrize("vocab", VOCABS)
def test_numpy_argmax(benchmark: Any, vocab: int) -> None:
    row = lm_row(vocab)
    benchmark.group = f"argmax V={vocab}"
    benchmark.extra_info["baseline"] = True
    assert benchmark(np.argmax, row) == rlx_lm.argmax(row)


@pytest.mark.parametrize("vocab", VOCABS)
def test_rlx_argmax(benchmark: Any, vocab: int) -> None:
    row = lm_row(vocab)
    benchmark.group = f"argmax V={vocab}"
    assert benchmark(rlx_lm.argmax, row) == int(np.argmax(row))
