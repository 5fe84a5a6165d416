"""Each sampler stage alone: hypothesis properties and differential tests
against the numpy reference (tests/reference_samplers.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import reference_samplers as ref
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_lm import MirostatMode, SampleOpts, SamplerChain

# Logits on a quarter grid: exact in float32, ties common.
grid = st.integers(-40, 40).map(lambda k: k / 4)
rows = hnp.arrays(np.float32, st.integers(1, 120), elements=grid)
MARGIN = 1e-5


@st.composite
def rows_with_bans(draw: st.DrawFn) -> np.ndarray:
    row = draw(rows)
    bans = draw(st.lists(st.integers(0, len(row) - 1), max_size=len(row) - 1, unique=True))
    row[bans] = -np.inf
    return row


def survivors(chain: SamplerChain, row: np.ndarray, history: Any = None) -> dict[int, float]:
    """The final distribution the chain draws from, as token -> logprob."""
    r = chain.sample_with_logprobs(row, history, top_n=len(row), mode="final", advance=False)
    return dict(r.top)


def one_stage(stage: str, first: bool = True, order: str | None = None, **kw: Any) -> SamplerChain:
    opts = SampleOpts(temperature=1.0, seed=kw.pop("seed", 7), **kw)
    if order is not None:
        return opts.into_chain(order=order)
    names = [stage, "temperature"] if first else ["temperature", stage]
    return opts.into_chain(order=names)


def assert_distribution(
    got: dict[int, float], want: dict[int, float], abs_tol: float = 2e-5
) -> None:
    assert set(got) == set(want)
    lp = ref.log_probs(want)
    for t, v in got.items():
        assert v == pytest.approx(lp[t], abs=abs_tol, rel=1e-4), t


# --- top-k -----------------------------------------------------------------


def _knob(lo: float, hi: float, **kw: bool) -> st.SearchStrategy[float]:
    """Floats for a knob; below float32's normal range (refused by SampleOpts) means 0."""
    return st.floats(lo, hi, **kw).map(lambda x: 0.0 if abs(x) < 1e-30 else x)


@given(rows_with_bans(), st.integers(1, 150))
def test_top_k_keeps_the_k_largest(row: np.ndarray, k: int) -> None:
    got = survivors(one_stage("top_k", top_k=k), row)
    finite = ref.from_row(row)
    assert len(got) == min(k, len(finite))
    assert_distribution(got, ref.top_k(finite, k))


@given(rows, st.integers(1, 150))
def test_top_k_with_ties_kept_like_hf(row: np.ndarray, k: int) -> None:
    got = survivors(one_stage("top_k", order="hf", top_k=k), row)
    assert_distribution(got, ref.top_k(ref.from_row(row), k, keep_ties=True))


@given(rows)
def test_top_k_one_is_greedy(row: np.ndarray) -> None:
    chain = one_stage("top_k", top_k=1)
    assert chain.sample(row) == int(np.argmax(row))


# --- top-p -----------------------------------------------------------------


@given(rows_with_bans(), st.floats(0.01, 1.0), st.integers(1, 5))
def test_top_p_keeps_the_smallest_prefix_reaching_p(
    row: np.ndarray, p: float, min_keep: int
) -> None:
    min_keep = min_keep if p < 1 else 1  # top_p 1 is off: a min_keep no stage reads is refused
    want, margin = ref.top_p(ref.from_row(row), p, min_keep)
    assume(margin > MARGIN)
    got = survivors(one_stage("top_p", top_p=p, min_keep=min_keep), row)
    assert_distribution(got, want)
    finite = ref.from_row(row)
    assert len(got) >= min(min_keep, len(finite))
    # Dropping the least likely survivor would fall short of p (unless min_keep holds it).
    pr = ref.probs(finite)
    if len(got) > min_keep:
        worst = ref.ranked({t: finite[t] for t in got})[-1]
        assert sum(pr[t] for t in got) - pr[worst] < p


def test_top_p_llama_cpp_example() -> None:
    row = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    assert set(survivors(one_stage("top_p", top_p=0.7), row)) == {2, 3}


# --- min-p -----------------------------------------------------------------


@given(rows_with_bans(), st.floats(0.001, 1.0), st.integers(1, 4))
def test_min_p_keeps_exactly_the_tokens_above_the_ratio(
    row: np.ndarray, p: float, min_keep: int
) -> None:
    want, margin = ref.min_p(ref.from_row(row), p, min_keep)
    assume(margin > MARGIN)
    got = survivors(one_stage("min_p", min_p=p, min_keep=min_keep), row)
    assert_distribution(got, want)
    pr = ref.probs(ref.from_row(row))
    pmax = max(pr.values())
    if len(got) > min_keep:
        assert set(got) == {t for t, q in pr.items() if q >= p * pmax}


