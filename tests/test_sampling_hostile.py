"""Hostile input to the sampler chain (issue 16): one regression test per trigger.

Each test names the trigger it pins. Hangs are run in a child process with a
timeout, so that a regression fails the test instead of hanging the suite (the
hang held the GIL and ignored Ctrl-C).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest

from rlx_lm import (
    DtypeError,
    InvalidLogitsError,
    InvalidOptionError,
    MirostatMode,
    SampleOpts,
    argmax,
)

F32_MIN = float(np.finfo(np.float32).min)


def run_bounded(code: str, timeout: float = 60.0) -> str:
    """Run `code` in a fresh interpreter; fail (not hang) if it does not finish."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not finish within {timeout} s:\n{code}")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_top_p_returns_when_the_scaled_maximum_overflows_float32() -> None:
    # [3e38, 1, 2] / 0.7 overflows float32; at T = 1e-40 so does 1 / T.
    # Both used to loop forever inside top-p with the GIL held.
    out = run_bounded(
        """
        import numpy as np
        from rlx_lm import SampleOpts
        row = np.array([3e38, 1, 2], np.float32)
        for t in (0.7, 1e-40):
            for seed in range(20):
                chain = SampleOpts(temperature=t, top_p=0.9, seed=seed).into_chain()
                print(chain.sample(row), chain.sample(np.array([1, 5, 2], np.float32)))
        """
    )
    assert set(out.split()) == {"0", "1"}
    assert out.split()[::2] == ["0"] * 40
    assert out.split()[1::2] == ["1"] * 40


@pytest.mark.parametrize("t", [1e-40, 1e-38, 1e-30, 1e-20])
@pytest.mark.parametrize(
    "kw", [{}, {"top_p": 0.5}, {"top_k": 3}, {"min_p": 0.1}, {"typical_p": 0.5}]
)
def test_a_temperature_so_small_it_is_greedy_is_greedy(t: float, kw: dict[str, Any]) -> None:
    rng = np.random.default_rng(3)
    for seed in range(10):
        row = rng.normal(size=50).astype(np.float32) * 3
        chain = SampleOpts(temperature=t, seed=seed, **kw).into_chain()
        assert chain.sample(row) == argmax(row)


def test_a_vanishing_temperature_shares_the_mass_of_tokens_tied_at_the_maximum() -> None:
    # The limit of softmax(l / T) as T -> 0, as +inf logits share theirs.
    row = np.array([1.0, 7.0, 7.0, 3.0], np.float32)
    seen = {
        SampleOpts(temperature=1e-40, top_p=0.9, seed=s).into_chain().sample(row) for s in range(64)
    }
    assert seen == {1, 2}
    r = (
        SampleOpts(temperature=1e-40, seed=1)
        .into_chain()
        .sample_with_logprobs(row, None, 4, mode="final")
    )
    assert r.logprob == pytest.approx(-math.log(2))
    assert [t for t, _ in r.top] == [1, 2]


@pytest.mark.parametrize(
    "kw",
    [
        {"top_p": 0.9},
        {"typical_p": 0.5},
        {"xtc_prob": 1.0, "xtc_threshold": 0.1},
        {"top_n_sigma": 1.0},
        {"min_p": 0.2},
        {"mirostat": MirostatMode.V2},
        {"mirostat": MirostatMode.V1},
        {},
    ],
)
def test_rows_masked_with_the_float32_minimum_do_not_panic(kw: dict[str, Any]) -> None:
    # finfo(float32).min / 0.7 is -inf: a row of such masks used to panic
    # (PanicException, which `except Exception` does not catch) in the draw.
    all_masked = np.full(10, F32_MIN, np.float32)
    partly = all_masked.copy()
    partly[[2, 7]] = [1.0, 1.5]
    for seed in range(16):
        chain = SampleOpts(temperature=0.7, seed=seed, **kw).into_chain()
        assert 0 <= chain.sample(all_masked) < 10
        assert chain.sample(partly) in (2, 7)
        r = chain.sample_with_logprobs(partly, None, 3, mode="final")
        assert r.token in (2, 7)
        assert r.logprob <= 0
        assert math.isfinite(r.logprob)


