"""Fuzzing the sampler chain's Python entry points against the numpy reference.

Hypothesis draws knobs, orders, histories and rows at scales from 1e-30 to 1e38
(with bans, float32-minimum masks, signed zeros and ties) and checks:

- differential: the token is the reference's (``tests/reference_samplers.py``,
  float64) wherever the reference's tightest decision margin exceeds the
  float32 rounding of the scaled logits; at scales where float32 cannot
  resolve the decision, the token is one the reference keeps or one tied
  with such a token within that rounding;
- invariants everywhere: a typed ``RlxError`` or a token inside the row that
  is not banned; log-probabilities <= 0, never NaN, finite for the token
  under the final distribution; the same token again, in a batch, and after
  a pickle round trip.

``make check`` runs a short pass (the ``ci`` profile). The long campaign is
``make fuzz-sampling``: ``python tests/test_fuzz_sampling.py SECONDS [SEED]`` draws
cases of the same distribution from a seeded PRNG (hypothesis's own drawing cost
30 times the checks) until the time is up, and prints the executions.
"""

from __future__ import annotations

import math
import pickle
import random
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import reference_samplers as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_lm import RlxError, SampleOpts
from rlx_lm.testing.strategies import KNOB_TABLE, valid_options

F32_MIN = float(np.finfo(np.float32).min)
F32_MAX = float(np.finfo(np.float32).max)
EPS32 = 2.0**-24
F32_TINY = float(np.finfo(np.float32).tiny)
PRESETS = ["default", "llama.cpp", "hf", "vllm"]
EXECUTIONS = {"reference": 0, "invariants": 0}

SCALES = [1e-30, 1e-10, 1e-3, 0.1, 1.0, 4.0, 1e2, 1e4, 1e6, 1e9, 1e20, 1e30, 1e38]
SPECIAL = [-math.inf, F32_MIN, -0.0, 0.0]
Case = tuple[SampleOpts, str, np.ndarray, list[int]]


class Draw(Protocol):
    """Where a case's choices come from: hypothesis (shrinking, CI) or a seeded PRNG
    (the long campaign, where hypothesis's own drawing cost 30x the checks)."""

    def int(self, lo: int, hi: int) -> int: ...
    def pick(self, values: Sequence[Any]) -> Any: ...
    def float(self, lo: float, hi: float) -> float: ...
    def bool(self) -> bool: ...


class HypothesisDraw:
    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def pick(self, values: Sequence[Any]) -> Any:
        return self._draw(st.sampled_from(values))

    def float(self, lo: float, hi: float) -> float:
        return self._draw(st.floats(lo, hi))

    def bool(self) -> bool:
        return self._draw(st.booleans())


class RandomDraw:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def pick(self, values: Sequence[Any]) -> Any:
        return values[self._rng.randrange(len(values))]

    def float(self, lo: float, hi: float) -> float:
        # the ends themselves now and then, as hypothesis draws them
        r = self._rng.random()
        return lo if r < 0.05 else hi if r < 0.1 else self._rng.uniform(lo, hi)

    def bool(self) -> bool:
        return self._rng.random() < 0.5


def draw_row(d: Draw) -> np.ndarray:
    n = d.int(2, 40)
    scale = d.pick(SCALES)
    vals = np.array([d.int(-40, 40) / 4 for _ in range(n)], np.float64) * scale
    vals = np.clip(vals, -3.4e38, 3.4e38)
    for _ in range(d.int(0, 3)):
        vals[d.int(0, n - 1)] = d.pick(SPECIAL)
    row = vals.astype(np.float32)
    if not np.isfinite(row).any() or np.all(row == -np.inf):
        row[d.int(0, n - 1)] = np.float32(scale)
    return row


#: Magnitudes a float knob is also drawn at where its valid range allows: the
#: float32 extremes of a knob, beyond the probe ranges of the core's table.
HOSTILE = [1e-40, 1e-30, 1e10, 1e30]
#: Knobs left at their defaults: the reference has no mirostat.
KNOBS_OFF = ("mirostat",)


