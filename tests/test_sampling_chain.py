"""Whole sampler chains: every preset against the reference, reproducibility,
state (accept/reset/clone), batches, log-probabilities and bad input."""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import numpy as np
import pytest
import reference_samplers as ref
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_lm import (
    DtypeError,
    InvalidLogitsError,
    InvalidOptionError,
    MirostatMode,
    SampleOpts,
    SamplerChain,
    ShapeError,
    TokenOutOfRangeError,
    UnsupportedError,
)
from rlx_lm.sample_opts import ORDER_PRESETS
from rlx_lm.testing import strategies

grid = st.integers(-40, 40).map(lambda k: k / 4)
rows = hnp.arrays(np.float32, st.integers(2, 100), elements=grid)
MARGIN = 1e-5
PRESETS = list(ORDER_PRESETS)


@st.composite
def sample_opts(draw: st.DrawFn, vocab: int) -> SampleOpts:
    """Random options touching every stage but mirostat, each knob drawn from its probe
    range in the core's table (float32, as the chain holds them), so a new stage's knobs
    are drawn here without an edit; always seeded, as the reference draws with the seed."""
    opts = draw(strategies.sample_opts(vocab, knobs_off=("mirostat",)))
    if opts.seed is None:
        opts = dataclasses.replace(opts, seed=draw(st.integers(0, 2**64 - 1)))
    return opts


@st.composite
def chain_case(draw: st.DrawFn) -> tuple[np.ndarray, list[int], SampleOpts, str]:
    row = draw(rows)
    history = draw(st.lists(st.integers(0, len(row) - 1), max_size=30))
    opts = draw(sample_opts(len(row)))
    finite = ref.logit_bias(ref.from_row(row), dict(opts.logit_bias))
    assume(finite)
    return row, history, opts, draw(st.sampled_from(PRESETS))


def survivors(chain: SamplerChain, row: np.ndarray, history: Any = None) -> dict[int, float]:
    r = chain.sample_with_logprobs(row, history, top_n=len(row), mode="final", advance=False)
    return dict(r.top)


@given(chain_case())
def test_every_preset_matches_the_reference_chain(
    case: tuple[np.ndarray, list[int], SampleOpts, str],
) -> None:
    row, history, opts, preset = case
    want = ref.run_chain(opts, preset, row, history)
    assume(want.margin > MARGIN)
    chain = opts.into_chain(order=preset)
    got = survivors(chain, row, history)
    assert set(got) == set(want.final)
    lp = ref.log_probs(want.final)
    for t, v in got.items():
        assert v == pytest.approx(lp[t], abs=5e-5, rel=1e-4)
    tok = chain.sample(row, history)
    assert tok == want.token
    assert tok in got, "the sampled token survives every stage"


@given(rows, st.data())
def test_no_stage_but_xtc_and_typical_drops_the_argmax(
    row: np.ndarray, data: st.DataObject
) -> None:
    opts = data.draw(sample_opts(len(row)))
    opts = SampleOpts(
        **{
            **{f: getattr(opts, f) for f in ("temperature", "dynamic_temp", "top_k", "top_p")},
            "min_p": opts.min_p,
            "top_n_sigma": opts.top_n_sigma,
            # min_keep only where a kept stage reads it (else it is refused).
            "min_keep": opts.min_keep if opts.top_p < 1 or opts.min_p > 0 else 1,
            "seed": opts.seed,
        }
    )
    best = int(np.argmax(row))
    for preset in PRESETS:
        assert best in survivors(opts.into_chain(order=preset), row)


def test_order_matters_temperature_first_or_last() -> None:
    row = np.array([4.0, 3.0, 2.0, 1.0, 0.0], np.float32)
    opts = SampleOpts(temperature=3.0, min_p=0.3, seed=1)
    # Temperature last (llama.cpp): min-p on the raw logits keeps l >= 4 + ln 0.3.
    assert set(survivors(opts.into_chain(order="llama.cpp"), row)) == {0, 1}
    # Temperature first (hf): min-p on l / 3 keeps l >= 4 + 3 ln 0.3.
    assert set(survivors(opts.into_chain(order="hf"), row)) == {0, 1, 2, 3}


