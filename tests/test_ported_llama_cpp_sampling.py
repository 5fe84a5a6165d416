"""llama.cpp's sampler tests (``tests/test-sampling.cpp``, ``main()``) on ``order="llama.cpp"``.

Each case names the llama.cpp test function it comes from and keeps its numbers: a row of
probabilities (logits ``log p``), one sampler, the probabilities after it and llama.cpp's
``dist`` (which renormalises over the survivors). Our chain is run with only that stage's knob
set, and its final distribution (``sample_with_logprobs(mode="final")``) is compared token by
token with llama.cpp's, within its own tolerance (1e-5).

Deliberate deviations (docs/samplers.md), asserted as such below:

- ``test_xtc`` and ``test_typical`` apply no ``dist``: llama.cpp checks the stale
  pre-removal probabilities. The survivors are the same; ours are renormalised.
- ``test_temp_ext`` with delta 0 is plain temperature in llama.cpp; it is ported as
  ``dynamic_temp=(t, t)`` for t = 1 and as ``temperature=0`` for t = 0.
- ``test_top_p`` with p = 0 and ``test_min_p`` with p = 1.05 are refused
  (``InvalidOptionError``: top_p is in (0, 1], min_p in [0, 1]) instead of acting as the
  smallest p (top_p 0 keeps one token; min_p above 1 keeps the max): a value outside a knob's
  meaning is a mistake to report, not a setting to reinterpret.
- ``test_p_less`` (the adaptive-p sampler) and ``test_sampler_queue`` are not ported: rlx_lm has
  no p-less stage, and the queue's size formulas count a zero-probability token that rlx_lm
  drops from the candidates (``-inf`` never survives a cut here).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rlx_lm import InvalidOptionError, SampleOpts

TOL = 1e-5  # llama.cpp's sampler_tester::check


def final(probs: list[float], history: list[int] | None = None, **knobs: Any) -> dict[int, float]:
    """Token -> probability of the distribution the llama.cpp-order chain draws from."""
    row = np.log(np.array(probs, np.float32))
    knobs.setdefault("temperature", 1.0)
    chain = SampleOpts(seed=1, **knobs).into_chain("llama.cpp")
    r = chain.sample_with_logprobs(row, history, len(row), mode="final", advance=False)
    return {t: math.exp(lp) for t, lp in r.top if lp > -math.inf}


def check(got: dict[int, float], want: dict[int, float]) -> None:
    """llama.cpp's check: the survivors, and each probability within 1e-5 (0 = dropped or ~0)."""
    for t in set(got) | set(want):
        assert abs(got.get(t, 0.0) - want.get(t, 0.0)) < TOL, (t, got, want)


P4 = [0.1, 0.2, 0.3, 0.4]
ID = dict(enumerate(P4))


# test_temp
@pytest.mark.parametrize(("temp", "want"), [(1.0, ID), (0.0, {3: 1.0})])
def test_temp(temp: float, want: dict[int, float]) -> None:
    check(final(P4, temperature=temp), want)


# test_temp_ext (delta 0: plain temperature in llama.cpp)
def test_temp_ext() -> None:
    check(final(P4, dynamic_temp=(1.0, 1.0), temperature=0.0), ID)
    check(final(P4, temperature=0.0), {3: 1.0})


# test_top_k (k = 0 is off in both)
@pytest.mark.parametrize(
    ("k", "want"),
    [
        (1, {3: 1.0}),
        (3, {3: 0.44444, 2: 0.33333, 1: 0.22222}),
        (4, ID),
        (0, ID),
    ],
)
def test_top_k(k: int, want: dict[int, float]) -> None:
    check(final(P4, top_k=k), want)


# test_top_p (0.7 is the exact boundary .4 + .3: the engines keep two tokens)
@pytest.mark.parametrize(
    ("p", "want"),
    [
        (1e-9, {3: 1.0}),  # llama.cpp's p = 0; 0 itself is refused (below)
        (0.7, {3: 0.571429, 2: 0.428571}),
        (0.8, {3: 0.44444, 2: 0.33333, 1: 0.22222}),
        (1.0, ID),
    ],
)
def test_top_p(p: float, want: dict[int, float]) -> None:
    check(final(P4, top_p=p), want)