def _inside(knob: dict[str, Any], x: float) -> bool:
    """Whether ``x`` is inside the knob's valid range (the table's ``lo`` and ``hi``)."""
    lo, hi = knob["lo"], knob["hi"]
    above = lo is None or (x >= lo[0] if lo[1] else x > lo[0])
    below = hi is None or (x <= hi[0] if hi[1] else x < hi[0])
    return above and below


def draw_value(d: Draw, knob: dict[str, Any], vocab: int) -> Any:
    """One knob's value from its probe range in the core's table, now and then a
    hostile magnitude its valid range allows; token ids inside ``vocab``."""

    def f32(lo: float, hi: float) -> float:
        return float(np.float32(d.float(lo, hi)))

    lo, hi = knob["probe"]
    kind = knob["kind"]
    if kind == "float":
        hostile = [x for x in HOSTILE if _inside(knob, x)]
        if hostile and d.int(0, 3) == 0:
            return d.pick(hostile)
        return f32(lo, hi)
    if kind in ("int", "int | None"):
        return d.int(int(lo), int(hi)) if d.int(0, 3) else d.pick([int(lo), 1000])
    if kind == "pair | None":
        a, b = f32(lo, hi), f32(lo, hi)
        return (min(a, b), max(a, b))
    if kind == "tokens":
        return tuple(d.int(0, vocab - 1) for _ in range(d.int(0, 3)))
    if kind == "seed":
        return d.int(0, 2**64 - 1)
    if kind == "bias":
        toks = sorted({d.int(0, vocab - 1) for _ in range(d.int(0, 3))})
        return {t: d.pick([-math.inf, 1e30, f32(lo, hi)]) for t in toks}
    raise AssertionError(f"knob {knob['name']}: no draw for its kind {kind!r}")


def draw_opts(d: Draw, vocab: int) -> SampleOpts:
    """Options drawn knob by knob from the core's table (each set half the time), with
    what the core refuses reset to defaults (`valid_options`): a new knob is fuzzed
    without an edit here."""
    kw: dict[str, Any] = {}
    for knob in KNOB_TABLE:
        if knob["name"] in KNOBS_OFF:
            continue
        if knob["kind"] == "seed" or d.bool():
            kw[knob["name"]] = draw_value(d, knob, vocab)
    return valid_options(kw)


def draw_case(d: Draw) -> Case:
    row = draw_row(d)
    o = draw_opts(d, len(row))
    order = d.pick(PRESETS)
    history = [d.int(0, min(len(row), 6) - 1) for _ in range(d.int(0, 30))]
    # Every stage at every scale, top-n-sigma included (its moments are taken
    # in float64: test_sampling_hostile pins the 1e-30 and 1e20 cases).
    return o, order, row, history


@st.composite
def cases(draw: st.DrawFn) -> Case:
    return draw_case(HypothesisDraw(draw))


def raw_magnitude(o: SampleOpts, row: np.ndarray, history: list[int]) -> float:
    """A bound on the largest |logit| the chain computes before temperature: the row
    plus a finite bias, scaled by a repetition penalty, shifted by presence, frequency and DRY."""
    finite = row[np.isfinite(row)]
    m = float(np.abs(finite).max()) if finite.size else 0.0
    # The bias first: llama.cpp's order biases before its penalties, so a repetition
    # penalty below 1 scales the bias too (1e30 / 1e-40 is +inf in float32).
    m += max((abs(b) for b in o.logit_bias.values() if math.isfinite(b)), default=0.0)
    m = m * max(o.repetition_penalty, 1.0 / o.repetition_penalty) + abs(o.presence_penalty)
    m += abs(o.frequency_penalty) * len(history)
    if o.dry_multiplier > 0:
        grow = max(0, len(history) - o.dry_allowed_length)
        # In logs: dry_base ** grow overflows a float64 for a large base.
        log_penalty = math.log(o.dry_multiplier) + min(grow, 128) * math.log(o.dry_base)
        m += min(math.exp(min(log_penalty, 89.0)), 3.4e38)
    return m