# --- state -------------------------------------------------------------------


def flat_row(n: int = 64) -> np.ndarray:
    return np.zeros(n, np.float32)


def stream(chain: SamplerChain, n: int, row: np.ndarray | None = None) -> list[int]:
    row = flat_row() if row is None else row
    out = []
    for _ in range(n):
        t = chain.sample(row, out)
        out.append(t)
    return out


def test_same_seed_same_tokens_and_different_seeds_differ() -> None:
    opts = SampleOpts(temperature=1.0, seed=42)
    a = stream(opts.into_chain(), 50)
    assert a == stream(opts.into_chain(), 50)
    assert a != stream(SampleOpts(temperature=1.0, seed=43).into_chain(), 50)
    assert a != stream(opts.into_chain(sequence_id=1), 50)


def test_peek_is_pure_and_accept_advances() -> None:
    chain = SampleOpts(temperature=1.0, seed=5).into_chain()
    row = flat_row()
    first = [chain.peek(row) for _ in range(5)]
    assert len(set(first)) == 1
    assert [chain.sample(row, advance=False) for _ in range(3)] == first[:3]
    assert chain.step == 0
    chain.accept(first[0])
    assert chain.step == 1
    assert [chain.peek(row) for _ in range(20)] != first * 4


def test_sample_never_reuses_a_random_number() -> None:
    """A loop that only calls sample() (no accept) draws a fresh uniform each step."""
    row = np.zeros(1000, np.float32)
    chain = SampleOpts(temperature=1.0, seed=5).into_chain()
    got = [chain.sample(row, []) for _ in range(8)]
    assert chain.step == 8
    assert len(set(got)) > 1
    # Each is the draw of its own step: what peek-then-accept gives, step by step.
    twin = SampleOpts(temperature=1.0, seed=5).into_chain()
    want = []
    for _ in range(8):
        want.append(twin.peek(row, []))
        twin.accept(want[-1])
    assert got == want
    # And the draws are the generator's: step s uses u(seed, sequence, s).
    assert got == [ref.draw(ref.from_row(row), ref.uniform(5, 0, s, 0))[0] for s in range(8)]


def test_reset_replays_the_stream() -> None:
    chain = SampleOpts(temperature=1.0, seed=8, mirostat=MirostatMode.V2).into_chain()
    a = stream(chain, 30)
    mu = chain.mu
    chain.reset()
    assert chain.step == 0
    assert chain.mu == pytest.approx(10.0)
    assert stream(chain, 30) == a
    assert chain.mu == mu


def test_clone_continues_the_same_stream_independently() -> None:
    chain = SampleOpts(temperature=1.0, seed=9, mirostat=MirostatMode.V2).into_chain()
    stream(chain, 10)
    twin = chain.clone()
    assert (twin.step, twin.mu, twin.seed) == (chain.step, chain.mu, chain.seed)
    assert stream(twin, 20) == stream(chain, 20)
    # Advancing the clone leaves the original where it was.
    step, mu = chain.step, chain.mu
    stream(twin, 5)
    assert (chain.step, chain.mu) == (step, mu)
    import copy

    assert copy.deepcopy(chain).step == chain.step