def test_min_p_one_keeps_every_tie_of_the_max() -> None:
    row = np.array([1.0, 3.0, 3.0, 2.0, 3.0], np.float32)
    assert set(survivors(one_stage("min_p", min_p=1.0), row)) == {1, 2, 4}


# --- typical ---------------------------------------------------------------


@given(rows_with_bans(), st.floats(0.01, 0.99), st.booleans())
def test_typical_matches_the_reference(row: np.ndarray, p: float, hf: bool) -> None:
    want, margin = ref.typical(ref.from_row(row), p, 1, inclusive=hf, hf=hf)
    assume(margin > MARGIN)
    chain = one_stage("typical", order="hf" if hf else None, typical_p=p)
    assert_distribution(survivors(chain, row), want)


def test_typical_can_drop_the_argmax_as_in_llama_cpp() -> None:
    row = np.log(np.array([0.4, 0.2, 0.2, 0.2], np.float32))
    assert set(survivors(one_stage("typical", typical_p=0.5), row)) == {1, 2, 3}
    row = np.log(np.array([0.97, 0.01, 0.01, 0.01], np.float32))
    assert set(survivors(one_stage("typical", typical_p=0.5), row)) == {0}


# --- top-n-sigma -----------------------------------------------------------


@given(rows_with_bans(), st.floats(0.05, 4.0))
def test_top_n_sigma_matches_the_reference(row: np.ndarray, n: float) -> None:
    want, margin = ref.top_n_sigma(ref.from_row(row), n)
    assume(margin > MARGIN)
    assert_distribution(survivors(one_stage("top_n_sigma", top_n_sigma=n), row), want)


def test_top_n_sigma_llama_cpp_example() -> None:
    row = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    got = survivors(one_stage("top_n_sigma", top_n_sigma=1.0), row)
    assert {t: round(math.exp(v), 4) for t, v in got.items()} == {2: 0.4286, 3: 0.5714}


# --- XTC -------------------------------------------------------------------


@given(
    rows_with_bans(),
    st.floats(0.01, 0.5),
    _knob(0.0, 1.0),
    st.integers(1, 4),
    st.integers(0, 2**32),
)
def test_xtc_matches_the_reference(
    row: np.ndarray, threshold: float, prob: float, min_keep: int, seed: int
) -> None:
    coin = ref.uniform(seed, 0, 0, 1)
    assume(abs(coin - prob) > MARGIN)
    min_keep = min_keep if prob > 0 else 1  # a min_keep that no stage reads is refused
    finite = ref.from_row(row)
    want, margin = ref.xtc(finite, threshold, prob, min_keep, coin)
    assume(margin > MARGIN)
    chain = one_stage("xtc", xtc_threshold=threshold, xtc_prob=prob, min_keep=min_keep, seed=seed)
    got = survivors(chain, row)
    assert_distribution(got, want)
    assert len(got) >= min(min_keep, len(finite))
    pr = ref.probs(finite)
    above = [t for t in ref.ranked(finite) if pr[t] >= threshold]
    if set(got) != set(finite):
        # It fired: of the tokens above the threshold only the least likely is left.
        assert [t for t in above if t in got] == above[-1:]


@pytest.mark.parametrize(("threshold", "kept"), [(0.09, [0]), (0.19, [0, 1]), (0.29, [0, 1, 2])])
def test_xtc_llama_cpp_examples(threshold: float, kept: list[int]) -> None:
    row = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    chain = one_stage("xtc", xtc_threshold=threshold, xtc_prob=1.0)
    assert sorted(survivors(chain, row)) == kept


# --- temperature -----------------------------------------------------------


@given(rows_with_bans(), st.floats(0.05, 5.0))
def test_temperature_scales_the_logits(row: np.ndarray, t: float) -> None:
    chain = SampleOpts(temperature=t, seed=1).into_chain()
    assert_distribution(survivors(chain, row), ref.temperature(ref.from_row(row), t))


@given(rows_with_bans())
def test_temperature_to_zero_is_greedy(row: np.ndarray) -> None:
    finite = ref.from_row(row)
    best = ref.ranked(finite)[0]
    assert SampleOpts(temperature=0.0).into_chain().sample(row) == best
    ties = [t for t, v in finite.items() if v == finite[best]]
    assume(len(ties) == 1)
    assert SampleOpts(temperature=1e-3, seed=3).into_chain().sample(row) == best