def rounding(o: SampleOpts, row: np.ndarray, history: list[int]) -> float:
    """How far float32 arithmetic may move a logit a stage decides on, in nats: float32's
    rounding of the largest logit the chain computes before temperature, divided by a
    temperature below 1. Not by one above 1: llama.cpp's order decides on the logits
    before its temperature, where a penalty's rounding is whole (a frequency penalty
    of 1e10 ties 7 - 3e10 with -0.25 - 3e10 however hot the temperature after it)."""
    m = raw_magnitude(o, row, history)
    t = o.dynamic_temp[0] if o.dynamic_temp is not None else o.temperature
    m = m / min(t, 1.0) if t > 0 else m
    return 1e-5 + 256 * EPS32 * m


def underflows(o: SampleOpts, row: np.ndarray) -> bool:
    """Whether the temperature scales a nonzero logit below float32's normal range, where
    its spacing is absolute (2**-149) and the chain ties logits that float64 still ranks
    (1e-30 at temperature 1e30): then the ranking is the tie-break's, not the reference's."""
    t = o.dynamic_temp[1] if o.dynamic_temp is not None else o.temperature
    if t <= 1.0:
        return False
    finite = np.abs(row[np.isfinite(row)].astype(np.float64))
    finite = finite[finite > 0]
    return bool(finite.size) and float(finite.min()) / t < F32_TINY


#: Where a float32 softmax stops seeing a probability: its subnormal and normal floors,
#: and the chain's own exp, which returns 0 below e^-87.
ENTROPY_FLOORS = (2.0**-149, F32_TINY, math.exp(-87.0))


def entropy_alternatives(
    o: SampleOpts, order: str, row: np.ndarray, history: list[int], want: ref.ChainRun
) -> list[ref.ChainRun]:
    """The reference's runs with dynamic temperature's entropy seen at float32's resolution,
    where that moves the temperature: float32 cannot resolve which one applies. A peaked
    row's entropy is 1e-74 in float64 and 0 in float32 (every other probability
    underflows), and with an exponent of 1e-30, (H / ln n) ** exponent is about 1 for the
    first and 0 for the second: the temperature is the range's top or its bottom on a
    difference no float32 computation can see (seed 20261207, case 575481)."""
    if o.dynamic_temp is None or math.isnan(want.temperature):
        return []
    runs = [ref.run_chain(o, order, row, history, entropy_floor=f) for f in ENTROPY_FLOORS]
    return [r for r in runs if not math.isclose(r.temperature, want.temperature, rel_tol=1e-4)]


def check_invariants(o: SampleOpts, order: str, row: np.ndarray, history: list[int]) -> int | None:
    """The properties that hold at every scale; the token, or None when refused."""
    EXECUTIONS["invariants"] += 1
    chain = o.into_chain(order)
    try:
        token = chain.peek(row, history)
    except RlxError:
        return None
    assert 0 <= token < len(row)
    assert row[token] > -math.inf
    assert o.logit_bias.get(token, 0.0) > -math.inf
    for mode in ("raw", "penalized", "final"):
        r = chain.sample_with_logprobs(row, history, 5, mode=mode, advance=False)
        assert r.token == token, mode
        assert r.logprob <= 0, (mode, r)
        assert not math.isnan(r.logprob), (mode, r)
        assert all(lp <= 0 and not math.isnan(lp) for _, lp in r.top), (mode, r)
        if mode == "final":
            assert math.isfinite(r.logprob), r
    batch = chain.sample_batch(
        np.stack([row, row]), [history, history], sequence_ids=[0, 0], advance=False
    )
    assert list(batch) == [token, token]
    assert pickle.loads(pickle.dumps(chain)).peek(row, history) == token
    assert chain.sample(row, history) == token
    assert chain.step == 1
    return token