SCALES = [10.0**e for e in range(-30, 39, 4)] + [3e38]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("t", [0.7, 1.0, 1.5])
def test_log_probabilities_are_at_most_zero_and_masses_sane_at_every_scale(
    scale: float, t: float
) -> None:
    # |logit| / T above about 1e5 used to give log-probabilities above 0 or
    # NaN: the fused multiply-add residual left the fast exponential's domain.
    rng = np.random.default_rng(int(math.log10(scale) + 40))
    with np.errstate(over="ignore"):
        row = (rng.uniform(-1, 1, 300) * scale).astype(np.float32)
    row = np.where(np.isfinite(row), row, np.float32(F32_MIN)).astype(np.float32)
    for kw in ({}, {"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05}):
        chain = SampleOpts(temperature=t, seed=7, **kw).into_chain()
        for mode in ("raw", "final"):
            r = chain.sample_with_logprobs(row, None, 300, mode=mode)
            lps = np.array([lp for _, lp in r.top])
            assert math.isfinite(r.logprob), (mode, r)
            assert r.logprob <= 0, (mode, r)
            assert np.all(lps <= 0), (mode, r.top[:3])
            assert not np.any(np.isnan(lps)), (mode, r.top[:3])
            mass = float(np.exp(lps).sum())
            assert mass == pytest.approx(1.0, abs=1e-4), (mode, mass)
            # The best-ranked token of a distribution is never less likely than another.
            assert lps[0] == lps.max()


@pytest.mark.parametrize("scale", [1e5, 1e7, 1e9, 1e20, 1e37])
def test_tokens_at_large_scales_come_from_the_right_place(scale: float) -> None:
    # A row where one token is ahead by a margin that is many ulps wide at
    # every scale: it must hold all the mass (it used to lose it to the
    # residual's garbage exponential).
    row = (np.array([0.5, 1.0, 0.25, -1.0, 0.9]) * scale).astype(np.float32)
    for t in (0.7, 1.3):
        for kw in ({}, {"top_p": 0.95}, {"top_k": 3}):
            tokens = {
                SampleOpts(temperature=t, seed=s, **kw).into_chain().sample(row) for s in range(16)
            }
            assert tokens == {1}, (t, kw, tokens)


def test_mirostat_mu_stays_finite() -> None:
    # Huge learning rates and surprises used to drive mu to inf and then NaN.
    row = np.array([3e38, 0, -3e38, 1e30, -1e30], np.float32)
    for mode in (MirostatMode.V1, MirostatMode.V2):
        for eta, tau in ((3e38, 3e38), (3e38, 0.0), (1e30, 5.0), (0.0, 3e38)):
            chain = SampleOpts(
                mirostat=mode, mirostat_eta=eta, mirostat_tau=tau, seed=1
            ).into_chain()
            for step in range(12):
                # Both paths that move mu: sample() alone, and peek() + accept().
                r = row if step % 2 else -row
                if step % 4 < 2:
                    chain.sample(r)
                else:
                    chain.accept(chain.peek(r))
                assert chain.step == step + 1
                mu = chain.mu
                assert mu is not None
                assert math.isfinite(mu), (mode, eta, tau, step, mu)


@pytest.mark.parametrize(
    ("kw", "order"),
    [
        ({"top_k": 1, "temperature": 1.0}, None),
        ({"top_k": 1, "temperature": 1.0}, "llama.cpp"),
        ({"top_k": 5, "temperature": 0.0}, "llama.cpp"),
        ({"top_p": 1e-6, "temperature": 1.0}, None),
        ({"top_p": 1e-6, "temperature": 1.0, "logit_bias": {2: -1.0}}, None),
        ({"mirostat": MirostatMode.V2, "mirostat_tau": 0.0}, None),
    ],
)
def test_signed_zero_ties_break_as_the_argmax_breaks_them(
    kw: dict[str, Any], order: str | None
) -> None:
    # -0.0 and +0.0 are equal; the ranked paths used to put +0.0 first.
    for row in ([-0.0, 0.0, -1.0], [0.0, -0.0, -1.0], [-3.0, -0.0, -0.0, 0.0]):
        r = np.array(row, np.float32)
        best = argmax(r)
        assert SampleOpts(seed=1, **kw).into_chain(order).sample(r) == best, (row, kw)


def test_a_large_dry_penalty_pushes_a_token_down_but_does_not_ban_it() -> None:
    # multiplier * base^n used to overflow to inf: the token was banned, and
    # a row with no other token raised "every logit is -inf".
    history = [0, 1, 2, 0, 1, 2, 0, 1]
    opts = SampleOpts(temperature=1.0, dry_multiplier=3e38, dry_base=4.0, seed=1)
    row = np.array([-5.0, -math.inf, 1.0, -math.inf], np.float32)
    # Token 2 extends the repeat: penalised to the bottom, still sampleable.
    chain = opts.into_chain()
    assert chain.sample(row, history) == 0
    only = np.array([-math.inf, -math.inf, 1.0, -math.inf], np.float32)
    assert chain.sample(only, history) == 2
    for order in (None, "llama.cpp", "hf"):
        c = SampleOpts(temperature=1.0, dry_multiplier=3e38, top_k=2, seed=1).into_chain(order)
        assert c.sample(only, history) == 2


def test_a_large_logit_bias_saturates_instead_of_making_infinity() -> None:
    row = np.array([3e38, 3e38, 0.0], np.float32)
    for kw in ({"temperature": 1.0}, {"temperature": 0.5, "top_p": 0.9}, {"top_k": 2}):
        chain = SampleOpts(logit_bias={0: 3e38, 2: -3e38}, seed=3, **kw).into_chain()
        r = chain.sample_with_logprobs(row, None, 3, mode="penalized")
        assert r.token in (0, 1)
        assert all(math.isfinite(lp) and lp <= 0 for _, lp in r.top[:2]), r


def test_every_logit_banned_is_still_a_typed_error() -> None:
    chain = SampleOpts(temperature=0.7, top_p=0.9, seed=1).into_chain()
    with pytest.raises(InvalidLogitsError):
        chain.sample(np.full(5, -np.inf, np.float32))


# --- the binding: refused input, panics, threads, detached calls -------------


def test_masked_arrays_are_refused_not_read_without_their_mask() -> None:
    m = np.ma.masked_array(np.array([5, 1, 0], np.float32), mask=[True, False, False])
    chain = SampleOpts(temperature=1.0, seed=1).into_chain()
    with pytest.raises(DtypeError, match="masked"):
        chain.sample(m)
    with pytest.raises(DtypeError, match="masked"):
        argmax(m)
    hist = np.ma.masked_array(np.array([1, 2], np.int64), mask=[True, False])
    with pytest.raises(DtypeError, match="masked"):
        chain.sample(np.zeros(3, np.float32), hist)


@pytest.mark.parametrize(
    "history",
    [b"\x01\x02", bytearray(b"\x01"), memoryview(b"\x01"), "ab", [1.0, 2.0], [True], [1, 2.5]],
)
def test_histories_of_bytes_bools_or_floats_are_refused(history: object) -> None:
    chain = SampleOpts(temperature=1.0, repetition_penalty=1.5, seed=1).into_chain()
    with pytest.raises(DtypeError):
        chain.sample(np.zeros(300, np.float32), history)  # type: ignore[arg-type]


@pytest.mark.parametrize("token", [1.0, 1.5, True, np.float64(2.0), "1"])
def test_accept_refuses_a_token_that_is_not_an_integer(token: object) -> None:
    chain = SampleOpts(temperature=1.0, seed=1).into_chain()
    chain.peek(np.zeros(8, np.float32))
    with pytest.raises(DtypeError):
        chain.accept(token)  # type: ignore[arg-type]
    assert chain.step == 0
    chain.accept(np.int64(3))
    assert chain.step == 1


def test_sequence_ids_must_be_integers() -> None:
    chain = SampleOpts(temperature=1.0, seed=1).into_chain()
    logits = np.zeros((2, 8), np.float32)
    with pytest.raises(DtypeError):
        chain.sample_batch(logits, sequence_ids=[0, 1.5])  # type: ignore[list-item]
    with pytest.raises(InvalidOptionError):
        chain.sample_batch(logits, sequence_ids=[0, -1])
    assert list(chain.sample_batch(logits, sequence_ids=[np.uint64(3), 4], advance=False)) == list(
        chain.sample_batch(logits, sequence_ids=[3, 4])
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 1e39),
        ("temperature", 1e-50),
        ("top_p", 1e-50),
        ("min_p", 1e-60),
        ("mirostat_eta", 1e300),
        ("dry_multiplier", 5e-46),
    ],
)
def test_float64_knobs_that_float32_cannot_hold_are_refused(field: str, value: float) -> None:
    # They used to be narrowed silently: 1e-50 became 0 (greedy, or "top_p
    # must be in (0, 1], got 0"), 1e39 became inf.
    with pytest.raises(InvalidOptionError, match=f"{field}.*float32"):
        SampleOpts(seed=1, **{field: value}).into_chain()


