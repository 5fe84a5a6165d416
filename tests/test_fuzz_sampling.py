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
``make fuzz-sampling``: ``python tests/test_fuzz_sampling.py SECONDS`` runs
these properties in rounds until the time is up and prints the executions.
"""

from __future__ import annotations

import math
import pickle
import sys
import time
from typing import Any

import numpy as np
import reference_samplers as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_lm import RlxError, SampleOpts

F32_MIN = float(np.finfo(np.float32).min)
EPS32 = 2.0**-24
PRESETS = ["default", "llama.cpp", "hf", "vllm"]
EXECUTIONS = {"reference": 0, "invariants": 0}

scales = st.sampled_from([1e-30, 1e-10, 1e-3, 0.1, 1.0, 4.0, 1e2, 1e4, 1e6, 1e9, 1e20, 1e30, 1e38])
grid = st.integers(-40, 40).map(lambda k: k / 4)
special = st.sampled_from([-math.inf, F32_MIN, -0.0, 0.0])


@st.composite
def rows(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(2, 40))
    scale = draw(scales)
    base = draw(st.lists(grid, min_size=n, max_size=n))
    vals = np.array(base, np.float64) * scale
    vals = np.clip(vals, -3.4e38, 3.4e38)
    for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        vals[i] = draw(special)
    row = vals.astype(np.float32)
    if not np.isfinite(row).any() or np.all(row == -np.inf):
        row[draw(st.integers(0, n - 1))] = np.float32(scale)
    return row


@st.composite
def opts(draw: st.DrawFn, vocab: int) -> SampleOpts:
    kw: dict[str, Any] = {"seed": draw(st.integers(0, 2**64 - 1))}
    f32 = lambda lo, hi: st.floats(lo, hi).map(lambda x: float(np.float32(x)))  # noqa: E731
    if draw(st.booleans()):
        kw["dynamic_temp"] = (draw(f32(0.1, 1.0)), draw(f32(1.0, 2.0)))
    else:
        kw["temperature"] = draw(st.sampled_from([0.0, 1e-40, 1e-30, 0.3, 0.7, 1.0, 1.5, 1e10]))
    if draw(st.booleans()):
        kw["top_k"] = draw(st.integers(1, 50))
    if draw(st.booleans()):
        kw["top_p"] = draw(f32(0.05, 1.0))
    if draw(st.booleans()):
        kw["min_p"] = draw(f32(0.0, 0.5))
    if draw(st.booleans()):
        kw["typical_p"] = draw(f32(0.2, 1.0))
    if draw(st.booleans()):
        kw["top_n_sigma"] = draw(f32(0.5, 3.0))
    if draw(st.booleans()):
        kw["xtc_prob"] = draw(f32(0.0, 1.0))
        kw["xtc_threshold"] = draw(f32(0.01, 0.5))
    if draw(st.booleans()):
        kw["repetition_penalty"] = draw(f32(0.8, 2.0))
        kw["frequency_penalty"] = draw(f32(0.0, 1.0))
        kw["presence_penalty"] = draw(f32(0.0, 1.0))
        kw["repetition_window"] = draw(st.sampled_from([-1, 4, 64]))
    if draw(st.booleans()):
        kw["dry_multiplier"] = draw(st.sampled_from([0.8, 3.0, 1e30]))
        kw["dry_allowed_length"] = draw(st.integers(1, 3))
        kw["dry_max_ngram"] = draw(st.sampled_from([0, 4, 32]))
    if draw(st.booleans()):
        toks = draw(st.lists(st.integers(0, vocab - 1), max_size=3, unique=True))
        kw["logit_bias"] = {t: draw(st.sampled_from([-math.inf, -2.0, 1.5, 1e30])) for t in toks}
    # min_keep only with a stage of every order that reads it (llama.cpp's top-k
    # does not); a min_keep no stage reads is refused as a no-op.
    reads_min_keep = (
        kw.get("top_p", 1.0) < 1
        or kw.get("min_p", 0.0) > 0
        or kw.get("typical_p", 1.0) < 1
        or kw.get("xtc_prob", 0.0) > 0
    )
    if reads_min_keep:
        kw["min_keep"] = draw(st.sampled_from([1, 1, 2, 5]))
    return SampleOpts(**kw)


@st.composite
def cases(draw: st.DrawFn) -> tuple[SampleOpts, str, np.ndarray, list[int]]:
    row = draw(rows())
    o = draw(opts(len(row)))
    order = draw(st.sampled_from(PRESETS))
    history = draw(st.lists(st.integers(0, min(len(row), 6) - 1), max_size=30))
    # Every stage at every scale, top-n-sigma included (its moments are taken
    # in float64: test_sampling_hostile pins the 1e-30 and 1e20 cases).
    return o, order, row, history


def rounding(o: SampleOpts, row: np.ndarray) -> float:
    """How far float32 arithmetic may move a scaled logit, in nats."""
    finite = row[np.isfinite(row)]
    m = float(np.abs(finite).max()) if finite.size else 0.0
    t = o.dynamic_temp[0] if o.dynamic_temp is not None else o.temperature
    m = m / t if t > 0 else m
    for b in o.logit_bias.values():
        if math.isfinite(b):
            m = max(m, abs(b))
    if o.dry_multiplier > 0:
        m = max(m, o.dry_multiplier)
    return 1e-5 + 256 * EPS32 * m


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
    EXECUTIONS["reference"] += 1
    want = ref.run_chain(o, order, row, history)
    tol = rounding(o, row)
    if tol < 0.05:
        if want.margin > 4 * tol:
            assert token == want.token, (token, want.token, want.margin, tol)
        return
    # float32 cannot resolve the decision: the token is one the reference
    # keeps, or tied with one within the rounding of the raw logits.
    if token in want.final:
        return
    t = o.dynamic_temp[1] if o.dynamic_temp is not None else max(o.temperature, 1e-45)
    near = [abs(float(row[token]) - float(row[k])) for k in want.final]
    assert min(near) <= tol * t * 4 + 1e-30, (token, sorted(want.final), tol)


SETTINGS = settings(suppress_health_check=list(HealthCheck), deadline=None)


def _property(case: tuple[SampleOpts, str, np.ndarray, list[int]]) -> None:
    check_reference(*case)


test_the_chain_matches_the_reference_at_every_scale = SETTINGS(given(cases())(_property))


def campaign(seconds: float) -> int:
    """Run the property in rounds of fresh random examples until time is up."""
    deadline = time.monotonic() + seconds
    rounds = 0
    run = settings(SETTINGS, max_examples=200, database=None, derandomize=False)(
        given(cases())(_property)
    )
    while time.monotonic() < deadline:
        run()
        rounds += 1
    print(
        f"sampler chain vs reference: {rounds} rounds, "
        f"{EXECUTIONS['invariants']} executions ({EXECUTIONS['reference']} compared "
        f"with the reference), no failure"
    )
    return 0


if __name__ == "__main__":
    sys.exit(campaign(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))