def check_reference(o: SampleOpts, order: str, row: np.ndarray, history: list[int]) -> None:
    token = check_invariants(o, order, row, history)
    if token is None:
        return
    if raw_magnitude(o, row, history) > F32_MAX:
        # A penalty or bias pushed a logit past float32's range: the chain's +-inf
        # ties tokens that float64 still orders, so only the invariants apply.
        return
    EXECUTIONS["reference"] += 1
    want = ref.run_chain(o, order, row, history)
    alternatives = entropy_alternatives(o, order, row, history, want)
    tol = rounding(o, row, history)
    if tol < 0.05 and not underflows(o, row) and not alternatives:
        if want.margin > 4 * tol:
            assert token == want.token, (token, want.token, want.margin, tol)
        return
    # float32 cannot resolve the decision: the token is one the reference
    # keeps, or tied with one within the rounding of the logits it decided on: the
    # raw row plus the logit bias, in float32 as the chain adds it (a bias of 1e30
    # ties every token it lifts, and which of a tie a ranked stage keeps is the
    # tie-break's business, not the reference's).
    if token in want.final or any(token in a.final for a in alternatives):
        return
    # The reference on float32 logits, as the chain stores them after each editing stage
    # and the temperature: where float32 ties two tokens float64 still orders, a stage's
    # cut keeps both (Hugging Face's typical keeps a tied boundary), and a later stage's
    # statistics (top-n-sigma's mean and deviation) see a different set (seed 2793612892,
    # case 1398336).
    seen32 = ref.run_chain(o, order, row, history, float32_logits=True)
    alternatives.append(seen32)
    if token in seen32.final:
        return
    # The tolerance in raw-logit units: the float32 rounding of the largest logit
    # before temperature (at temperature 0 the argmax decides on raw logits), and the
    # absolute rounding of float32 probabilities (1e-5 nats), which stages ahead of the
    # temperature (llama.cpp's order) see at temperature 1.
    t = o.dynamic_temp[1] if o.dynamic_temp is not None else o.temperature
    raw_tol = 4 * (256 * EPS32 * raw_magnitude(o, row, history) + 1e-5 * max(t, 1.0)) + 1e-30
    # Compared on the logits after the editing stages (the reference's float64 bias,
    # penalties and DRY), where a penalty may have tied what the raw row ordered;
    # the float32 sum for a bias, which float64 may still tell apart.
    biased = row.astype(np.float32).copy()
    for k, b in o.logit_bias.items():
        biased[k] = np.float32(biased[k] + np.float32(b))

    def gap(a: int, b: int) -> float:
        e = want.edited
        ab = abs(float(biased[a]) - float(biased[b]))
        if a in e and b in e and math.isfinite(e[a]) and math.isfinite(e[b]):
            return min(ab, abs(e[a] - e[b]))
        return ab

    kept = set(want.final).union(*(a.final for a in alternatives))
    near = [gap(token, k) for k in kept]
    assert min(near) <= raw_tol, (token, sorted(want.final), tol, raw_tol)


SETTINGS = settings(suppress_health_check=list(HealthCheck), deadline=None)


def _property(case: tuple[SampleOpts, str, np.ndarray, list[int]]) -> None:
    check_reference(*case)


test_the_chain_matches_the_reference_at_every_scale = SETTINGS(given(cases())(_property))


def campaign(seconds: float, seed: int | None = None) -> int:
    """Check fresh pseudo-random cases (the same distribution as ``cases()``, drawn
    from a seeded PRNG) until time is up; a failure prints the seed and case index
    that reproduce it."""
    seed = random.SystemRandom().randrange(2**63) if seed is None else seed
    rng = random.Random(seed)
    start = time.monotonic()
    deadline, report = start + seconds, start + 600
    done = 0

    def summary(how: str) -> None:
        print(
            f"sampler chain vs reference (seed {seed}): {done} cases, "
            f"{EXECUTIONS['invariants']} executions ({EXECUTIONS['reference']} compared "
            f"with the reference) in {time.monotonic() - start:.0f} s, {how}",
            flush=True,
        )

    try:
        while done == 0 or time.monotonic() < deadline:  # one batch at least
            for _ in range(256):
                case = draw_case(RandomDraw(rng))
                try:
                    check_reference(*case)
                except Exception:  # a mismatch, or the reference itself failing
                    print(f"FAILED at case {done} of seed {seed}: {case!r}", flush=True)
                    raise
                done += 1
            if time.monotonic() > report:  # a long campaign says how far it is
                summary("running")
                report += 600
    except KeyboardInterrupt:  # an interrupted campaign still counts what it checked
        summary("interrupted, no failure")
        return 0
    summary("no failure")
    return 0


