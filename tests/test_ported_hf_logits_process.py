"""transformers' warper tests (``tests/generation/test_logits_process.py``) on ``order="hf"``.

Each test names the transformers test it ports and keeps its rows and knobs. transformers
checks the processed scores (``-inf`` or ``filter_value`` for a dropped token); here the same
is read from the chain's final distribution (``sample_with_logprobs(mode="final")``): the
tokens with a probability are the survivors, and their probabilities are the kept scores'
softmax. The repetition penalty is checked on the penalized distribution.

Ported: temperature, repetition penalty, top-k, top-p, min-p and typical (every case whose
stage rlx_lm has). Not ported: the processors rlx_lm has no stage for (min length, no-repeat
n-gram, bad words, epsilon, eta, top-h, watermarks, guidance, forced tokens, ...), the
encoder repetition penalty and ``normalize=True`` (no such knobs), and the in-place checks
(rlx_lm never writes the caller's row).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rlx_lm import SampleOpts


def final(row: np.ndarray, history: list[int] | None = None, **knobs: Any) -> dict[int, float]:
    """Token -> probability of the distribution the hf-order chain draws from."""
    knobs.setdefault("temperature", 1.0)
    chain = SampleOpts(seed=1, **knobs).into_chain("hf")
    r = chain.sample_with_logprobs(
        np.asarray(row, np.float32), history, len(row), mode="final", advance=False
    )
    return {t: math.exp(lp) for t, lp in r.top if lp > -math.inf}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


def kept(row: np.ndarray, **knobs: Any) -> list[bool]:
    got = final(row, **knobs)
    return [t in got for t in range(len(row))]


def ramps() -> tuple[np.ndarray, np.ndarray]:
    """transformers' ramp_logits: arange(10) - 5, and the same times 100 (extreme)."""
    ramp = np.arange(10, dtype=np.float32) - 5
    return ramp, ramp * 100


# test_temperature_dist_warper
def test_temperature_dist_warper() -> None:
    length = 20
    uniform = np.full(length, 1 / length, np.float32)
    peaked = uniform.copy()
    peaked[5] = 1 / length + 0.1
    peaked[10] = 1 / length - 0.4
    for t in (0.5, 1.3):
        got = final(uniform, temperature=t)
        assert all(abs(got[i] - 1 / length) < 1e-3 for i in range(length))  # uniform stays
        got = final(peaked, temperature=t)
        probs = [got[i] for i in range(length)]
        want = softmax(peaked / np.float32(t))
        np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-7)
        base = softmax(peaked)
        if t < 1:  # sharper: the peak higher, the valley lower
            assert max(probs) > base.max()
            assert min(probs) < base.min()
        else:  # smoother
            assert max(probs) < base.max()
            assert min(probs) > base.min()


# test_repetition_penalty_dist_process
def test_repetition_penalty_dist_process() -> None:
    vocab = 10
    rows = [np.full(vocab, 1 / vocab, np.float32) for _ in range(2)]
    rows[0][0] = -(1 / vocab)
    rows[1][5] = 4 / vocab
    # transformers' processed scores: a negative logit times the penalty, a positive one divided
    want = [rows[0].copy(), rows[1].copy()]
    want[0][0] = -(1 / vocab) * 2
    want[0][1] = (1 / vocab) / 2
    want[1][0] = (1 / vocab) / 2
    want[1][5] = (4 / vocab) / 2
    for row, history, w in zip(rows, ([0, 1], [5, 0]), want, strict=True):
        chain = SampleOpts(temperature=1.0, repetition_penalty=2.0, seed=1).into_chain("hf")
        r = chain.sample_with_logprobs(row, history, vocab, mode="penalized", advance=False)
        got = dict(r.top)
        np.testing.assert_allclose(
            [got[i] for i in range(vocab)], np.log(softmax(w)), rtol=1e-5, atol=1e-6
        )