def test_float64_knobs_narrow_only_in_their_documented_rounding() -> None:
    with pytest.raises(InvalidOptionError, match=r"logit_bias.*float32"):
        SampleOpts(seed=1, logit_bias={1: -1e39}).into_chain()
    with pytest.raises(InvalidOptionError, match=r"dynamic_temp.*float32"):
        SampleOpts(seed=1, dynamic_temp=(1e-50, 1.0)).into_chain()
    # Ordinary values round to the nearest float32 and are accepted.
    chain = SampleOpts(temperature=0.1, top_p=0.3, seed=1).into_chain()
    assert chain.stages == ["temperature", "top_p", "dist"]


def test_a_panic_in_the_core_is_an_internal_error_not_a_panic_exception() -> None:
    from rlx_lm import InternalError, RlxError
    from rlx_lm._core import _panic_for_tests

    with pytest.raises(InternalError, match="boom") as info:
        _panic_for_tests("boom")
    assert isinstance(info.value, RlxError)
    assert isinstance(info.value, Exception)


def test_a_chain_shared_by_two_threads_has_a_defined_behaviour() -> None:
    # One thread in sample_batch (GIL released) while another samples and
    # accepts on the same chain: this used to raise "Already borrowed".
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 1 << 17)).astype(np.float32)
    row = logits[0].copy()
    chain = SampleOpts(temperature=1.0, top_p=0.9, seed=5).into_chain()
    want_batch = chain.clone().sample_batch(logits)
    errors: list[BaseException] = []
    batches: list[list[int]] = []

    def batch_worker() -> None:
        try:
            for _ in range(6):
                batches.append(list(chain.clone().sample_batch(logits)))
                batches.append(list(chain.sample_batch(logits, advance=False)))
        except BaseException as e:  # pragma: no cover - the failure being tested
            errors.append(e)

    threads = [threading.Thread(target=batch_worker) for _ in range(2)]
    for t in threads:
        t.start()
    tokens = []
    for _ in range(40):
        tokens.append(chain.peek(row))
    for t in threads:
        t.join()
    assert errors == []
    assert len(batches) == 24
    assert all(b == list(want_batch) for b in batches)
    # peek() is pure: the same token at the same step, whatever ran beside it.
    assert len(set(tokens)) == 1
    assert chain.step == 0
    assert chain.sample(row) == tokens[0]
    assert chain.step == 1