@pytest.mark.parametrize(
    "shape",
    [(6, 5000), (8, 140_000)],
    ids=["one thread", "pool"],  # over a million logits a batch runs on rayon's pool
)
def test_reproducible_alone_or_in_a_batch(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(3)
    rows, vocab = shape
    logits = rng.standard_normal(shape).astype(np.float32) * 2
    opts = SampleOpts(temperature=0.9, top_k=50, top_p=0.9, seed=77)
    batch_chain = opts.into_chain()
    singles = [opts.into_chain(sequence_id=r) for r in range(rows)]
    histories = [list(rng.integers(0, vocab, 10)) for _ in range(rows)]
    for i in range(5):
        got = batch_chain.sample_batch(logits, histories)
        want = [c.sample(logits[r], histories[r]) for r, c in enumerate(singles)]
        assert got.tolist() == want
        assert batch_chain.step == i + 1, "a batch moves the chain one step on"


def test_batch_with_explicit_sequence_ids_and_uniforms() -> None:
    logits = np.zeros((4, 100), np.float32)
    chain = SampleOpts(temperature=1.0, seed=1).into_chain()
    got = chain.sample_batch(logits, sequence_ids=[7, 7, 8, 9])
    assert got[0] == got[1]
    assert got[0] == SampleOpts(temperature=1.0, seed=1).into_chain(sequence_id=7).sample(logits[0])
    assert chain.step == 1
    assert (
        chain.sample_batch(logits, sequence_ids=[7, 7, 8, 9], advance=False).tolist()
        != got.tolist()
    )
    assert chain.step == 1
    u = chain.sample_batch(logits, uniforms=[0.0, 0.5, 0.999, 0.25])
    assert u.tolist() == [0, 50, 99, 25]


def test_batch_runs_off_the_gil_in_parallel_threads() -> None:
    logits = np.random.default_rng(0).standard_normal((32, 40000)).astype(np.float32)
    chain = SampleOpts(temperature=1.0, top_p=0.9, seed=2).into_chain()
    want = chain.sample_batch(logits, advance=False)
    results: list[list[int]] = []

    def work() -> None:
        results.append(chain.clone().sample_batch(logits).tolist())

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want.tolist()] * 3


def test_batch_refuses_mirostat_and_bad_shapes() -> None:
    logits = np.zeros((3, 10), np.float32)
    with pytest.raises(UnsupportedError, match="mirostat"):
        SampleOpts(mirostat=MirostatMode.V2).into_chain().sample_batch(logits)
    chain = SampleOpts(temperature=1.0).into_chain()
    with pytest.raises(ShapeError, match="histories has 2 entries for 3 rows"):
        chain.sample_batch(logits, [[1], [2]])
    with pytest.raises(ShapeError, match="2-D"):
        chain.sample_batch(np.zeros(10, np.float32))
    with pytest.raises(DtypeError, match="float32"):
        chain.sample_batch(np.zeros((3, 10), np.float64))
    bad = logits.copy()
    bad[2, 4] = np.nan
    with pytest.raises(InvalidLogitsError, match="NaN at position 4"):
        chain.sample_batch(bad)
    with pytest.raises(TokenOutOfRangeError):
        chain.sample_batch(logits, [[1], [2], [10]])


# --- log-probabilities ---------------------------------------------------------


@given(rows, st.integers(0, 10))
def test_raw_logprobs_are_the_log_softmax_of_the_row(row: np.ndarray, top_n: int) -> None:
    chain = SampleOpts(temperature=1.0, top_k=3, seed=1).into_chain()
    r = chain.sample_with_logprobs(row, None, top_n)
    lp = ref.log_probs(ref.from_row(row))
    assert r.mode == "raw"
    assert r.token == SampleOpts(temperature=1.0, top_k=3, seed=1).into_chain().sample(row)
    assert chain.step == 1
    assert r.logprob == pytest.approx(lp[r.token], abs=1e-5)
    want_top = ref.ranked(ref.from_row(row))[:top_n]
    assert [t for t, _ in r.top] == want_top
    for t, v in r.top:
        assert v == pytest.approx(lp[t], abs=1e-5)


def test_final_logprobs_of_a_greedy_chain_are_certain() -> None:
    row = np.array([0.0, 2.0, 1.0], np.float32)
    r = SampleOpts().into_chain().sample_with_logprobs(row, None, 2, mode="final")
    assert (r.token, r.logprob, r.top) == (1, 0.0, [(1, 0.0)])