@given(
    rows_with_bans(),
    _knob(0.0, 1.0),
    _knob(0.0, 2.0),
    _knob(0.0, 3.0),
)
def test_dynamic_temperature_matches_the_reference(
    row: np.ndarray, lo: float, span: float, exponent: float
) -> None:
    opts = SampleOpts(dynamic_temp=(lo, lo + span), dynamic_temp_exponent=exponent, seed=2)
    finite = ref.from_row(row)
    want, t = ref.dynamic_temperature(finite, lo, lo + span, exponent)
    assume(math.isnan(t) or t > 0.01)
    # The temperature comes from a float32 entropy (relative error ~1e-7), and a small
    # temperature multiplies that error by the logits' spread over t in every log-prob.
    spread = max(finite.values()) - min(finite.values()) if finite else 0.0
    amplification = 1.0 if math.isnan(t) else max(1.0, spread / t)
    assert_distribution(survivors(opts.into_chain(), row), want, 2e-5 * amplification)


# --- penalties ---------------------------------------------------------------


histories = st.lists(st.integers(0, 119), max_size=60)


@given(
    rows_with_bans(),
    histories,
    st.floats(0.5, 2.0),
    _knob(-1.0, 1.0),
    _knob(-1.0, 1.0),
    st.sampled_from([-1, 1, 5, 64]),
)
def test_penalties_follow_the_formula_for_every_count(
    row: np.ndarray, history: list[int], repeat: float, freq: float, presence: float, window: int
) -> None:
    history = [t % len(row) for t in history]
    opts = SampleOpts(
        temperature=1.0,
        repetition_penalty=repeat,
        frequency_penalty=freq,
        presence_penalty=presence,
        repetition_window=window,
        seed=4,
    )
    r = opts.into_chain().sample_with_logprobs(row, history, top_n=len(row), mode="penalized")
    want = ref.penalties(ref.from_row(row), history, repeat, freq, presence, window)
    assert_distribution(dict(r.top), want)


def test_repeat_penalty_applies_once_frequency_per_count() -> None:
    row = np.array([2.0, -2.0, 1.0, 0.0], np.float32)
    opts = SampleOpts(
        temperature=1.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25
    )
    r = opts.into_chain().sample_with_logprobs(row, [0, 0, 0, 1], top_n=4, mode="penalized")
    lp = dict(r.top)
    # token 0: 2/2 - 3*0.5 - 0.25 = -0.75; token 1: -2*2 - 0.5 - 0.25 = -4.75
    assert lp[0] - lp[2] == pytest.approx(-0.75 - 1.0, abs=1e-5)
    assert lp[1] - lp[2] == pytest.approx(-4.75 - 1.0, abs=1e-5)


# --- DRY ---------------------------------------------------------------------


@given(
    st.lists(st.integers(0, 5), min_size=0, max_size=80),
    st.integers(1, 4),
    st.floats(1.0, 3.0),
    st.sampled_from([0, 3, 32]),
    st.lists(st.integers(0, 5), max_size=2),
)
def test_dry_penalty_equals_a_brute_force_search(
    history: list[int], allowed: int, base: float, max_ngram: int, breakers: list[int]
) -> None:
    row = np.zeros(6, np.float32)
    opts = SampleOpts(
        temperature=1.0,
        dry_multiplier=0.8,
        dry_base=base,
        dry_allowed_length=allowed,
        dry_max_ngram=max_ngram,
        dry_sequence_breakers=tuple(breakers),
    )
    r = opts.into_chain().sample_with_logprobs(row, history, top_n=6, mode="penalized")
    want = ref.dry(ref.from_row(row), history, 0.8, base, allowed, max_ngram, breakers)
    assert_distribution(dict(r.top), want)


def test_dry_llama_cpp_example() -> None:
    row = np.zeros(4, np.float32)
    opts = SampleOpts(temperature=1.0, dry_multiplier=1.0, dry_base=1.1, dry_allowed_length=2)
    r = opts.into_chain().sample_with_logprobs(row, [0, 1, 2, 0, 1], top_n=4, mode="penalized")
    assert {t: round(math.exp(v), 4) for t, v in r.top} == {
        0: 0.2969,
        1: 0.2969,
        3: 0.2969,
        2: 0.1092,
    }


# --- logit bias ----------------------------------------------------------------


@given(rows, st.data())
def test_logit_bias_adds_and_bans(row: np.ndarray, data: st.DataObject) -> None:
    n = len(row)
    bias = data.draw(
        st.dictionaries(
            st.integers(0, n - 1),
            _knob(-5, 5) | st.just(-math.inf),
            max_size=n - 1,
        )
    )
    chain = SampleOpts(temperature=1.0, logit_bias=bias, seed=5).into_chain()
    got = survivors(chain, row)
    assert_distribution(got, ref.logit_bias(ref.from_row(row), bias))
    assert chain.sample(row) not in {t for t, b in bias.items() if b == -math.inf}


# --- the draw ------------------------------------------------------------------


@given(rows_with_bans(), _knob(0.0, 1.0, exclude_max=True))
def test_draw_with_a_given_uniform_is_the_inverse_cdf_in_id_order(
    row: np.ndarray, u: float
) -> None:
    want, margin = ref.draw(ref.from_row(row), u)
    assume(margin > MARGIN)
    assert SampleOpts(temperature=1.0).into_chain().sample(row, uniform=u) == want