def test_a_top_p_cut_that_float32_cannot_rank_is_not_judged_exactly() -> None:
    """Found by the campaign (seed 20261201, case 18630): logits of 1e-30 at temperature
    1e30 underflow to equal float32 values, so which of them top-p keeps is the
    tie-break's (by id), while float64 still ranks them. The reference's top-p margin
    counts the gap at its cut, so the check does not demand float64's ranking."""
    tenths = (
        "-37.5 20 -92.5 -2.5 -87.5 -inf -7.5 45 -90 -17.5 90 77.5 -75 0 -35 -22.5 82.5 -85 45 5"
    )
    tenths += (
        " 77.5 67.5 -47.5 30 97.5 -92.5 -30 0 -7.5 52.5 -72.5 -90 -22.5 77.5 -40 27.5 -77.5 -5"
    )
    row = np.array([float(v) / 10 for v in tenths.split()], dtype=np.float32)
    row *= np.float32(1e-30)
    o = SampleOpts(temperature=1e30, top_p=0.4307255148887634, seed=239515275454109181)
    want = ref.run_chain(o, "default", row, [])
    assert want.margin < rounding(o, row, [])
    check_reference(o, "default", row, [])


def test_a_ranking_float32_underflows_is_the_tie_breaks() -> None:
    """Found by the campaign (seed 20261202, case 16468): Hugging Face's order scales by a
    temperature of 1e30 first, every logit of 1e-30 underflows to 0, and top-p of 1e-30
    keeps the first of the tie by id; float64 still ranks them, so the token is only
    checked against what the reference keeps or ties with."""
    quarters = "-40 8 20 11 14 4 9 3 1 -27 -17 13 9 -3 -16 -30 33 17 -17 12 -18 -31 26 15 17"
    quarters += " 21 -8 39 -27 10 4 2 40 24 -18 0 40"
    row = np.array([float(v) / 4 for v in quarters.split()], dtype=np.float32)
    row *= np.float32(1e-30)
    o = SampleOpts(
        temperature=1e30, top_p=1e-30, top_n_sigma=1.2809689044952393, seed=3278202159122181898
    )
    assert underflows(o, row)
    assert o.into_chain("hf").peek(row, [2, 1]) != ref.run_chain(o, "hf", row, [2, 1]).token
    check_reference(o, "hf", row, [2, 1])


def test_the_reference_top_n_sigma_ignores_minus_inf_as_the_chain_does() -> None:
    """Found by the campaign (seed 20261202, case 1685): DRY at 1e30 sent candidates to
    -inf and the reference's top-n-sigma took a NaN threshold and emptied the set (the
    chain's fix of the same defect is pinned in rust/sampling/top_n_sigma.rs)."""
    c = {0: -math.inf, 1: 2.0, 2: 1.0, 3: -5.0, 4: -math.inf}
    kept, _ = ref.top_n_sigma(c, 1.0)
    assert kept == {1: 2.0, 2: 1.0}


def test_a_penalty_rounds_before_a_hot_temperature() -> None:
    """Found by the campaign (seed 20261203, case 86687): in llama.cpp's order a frequency
    penalty of 1e10 makes 7 - 3e10 and -0.25 - 3e10 the same float32 before top-k and
    top-p decide, and the temperature of 1e30 comes last; the rounding allowed is the
    penalty's, not that rounding divided by the temperature."""
    o = SampleOpts(
        temperature=1e30, top_p=1e-40, top_k=6, frequency_penalty=1e10, seed=4385995466203726193
    )
    row = np.array([-math.inf, -0.25, 0.0, 7.0], dtype=np.float32)
    history = [2, 0, 3, 2, 2, 0, 1, 0, 3, 2, 3, 1, 1, 2]
    assert rounding(o, row, history) >= 256 * EPS32 * 1e10
    check_reference(o, "llama.cpp", row, history)


def test_a_bias_a_penalty_below_one_overflows_is_past_float32() -> None:
    """Found by the campaign (seed 20261204, case 56810): llama.cpp's order adds a bias of
    1e30 before a repetition penalty of 1e-40 divides it, +inf in float32 and 1e70 in
    float64; the bound on the chain's logits must count the bias before the penalty, so
    that only the invariants judge such a row."""
    row = np.full(6, 1e-30, dtype=np.float32)
    o = SampleOpts(repetition_penalty=1e-40, logit_bias={4: 1e30, 5: 0.5}, seed=1)
    assert raw_magnitude(o, row, [4, 5]) > F32_MAX
    check_reference(o, "llama.cpp", row, [4, 5])