def test_resizing_the_logits_during_sample_batch_is_refused_not_a_crash() -> None:
    # numpy's unsafe resize(refcheck=False) used to free the buffer a
    # detached sample_batch was reading: a segfault. The array is pinned.
    out = run_bounded(
        """
        import threading
        import time
        import numpy as np
        from rlx_lm import SampleOpts
        rng = np.random.default_rng(0)
        chain = SampleOpts(temperature=1.0, top_p=0.9, seed=1).into_chain()
        refused, resized = [], []
        def resizer(a, done):
            # Grow the array (a realloc that frees the old buffer) over and
            # over: between calls it may succeed, during one it must not.
            while not done.is_set():
                try:
                    a.resize((a.shape[0] + 1, a.shape[1]), refcheck=False)
                    resized.append(1)
                except ValueError:
                    refused.append(1)
        base = rng.normal(size=(16, 1 << 16)).astype(np.float32)
        done = threading.Event()
        t = threading.Thread(target=resizer, args=(base, done))
        t.start()
        for _ in range(40):
            assert len(chain.sample_batch(base)) == base.shape[0]
        done.set()
        t.join()
        # A view: its base owns the buffer, and is pinned too. A long batch
        # runs in a thread; once it is inside, resizing the base must fail.
        base = rng.normal(size=(64, 1 << 17)).astype(np.float32)
        view = base[1:]
        inside = threading.Event()
        def batch():
            inside.set()
            for _ in range(5):
                chain.sample_batch(view)
        w = threading.Thread(target=batch)
        w.start()
        inside.wait()
        time.sleep(0.05)
        try:
            base.resize((70, 1 << 17), refcheck=False)
            print("RESIZED UNDER A CALL")
        except ValueError:
            print("view pinned")
        w.join()
        print("refused", len(refused) > 0)
        """
    )
    assert "refused True" in out
    assert "view pinned" in out


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e-10, 1.0, 1e10, 1e20, 1e30, 1e37])
@pytest.mark.parametrize("first", [True, False])
def test_top_n_sigma_moments_hold_at_every_scale(scale: float, first: bool) -> None:
    # Top-n-sigma took its mean and standard deviation in float32 on the raw
    # row: near 1e20 the squares overflowed (sigma inf, nothing cut), near
    # 1e-30 they underflowed (sigma 0, only the max kept). The moments are now
    # accumulated in float64; the cut is the float64 reference's at every scale.
    base = np.array([2.0, 1.5, 1.0, 0.25, -1.0, -3.0, 0.5, -0.5])
    row = (base * scale).astype(np.float32)
    vals = row.astype(np.float64)
    for n in (0.5, 1.0, 2.0):
        want = {i for i, v in enumerate(vals) if v >= vals.max() - n * vals.std()}
        # A temperature equal to the scale brings the survivors' probabilities
        # back to ordinary sizes, so the final distribution shows every one.
        order = ["top_n_sigma", "temperature"] if first else ["temperature", "top_n_sigma"]
        chain = SampleOpts(temperature=scale, top_n_sigma=n, seed=1).into_chain(order)
        r = chain.sample_with_logprobs(row, None, len(row), mode="final", advance=False)
        got = {t for t, lp in r.top if lp > -math.inf}
        assert got == want, (scale, n, first, sorted(got), sorted(want))
        assert 1 < len(want) < len(row), n