def test_top_p_zero_and_min_p_above_one_are_refused() -> None:
    # Deviation: llama.cpp reads top_p 0 as "one token" and min_p 1.05 as "the max only".
    with pytest.raises(InvalidOptionError, match="top_p"):
        final(P4, top_p=0.0)
    with pytest.raises(InvalidOptionError, match="min_p"):
        final(P4, min_p=1.05)


# test_min_p
@pytest.mark.parametrize(
    ("p", "want"),
    [
        (0.00, ID),
        (0.24, ID),
        (0.26, {1: 0.2 / 0.9, 2: 0.3 / 0.9, 3: 0.4 / 0.9}),
        (0.49, {1: 0.2 / 0.9, 2: 0.3 / 0.9, 3: 0.4 / 0.9}),
        (0.51, {2: 0.3 / 0.7, 3: 0.4 / 0.7}),
        (0.74, {2: 0.3 / 0.7, 3: 0.4 / 0.7}),
        (0.76, {3: 1.0}),
        (1.00, {3: 1.0}),
    ],
)
def test_min_p(p: float, want: dict[int, float]) -> None:
    check(final(P4, min_p=p), want)


# test_xtc: "XTC should" (three cases) and "XTC should not" (one). llama.cpp checks the stale
# probabilities of the survivors ({0.1}, {0.2, 0.1}, ...); here they are renormalised.
@pytest.mark.parametrize(
    ("threshold", "survivors"),
    [(0.09, {3}), (0.19, {2, 3}), (0.29, {1, 2, 3}), (0.39, {0, 1, 2, 3})],
)
def test_xtc(threshold: float, survivors: set[int]) -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    got = final(probs, xtc_prob=0.99, xtc_threshold=threshold)
    assert set(got) == survivors
    mass = sum(probs[t] for t in survivors)
    check(got, {t: probs[t] / mass for t in survivors})


# test_typical (no dist in llama.cpp either: survivors compared, renormalised here)
@pytest.mark.parametrize(
    ("probs", "survivors"),
    [([0.97, 0.01, 0.01, 0.01], {0}), ([0.4, 0.2, 0.2, 0.2], {1, 2, 3})],
)
def test_typical(probs: list[float], survivors: set[int]) -> None:
    got = final(probs, typical_p=0.5)
    assert set(got) == survivors
    mass = sum(probs[t] for t in survivors)
    check(got, {t: probs[t] / mass for t in survivors})


P5 = [0.2] * 5


# test_penalties (penalty_last_n = the history's length)
@pytest.mark.parametrize(
    ("history", "want", "repeat", "freq", "pres"),
    [
        ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
        ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
        ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
    ],
)
def test_penalties(
    history: list[int], want: list[float], repeat: float, freq: float, pres: float
) -> None:
    got = final(
        P5,
        history,
        repetition_penalty=repeat,
        frequency_penalty=freq,
        presence_penalty=pres,
        repetition_window=len(history),
    )
    check(got, dict(enumerate(want)))


# test_dry (multiplier, base, allowed_length, penalty_last_n = the history's length or more)
@pytest.mark.parametrize(
    ("probs", "history", "want", "mult", "base", "allowed", "breakers"),
    [
        ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, ()),
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, ()),
        (P5, [0, 1, 3, 4, 0, 1], P5, 1.0, 1.1, 2, (3,)),
        (P5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, ()),
        (P5, [0, 1, 2, 3, 4, 0, 1], P5, 1.0, 1.1, 4, ()),
    ],
)
def test_dry(
    probs: list[float],
    history: list[int],
    want: list[float],
    mult: float,
    base: float,
    allowed: int,
    breakers: tuple[int, ...],
) -> None:
    got = final(
        probs,
        history,
        dry_multiplier=mult,
        dry_base=base,
        dry_allowed_length=allowed,
        dry_sequence_breakers=breakers,
    )
    check(got, dict(enumerate(want)))


# test_top_n_sigma (n = 0 is a no-op, llama.cpp PR #13345)
@pytest.mark.parametrize(
    ("n", "want"),
    [(1.0, {2: 0.428571, 3: 0.571429}), (0.0, ID), (3.0, ID)],
)
def test_top_n_sigma(n: float, want: dict[int, float]) -> None:
    check(final(P4, top_n_sigma=n), want)
