"""rlx_lm.testing.strategies: each strategy draws what it promises, and reaches its edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

import rlx_lm
from rlx_lm import MirostatMode, SampleOpts
from rlx_lm.testing.strategies import (
    adversarial_logits,
    finite_logits,
    logits_rows,
    sample_opts,
    token_histories,
    vocab_sizes,
)

F32_MAX = float(np.finfo(np.float32).max)
# Drawing SampleOpts validates every field; a smaller budget keeps these few tests cheap.
FEW = settings(max_examples=60)
FIND = settings(max_examples=2000, database=None, phases=[Phase.generate])


@given(finite_logits(min_vocab=1, max_vocab=64))
def test_finite_rows_are_finite_float32(row: np.ndarray) -> None:
    assert row.dtype == np.float32
    assert row.ndim == 1
    assert 1 <= row.size <= 64
    assert np.isfinite(row).all()


@FEW
@given(st.integers(1, 50), st.data())
def test_a_fixed_vocab_size_fixes_the_length(vocab: int, data: st.DataObject) -> None:
    assert data.draw(logits_rows(vocab)).shape == (vocab,)
    assert data.draw(adversarial_logits(vocab)).shape == (vocab,)


@given(adversarial_logits(max_vocab=64))
def test_adversarial_rows_always_have_a_finite_value(row: np.ndarray) -> None:
    assert row.dtype == np.float32
    assert not np.isnan(row).any()
    assert np.isfinite(row).any()


@given(logits_rows(max_vocab=64))
def test_rlx_argmax_agrees_with_numpy_on_every_row(row: np.ndarray) -> None:
    # The strategies in use: the library's own argmax against the obvious reference.
    assert rlx_lm.argmax(row) == int(np.argmax(row))


@pytest.mark.parametrize(
    ("case", "predicate"),
    [
        ("a tie at the top", lambda r: r.size > 1 and (r == r.max()).sum() > 1),
        ("-inf next to finite values", lambda r: np.isneginf(r).any() and np.isfinite(r).any()),
        ("a magnitude near float32's limit", lambda r: (np.abs(r) >= 1e38).any()),
        ("a subnormal", lambda r: ((r != 0) & (np.abs(r) < np.finfo(np.float32).tiny)).any()),
        ("a one-token vocabulary", lambda r: r.size == 1),
        ("a constant row", lambda r: r.size > 2 and (r == r[0]).all()),
    ],
)
def test_adversarial_rows_reach_each_edge_case(case: str, predicate: object) -> None:
    row = find(adversarial_logits(max_vocab=64), predicate, settings=FIND)  # type: ignore[arg-type]
    assert row.size >= 1, case


def test_finite_rows_can_be_large() -> None:
    row = find(finite_logits(max_vocab=64), lambda r: np.abs(r).max() > 1e30, settings=FIND)
    assert np.isfinite(row).all()


@given(vocab_sizes(3, 9))
def test_vocab_sizes_stay_in_range(n: int) -> None:
    assert 3 <= n <= 9


def test_vocab_sizes_reject_an_empty_range() -> None:
    with pytest.raises(ValueError, match="min_size"):
        vocab_sizes(0, 4)
    with pytest.raises(ValueError, match="vocab_size"):
        finite_logits(0)


@given(st.integers(1, 40), st.data())
def test_token_histories_stay_in_the_vocabulary(vocab: int, data: st.DataObject) -> None:
    tokens = data.draw(token_histories(vocab, min_len=2, max_len=12))
    assert 2 <= len(tokens) <= 12
    assert all(0 <= t < vocab for t in tokens)


def test_token_histories_include_repeated_patterns() -> None:
    tokens = find(
        token_histories(1000, min_len=8, max_len=16),
        lambda ts: len(ts) >= 8 and ts[0] != ts[1] and ts == (ts[:2] * 8)[: len(ts)],
        settings=FIND,
    )
    assert len(set(tokens)) == 2


@FEW
@given(st.integers(1, 64), st.data())
def test_sample_opts_are_valid_and_stay_in_the_vocabulary(vocab: int, data: st.DataObject) -> None:
    opts = data.draw(sample_opts(vocab))
    assert isinstance(opts, SampleOpts)
    assert all(0 <= t < vocab for t in opts.logit_bias)
    assert all(0 <= t < vocab for t in opts.dry_sequence_breakers)
    # Never every token banned.
    assert sum(b == -math.inf for b in opts.logit_bias.values()) < vocab
    # The options round-trip through their own constructor (they are valid as drawn).
    assert SampleOpts(**{f: getattr(opts, f) for f in opts.__dataclass_fields__}) == opts


@FEW
@given(sample_opts(32, greedy=True))
def test_greedy_opts_are_greedy(opts: SampleOpts) -> None:
    assert opts.is_greedy()


@FEW
@given(sample_opts(32, greedy=False))
def test_sampling_opts_are_not_greedy(opts: SampleOpts) -> None:
    assert not opts.is_greedy()
    assert opts.temperature > 0


@pytest.mark.parametrize(
    ("case", "predicate"),
    [
        ("dynamic temperature", lambda o: o.dynamic_temp is not None),
        ("mirostat v2", lambda o: o.mirostat == MirostatMode.V2),
        ("xtc", lambda o: o.xtc_prob > 0),
        ("a ban", lambda o: -math.inf in o.logit_bias.values()),
        ("dry", lambda o: o.dry_multiplier > 0),
        ("every knob at its default", lambda o: o == SampleOpts(seed=o.seed)),
    ],
)
def test_sample_opts_reach_each_stage(case: str, predicate: object) -> None:
    assert find(sample_opts(16), predicate, settings=FIND) is not None, case  # type: ignore[arg-type]


def test_sample_opts_reject_an_empty_vocabulary() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        sample_opts(0)