def test_an_options_object_missing_a_knob_is_refused_by_the_knobs_name() -> None:
    # issue 15: SamplerChain(object()) leaked Python's bare AttributeError.
    from rlx_lm import SamplerChain

    # The knobs are read in the core table's order, temperature first.
    with pytest.raises(InvalidOptionError, match=r"^temperature: missing \(the object passed"):
        SamplerChain(object())
    fields = {f: getattr(SampleOpts(), f) for f in ("top_k", "repetition_window")}
    partial = type("PartialOpts", (), fields)()
    with pytest.raises(InvalidOptionError, match=r"PartialOpts passed"):
        SamplerChain(partial)


def test_a_knob_whose_property_raises_keeps_its_own_error() -> None:
    from rlx_lm import SamplerChain

    class Raising:
        @property
        def temperature(self) -> float:
            raise KeyError("the property's own failure")

    with pytest.raises(KeyError, match="own failure"):
        SamplerChain(Raising())


def test_a_chain_reentered_from_its_own_argument_is_a_sequence_state_error() -> None:
    # accept() holds the chain while it reads the token; a token whose __index__
    # samples from the same chain meets a typed error (through the one mapping),
    # not PyO3's bare "Already borrowed".
    from rlx_lm import SequenceStateError

    chain = SampleOpts(temperature=1.0, seed=2).into_chain()
    row = np.zeros(8, np.float32)
    seen: list[BaseException] = []

    class Reentrant:
        def __index__(self) -> int:
            try:
                chain.sample(row)
            except BaseException as e:
                seen.append(e)
            return 1

    chain.peek(row)
    chain.accept(Reentrant())
    assert len(seen) == 1, seen
    assert isinstance(seen[0], SequenceStateError), seen
    assert "in use by a call" in str(seen[0])
    assert chain.step == 1