def test_a_dynamic_temperature_float32_cannot_resolve_is_not_judged_exactly() -> None:
    """Found by the campaign (seed 20261207, case 575481): 900 leads 725 by 175, so every
    other probability underflows float32 and the row's entropy is 0 there, 1e-74 in
    float64; an exponent of 1e-30 turns that into the range's bottom (0.206) or its top
    (1.99), and XTC at threshold 1e-40 then keeps or drops the leader. The check accepts
    what the reference keeps at float32's view of the entropy too."""
    quarters = "-1800 -2600 -3600 -300 -3600 -0 1000 2900 -2300 -2300 -1400 -2200 -3600"
    quarters += " -3000 -1200 0 400 2000 -100 1700 -1600 3600 -1100 800 2500"
    row = np.array([float(v) / 4 for v in quarters.split()], dtype=np.float32)
    history = [0, 3, 1, 0, 3, 5, 5, 1, 1, 1, 4, 5, 1, 0, 2, 0, 3, 1, 3, 3, 4]
    o = SampleOpts(
        temperature=0.0,
        top_k=153,
        repetition_penalty=1.5611375570297241,
        dynamic_temp=(0.20646971464157104, 1.9897053241729736),
        dynamic_temp_exponent=1e-30,
        top_n_sigma=2.434157609939575,
        xtc_threshold=1e-40,
        xtc_prob=0.8369454741477966,
        dry_sequence_breakers=(5,),
        presence_penalty=-2.0,
        seed=4601929998627810550,
    )
    want = ref.run_chain(o, "default", row, history)
    seen32 = ref.run_chain(o, "default", row, history, entropy_floor=F32_TINY)
    assert want.temperature > 1.9
    assert seen32.temperature < 0.21
    token = o.into_chain("default").peek(row, history)
    assert token not in want.final
    assert token in seen32.final
    check_reference(o, "default", row, history)


def test_a_tie_float32_makes_at_a_cut_is_judged_on_float32_logits() -> None:
    """Found by the campaign (seed 2793612892, case 1398336): a bias of 1e30 on tokens 1 and
    6 of a row at 1e20 ties them in float32 (float64 still orders them by 1.3e21); Hugging
    Face's typical keeps both at its boundary, and top-n-sigma over that larger set keeps
    every token, where float64's set of one keeps only token 6. The chain's token is
    judged against the reference on float32 logits as well."""
    o = SampleOpts(
        temperature=1e30,
        top_k=282,
        typical_p=0.6727510690689087,
        top_n_sigma=2.540375232696533,
        frequency_penalty=1.6273422241210938,
        seed=5567584775169369863,
        logit_bias={1: 1e30, 6: 1e30, 10: -math.inf},
    )
    eighths = "58 58 -60 0 -72 28 -48 -66 -8 24 -18"
    row = np.array([float(v) * 1.25e19 for v in eighths.split()], dtype=np.float32)
    history = [3, 4, 1, 2, 1, 5, 5, 2, 0, 3, 5, 5]
    token = o.into_chain("hf").peek(row, history)
    want = ref.run_chain(o, "hf", row, history)
    seen32 = ref.run_chain(o, "hf", row, history, float32_logits=True)
    assert sorted(want.final) == [6]
    assert token not in want.final
    assert token in seen32.final
    check_reference(o, "hf", row, history)


def test_the_campaign_driver_checks_cases() -> None:
    """The PRNG driver draws valid cases and runs the same checks."""
    before = dict(EXECUTIONS)
    campaign(0.0, seed=1)
    assert EXECUTIONS["invariants"] - before["invariants"] == 256


if __name__ == "__main__":
    sys.exit(
        campaign(
            float(sys.argv[1]) if len(sys.argv) > 1 else 60.0,
            int(sys.argv[2]) if len(sys.argv) > 2 else None,
        )
    )