def test_unknown_mode_and_negative_top_n_are_refused() -> None:
    chain = SampleOpts(temperature=1.0).into_chain()
    with pytest.raises(InvalidOptionError, match="mode"):
        chain.sample_with_logprobs(flat_row(), None, 2, mode="logits")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="top_n"):
        chain.sample_with_logprobs(flat_row(), None, -1)


# --- policies: ties, banned, +inf ----------------------------------------------


def test_greedy_ties_go_to_the_lowest_id() -> None:
    row = np.zeros(1000, np.float32)
    row[[900, 123, 500]] = 7.0
    assert SampleOpts().into_chain().sample(row) == 123
    assert SampleOpts(temperature=1.0, top_k=1).into_chain().sample(row) == 123


def test_positive_infinity_takes_all_the_mass() -> None:
    row = np.zeros(50, np.float32)
    row[[10, 30]] = np.inf
    assert SampleOpts().into_chain().sample(row) == 10
    chain = SampleOpts(temperature=1.0, top_p=0.9, seed=3).into_chain()
    seen = set(stream(chain, 40, row))
    assert seen == {10, 30}


def test_banned_tokens_are_never_sampled() -> None:
    row = np.zeros(20, np.float32)
    row[:19] = -np.inf
    chain = SampleOpts(temperature=1.0, seed=3).into_chain()
    assert set(stream(chain, 20, row)) == {19}


# --- bad input ------------------------------------------------------------------


def test_bad_inputs_raise_typed_errors_and_leave_state_alone() -> None:
    chain = SampleOpts(temperature=1.0, top_k=5, seed=1).into_chain()
    row = np.linspace(0, 1, 100, dtype=np.float32)
    before = chain.peek(row, [1, 2])
    nan_row = row.copy()
    nan_row[17] = np.nan
    with pytest.raises(InvalidLogitsError, match="NaN at position 17"):
        chain.sample(nan_row)
    with pytest.raises(InvalidLogitsError, match="banned"):
        chain.sample(np.full(10, -np.inf, np.float32))
    with pytest.raises(InvalidLogitsError, match="empty"):
        chain.sample(np.zeros(0, np.float32))
    with pytest.raises(TokenOutOfRangeError, match="100"):
        chain.sample(row, [1, 100])
    with pytest.raises(TokenOutOfRangeError, match="negative"):
        chain.sample(row, [-1])
    with pytest.raises(TokenOutOfRangeError):
        chain.sample(row, np.array([5, 250], np.int32))
    with pytest.raises(DtypeError, match="float32"):
        chain.sample(row.astype(np.float64))
    with pytest.raises(ShapeError, match="1-D"):
        chain.sample(row.reshape(10, 10))
    with pytest.raises(ShapeError, match="1-D"):
        chain.sample(row, np.zeros((2, 2), np.int64))
    with pytest.raises(DtypeError, match="integer"):
        chain.sample(row, np.zeros(3, np.float32))
    with pytest.raises(DtypeError):
        chain.sample(row, "abc")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="uniform"):
        chain.sample(row, uniform=1.0)
    with pytest.raises(TokenOutOfRangeError):
        chain.accept(-1)
    with pytest.raises(TokenOutOfRangeError):
        chain.accept(100)
    assert chain.step == 0
    assert chain.peek(row, [1, 2]) == before


def test_a_bias_for_a_token_outside_the_vocabulary_is_refused() -> None:
    chain = SampleOpts(temperature=1.0, logit_bias={50: 1.0}).into_chain()
    with pytest.raises(TokenOutOfRangeError, match="50"):
        chain.sample(np.zeros(10, np.float32))


def test_history_accepts_lists_and_integer_arrays() -> None:
    chain = SampleOpts(temperature=1.0, presence_penalty=10.0, seed=1).into_chain()
    row = np.zeros(8, np.float32)
    row[3] = 5.0
    for h in ([3], np.array([3], np.int64), np.array([3], np.int32), np.array([3], np.uint32)):
        r = chain.sample_with_logprobs(row, h, 1, mode="penalized")
        assert r.top[0][0] != 3