@given(rows_with_bans(), st.integers(0, 2**64 - 1), st.integers(0, 1000), st.integers(0, 2**20))
def test_the_generator_is_philox_of_seed_sequence_step(
    row: np.ndarray, seed: int, step: int, seq: int
) -> None:
    chain = SampleOpts(temperature=1.0, seed=seed).into_chain(sequence_id=seq)
    for _ in range(step % 5):
        chain.accept(0)
    u = ref.uniform(seed, seq, step % 5, 0)
    want, margin = ref.draw(ref.from_row(row), u)
    assume(margin > MARGIN)
    assert chain.sample(row) == want


def test_chi_square_of_many_draws() -> None:
    p = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
    row = np.log(p).astype(np.float32)
    chain = SampleOpts(temperature=1.0, seed=12345).into_chain()
    n = 20000
    counts = np.zeros(len(p))
    for _ in range(n):
        t = chain.sample(row)
        counts[t] += 1
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    # df = 7: the 0.999 quantile is 24.32; a broken draw lands far above it.
    assert chi2 < 24.32, (chi2, counts)


# --- mirostat ------------------------------------------------------------------


@given(rows_with_bans(), st.floats(0.5, 8.0), st.floats(0.05, 1.0), st.integers(0, 2**32))
def test_mirostat_v2_truncates_by_surprise_and_learns_mu(
    row: np.ndarray, tau: float, eta: float, seed: int
) -> None:
    opts = SampleOpts(mirostat=MirostatMode.V2, mirostat_tau=tau, mirostat_eta=eta, seed=seed)
    chain = opts.into_chain()
    mu = chain.mu
    assert mu == pytest.approx(2 * tau)
    finite = ref.from_row(row)
    lp = ref.log_probs(finite)
    surprises = sorted(-v / math.log(2) for v in lp.values())
    assume(all(abs(s - 2 * tau) > 1e-4 for s in surprises))
    want = ref.mirostat_v2(finite, 2 * tau)
    got = survivors(chain, row)
    assert_distribution(got, want)
    tok = chain.sample(row)
    assert tok in want
    assert chain.step == 1
    expected = 2 * tau - eta * (ref.surprise_bits(want, tok) - tau)
    assert chain.mu == pytest.approx(expected, rel=1e-4, abs=1e-4)
    chain.reset()
    assert chain.mu == pytest.approx(2 * tau)
    assert chain.step == 0


@given(rows_with_bans(), st.floats(1.0, 8.0), st.integers(0, 2**32))
def test_mirostat_v1_keeps_the_estimated_k(row: np.ndarray, tau: float, seed: int) -> None:
    opts = SampleOpts(mirostat=MirostatMode.V1, mirostat_tau=tau, seed=seed)
    chain = opts.into_chain()
    finite = ref.from_row(row)
    k = ref.mirostat_v1_k(finite, 2 * tau, 100, len(row))
    assume(math.isfinite(k) and abs(k - round(k)) > 1e-3)
    kk = max(1, min(int(k), len(finite)))
    got = survivors(chain, row)
    assert_distribution(got, ref.top_k(finite, kk))


def test_mirostat_mu_drifts_toward_tau_under_a_constant_distribution() -> None:
    row = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], np.float32))
    chain = SampleOpts(
        mirostat=MirostatMode.V2, mirostat_tau=1.0, mirostat_eta=0.5, seed=9
    ).into_chain()
    for _ in range(200):
        chain.sample(row)
    assert chain.mu is not None
    assert 0.0 < chain.mu < 3.0


# --- the reference's own judgement -------------------------------------------------


def _plain_cut_margin(before: dict[int, float], after: dict[int, float], edited: set[int]) -> float:
    dropped = [u for u in before if u not in after]
    gaps = [
        abs(before[t] - before[u])
        for t in after
        for u in dropped
        if (t in edited or u in edited) and not math.isnan(before[t] - before[u])
    ]
    return min(gaps, default=math.inf)


@given(
    st.lists(
        st.one_of(st.floats(-50, 50, width=32), st.just(-math.inf), st.just(0.0)),
        min_size=1,
        max_size=40,
    ),
    st.data(),
)
def test_reference_cut_margin_is_the_closest_edited_pair(logits: list[float], data: Any) -> None:
    # The reference's n log n margin is the plain double loop over (kept, dropped) pairs
    # with an edited side, ties of equal infinities skipped.
    before = dict(enumerate(logits))
    keys = list(before)
    kept = data.draw(st.sets(st.sampled_from(keys)))
    edited = data.draw(st.sets(st.sampled_from(keys)))
    after = {t: before[t] for t in kept}
    assert ref.cut_margin(before, after, edited) == _plain_cut_margin(before, after, edited)