# test_repetition_penalty_dist_process_exclusion_with_new_input_ids: transformers'
# prompt_ignore_length is the history's prompt_len with a penalty scoped to the output; under
# "hf" the repetition penalty sees the whole context (its default), so the prompt counts.
def test_repetition_penalty_sees_the_prompt_under_hf() -> None:
    vocab = 10
    row = np.full(vocab, 1 / vocab, np.float32)
    chain = SampleOpts(temperature=1.0, repetition_penalty=2.0, seed=1).into_chain("hf")
    r = chain.sample_with_logprobs(row, [0, 1], vocab, mode="penalized", prompt_len=2)
    got = dict(r.top)
    assert got[0] < got[2]
    assert got[1] < got[2]


# test_top_k_dist_warper
def test_top_k_dist_warper() -> None:
    ramp = np.arange(10, dtype=np.float32)
    shifted = ramp.copy()
    shifted[:5] += 10
    assert kept(ramp, top_k=3) == 7 * [False] + 3 * [True]
    assert kept(shifted, top_k=3) == 2 * [False] + 3 * [True] + 5 * [False]
    # special cases: min_tokens_to_keep=3 overrides top_k=1 (HF's max(top_k, min_keep))
    uniform = np.full(5, 1 / 5, np.float32)
    assert kept(uniform, top_k=1, min_keep=3) == 5 * [True]  # ties with the k-th are kept
    assert sum(kept(np.arange(5, dtype=np.float32), top_k=1, min_keep=3)) == 3


# test_top_p_dist_warper
def test_top_p_dist_warper() -> None:
    rows = np.log(np.array([[0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]], np.float32))
    assert kept(rows[0], top_p=0.8) == [True, False, False, True]
    assert kept(rows[1], top_p=0.8) == [False, True, True, True]
    ramp, extreme = ramps()
    assert sum(kept(ramp, top_p=0.9, min_keep=2)) == 3
    assert sum(kept(extreme, top_p=0.9, min_keep=2)) == 2


# test_min_p_dist_warper
def test_min_p_dist_warper() -> None:
    rows = np.log(
        np.array(
            [[0.9, 0.0274, 0.047, 0.0274], [0.15, 0.3, 0.3, 0.25], [0.97, 0.01, 0.01, 0.01]],
            np.float32,
        )
    )
    assert kept(rows[0], min_p=0.05) == [True, False, True, False]
    assert kept(rows[1], min_p=0.05) == [True, True, True, True]
    assert kept(rows[2], min_p=0.05) == [True, False, False, False]
    ramp, extreme = ramps()
    assert sum(kept(ramp, min_p=0.9, min_keep=2)) == 2
    assert sum(kept(extreme, min_p=0.9, min_keep=2)) == 2


# test_typical_dist_warper
def test_typical_dist_warper() -> None:
    rows = np.log(np.array([[0.97, 0.01, 0.01, 0.01], [0.4, 0.2, 0.2, 0.2]], np.float32))
    assert kept(rows[0], typical_p=0.5) == [True, False, False, False]
    assert kept(rows[1], typical_p=0.5) == [False, True, True, True]
    uniform = np.full(5, 1 / 5, np.float32)
    assert kept(uniform, typical_p=0.5, min_keep=3) == 5 * [True]
    ramp, extreme = ramps()
    assert sum(kept(ramp, typical_p=0.7, min_keep=2)) == 2
    assert sum(kept(extreme, typical_p=0.7, min_keep=2)) == 2


@pytest.mark.parametrize("p", [0.8, 0.9])
def test_top_p_filtered_distribution_is_the_kept_softmax(p: float) -> None:
    # test_top_p_dist_warper's EXPECTED_FILTERED_DIST, renormalised over the survivors.
    row = np.log(np.array([0.3, 0.1, 0.1, 0.5], np.float32))
    got = final(row, top_p=p)
    mass = sum(math.exp(float(row[t])) for t in got)
    for t, q in got.items():
        assert abs(q - math.exp(float(row[t])) / mass) < 1e-5