# --- large vocabularies exercise the gather paths --------------------------------


def lm_row(vocab: int, shape: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rank = rng.permutation(vocab)
    return (12.0 - shape * np.log1p(rank) + 0.5 * rng.gumbel(size=vocab)).astype(np.float32)


@pytest.mark.parametrize("shape", [2.2, 1.1, 0.3])
@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
        {"temperature": 0.8, "top_p": 0.95},
        {"temperature": 1.2, "min_p": 0.2},
        {"temperature": 1.0, "top_k": 1000},
        {"temperature": 0.8, "top_n_sigma": 1.5},
    ],
)
def test_large_vocabulary_chains_match_the_reference(shape: float, kw: dict[str, Any]) -> None:
    row = lm_row(30000, shape, 1)
    opts = SampleOpts(seed=5, **kw)
    want = ref.run_chain(opts, "default", row, [])
    got = survivors(opts.into_chain(), row)
    if want.margin > MARGIN:
        assert set(got) == set(want.final)
    else:  # pragma: no cover - depends on the random row
        assert len(set(got) ^ set(want.final)) <= 2


@pytest.mark.parametrize("bias", [{}, {7: -math.inf}])
@pytest.mark.parametrize("shape", [2.2, 1.1])
def test_large_vocabulary_penalties_on_the_top_tokens_match_the_reference(
    shape: float, bias: dict[int, float]
) -> None:
    # Penalties and DRY before a top-k run on the top-k's candidates only; a
    # history made of the best tokens pushes them out of the raw top-k.
    row = lm_row(30000, shape, 2)
    best = np.argsort(-row, kind="stable")[:60]
    rng = np.random.default_rng(3)
    history = [int(t) for t in rng.choice(best, 300)] + [int(best[0]), int(best[1])] * 3
    opts = SampleOpts(
        seed=5,
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        presence_penalty=0.5,
        dry_multiplier=0.8,
        logit_bias={int(best[2]): -3.0, **bias},
    )
    want = ref.run_chain(opts, "default", row, history)
    got = survivors(opts.into_chain(), row, history)
    if want.margin > MARGIN:
        assert set(got) == set(want.final)
    else:  # pragma: no cover - depends on the random row
        assert len(set(got) ^ set(want.final)) <= 2


@st.composite
def history_edits(draw: st.DrawFn) -> list[list[int]]:
    """Histories one decode loop could pass in turn: grown, slid, rolled back or replaced."""
    token = st.integers(0, 39)
    history: list[int] = draw(st.lists(token, max_size=20))
    out = [list(history)]
    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(["append", "extend", "truncate", "replace", "same"]))
        if op == "append":
            history.append(draw(token))
        elif op == "extend":
            history.extend(draw(st.lists(token, max_size=12)))
        elif op == "truncate":
            del history[len(history) - draw(st.integers(0, len(history))) :]
        elif op == "replace":
            history = draw(st.lists(token, max_size=30))
        out.append(list(history))
    return out


@given(history_edits(), st.sampled_from([None, 4, 16]), st.integers(0, 2**32))
def test_a_chain_gives_what_a_fresh_chain_gives_whatever_it_saw_before(
    histories: list[list[int]], window: int | None, seed: int
) -> None:
    # The penalty counts are carried from call to call; they must always be
    # those of the history passed in.
    rng = np.random.default_rng(seed)
    row = rng.normal(size=40).astype(np.float32)
    opts = SampleOpts(
        seed=seed,
        temperature=1.0,
        top_k=5,
        repetition_penalty=1.5,
        frequency_penalty=0.3,
        presence_penalty=0.2,
        repetition_window=window if window is not None else -1,
    )
    chain = opts.into_chain()
    for h in histories:
        fresh = opts.into_chain()
        assert survivors(chain, row, h) == survivors(fresh, row, h)
        assert chain.peek(row, h) == fresh.peek(row, h)
