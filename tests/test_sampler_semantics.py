"""Semantics the presets owe their engines, and knobs that must never be silently ignored."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_lm import InvalidOptionError, MirostatMode, SampleOpts


def logits_of(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, np.float64)).astype(np.float32)


def survivors(opts: SampleOpts, row: np.ndarray, order: str | None = None) -> dict[int, float]:
    chain = opts.into_chain(order)
    r = chain.sample_with_logprobs(row, None, top_n=len(row), mode="final", advance=False)
    return {t: math.exp(lp) for t, lp in r.top}


# --- llama.cpp's mirostat chain ----------------------------------------------------


@pytest.mark.parametrize("mode", [MirostatMode.V1, MirostatMode.V2])
def test_llama_cpp_mirostat_at_temperature_zero_is_the_argmax(mode: MirostatMode) -> None:
    # llama.cpp: logit bias -> temp(0) (keeps only the max) -> mirostat.
    row = np.zeros(200, np.float32)
    row[17] = 0.5
    opts = SampleOpts(mirostat=mode, temperature=0.0, seed=3, logit_bias={40: 0.25})
    chain = opts.into_chain("llama.cpp")
    assert chain.stages == ["logit_bias", "temperature", f"mirostat_v{int(mode)}"]
    assert {chain.sample(row) for _ in range(30)} == {17}
    biased = SampleOpts(mirostat=mode, seed=3, logit_bias={40: 1.0}).into_chain("llama.cpp")
    assert biased.sample(row) == 40, "the bias runs before temperature"


def test_llama_cpp_mirostat_with_temperature_tempers_before_the_cut() -> None:
    row = logits_of([0.5, 0.25, 0.125, 0.0625, 0.0625])
    hot = SampleOpts(mirostat=MirostatMode.V2, temperature=2.0, mirostat_tau=10.0, seed=1)
    got = survivors(hot, row, "llama.cpp")
    want = np.exp(row.astype(np.float64) / 2.0)
    want /= want.sum()
    assert [got[t] for t in range(5)] == pytest.approx(want.tolist(), rel=1e-5)


# --- Hugging Face's warpers -------------------------------------------------------------


def test_hf_typical_keeps_every_token_tied_with_the_boundary() -> None:
    # Four equal tokens have equal typicality scores: HF's warper keeps them all
    # (score <= the boundary's); llama.cpp stops at the boundary token.
    row = logits_of([0.25, 0.25, 0.25, 0.25])
    opts = SampleOpts(temperature=1.0, typical_p=0.5, seed=1)
    assert len(survivors(opts, row, "hf")) == 4
    assert len(survivors(opts, row, "llama.cpp")) == 3  # cum .75 > .5 at the third
    assert len(survivors(opts, row)) == 3


def test_hf_typical_applies_min_keep_after_its_cut() -> None:
    row = logits_of([0.7, 0.1, 0.1, 0.05, 0.05])
    opts = SampleOpts(temperature=1.0, typical_p=0.05, min_keep=4, seed=1)
    assert len(survivors(opts, row, "hf")) >= 4


def test_hf_top_k_keeps_at_least_min_keep() -> None:
    # TopKLogitsWarper(top_k, min_tokens_to_keep): k = max(top_k, min_tokens_to_keep).
    row = logits_of([0.4, 0.3, 0.2, 0.1])
    opts = SampleOpts(temperature=1.0, top_k=1, min_keep=3, seed=1)
    assert set(survivors(opts, row, "hf")) == {0, 1, 2}
    assert set(survivors(opts, row)) == {0, 1, 2}, "the default order honours it too"


@pytest.mark.parametrize("order", ["llama.cpp", "vllm"])
def test_min_keep_that_no_stage_reads_is_refused(order: str) -> None:
    # llama.cpp's and vLLM's top-k take no min_keep: with only top-k it would do nothing.
    with pytest.raises(InvalidOptionError, match=r"^min_keep: 3 but no stage of this chain"):
        SampleOpts(temperature=1.0, top_k=1, min_keep=3).into_chain(order)
    assert SampleOpts(temperature=1.0, top_k=1, top_p=0.5, min_keep=3).into_chain(order)


def test_min_keep_alone_is_refused_at_construction() -> None:
    with pytest.raises(InvalidOptionError, match=r"^min_keep: 2 but no stage"):
        SampleOpts(temperature=1.0, min_keep=2)


# --- top-p at an exact boundary --------------------------------------------------------


@pytest.mark.parametrize(
    ("probs", "p", "kept"),
    [
        ([0.5, 0.3, 0.2], 0.8, 2),  # a prefix with mass exactly p
        ([0.4, 0.3, 0.2, 0.1], 0.7, 2),  # llama.cpp's test-sampling case
        ([0.3, 0.1, 0.1, 0.5], 0.8, 2),  # transformers' TopPLogitsWarper case
        ([0.15, 0.3, 0.3, 0.25], 0.8, 3),
        ([0.25, 0.25, 0.25, 0.25], 0.5, 2),
    ],
)
def test_top_p_at_an_exact_boundary_keeps_what_the_engines_keep(
    probs: list[float], p: float, kept: int
) -> None:
    row = logits_of(probs)
    for order in (None, "llama.cpp", "hf", "vllm"):
        got = survivors(SampleOpts(temperature=1.0, top_p=p, seed=1), row, order)
        assert len(got) == kept, (order, got)
    # Also on a whole vocabulary row, where top-p gathers from the dense row.
    big = np.full(5000, -np.inf, np.float32)
    big[: len(probs)] = row
    got = survivors(SampleOpts(temperature=1.0, top_p=p, seed=1), big)
    assert len(got) == kept


# --- DRY's exponent clamp -----------------------------------------------------------------


def test_dry_exponent_clamp_is_llama_cpps_float32_value() -> None:
    # int(88.7228391f / logf(2.0f)) is 128 in llama.cpp (float64 gives 127.99... -> 127).
    row = np.zeros(8, np.float32)
    opts = SampleOpts(
        temperature=1.0,
        dry_multiplier=2.0**-125,
        dry_base=2.0,
        dry_allowed_length=2,
        dry_max_ngram=0,
        seed=1,
    )
    r = opts.into_chain().sample_with_logprobs(row, [5] * 300, 8, mode="penalized")
    lp = dict(r.top)
    # 2**-125 * 2**128 = 8 below every other token (127 would give 4).
    assert lp[5] - lp[0] == pytest.approx(-8.0, abs=1e-5)


# --- penalty scopes -------------------------------------------------------------------------


def penalized(
    opts: SampleOpts, order: str | None, history: list[int], prompt_len: int = 0
) -> dict[int, float]:
    row = np.ones(300, np.float32)
    chain = opts.into_chain(order)
    r = chain.sample_with_logprobs(
        row, history, len(row), mode="penalized", prompt_len=prompt_len, advance=False
    )
    lp = dict(r.top)
    return {t: lp[t] - lp[299] for t in range(300)}  # logits relative to an unseen token


@pytest.mark.parametrize(
    ("order", "whole"), [(None, False), ("llama.cpp", False), ("hf", True), ("vllm", True)]
)
def test_each_preset_has_its_engines_penalty_window(order: str | None, whole: bool) -> None:
    # Token 7 only appears more than 64 tokens back.
    history = [7, *range(100, 200)]
    opts = SampleOpts(temperature=1.0, presence_penalty=1.0, seed=1)
    got = penalized(opts, order, history)
    assert got[7] == pytest.approx(-1.0 if whole else 0.0, abs=1e-5)
    assert got[150] == pytest.approx(-1.0, abs=1e-5)
    # A window given explicitly wins everywhere.
    assert penalized(
        SampleOpts(temperature=1.0, presence_penalty=1.0, repetition_window=-1, seed=1),
        order,
        history,
    )[7] == pytest.approx(-1.0, abs=1e-5)
    assert penalized(
        SampleOpts(temperature=1.0, presence_penalty=1.0, repetition_window=8, seed=1),
        order,
        history,
    )[150] == pytest.approx(0.0, abs=1e-5)


def test_vllm_counts_frequency_and_presence_on_the_output_only() -> None:
    # Prompt [5, 5, 6], output [6, 8]: repetition penalty on 5, 6, 8 (prompt + output),
    # frequency and presence on 6 and 8 (output) only, once each.
    history = [5, 5, 6, 6, 8]
    opts = SampleOpts(
        temperature=1.0,
        repetition_penalty=2.0,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        seed=1,
    )
    got = penalized(opts, "vllm", history, prompt_len=3)
    # Logits of 1: the repetition penalty halves them (-0.5 against an unseen token).
    assert got[5] == pytest.approx(-0.5, abs=1e-5)  # repetition only
    assert got[6] == pytest.approx(-1.25, abs=1e-5)  # and one output occurrence
    assert got[8] == pytest.approx(-1.25, abs=1e-5)
    # Without a prompt length the whole history is output (and elsewhere it always is).
    assert penalized(opts, "vllm", history)[5] == pytest.approx(-1.75, abs=1e-5)
    assert penalized(opts, "llama.cpp", history, prompt_len=3)[5] == pytest.approx(-1.75, abs=1e-5)
    with pytest.raises(InvalidOptionError, match="prompt_len"):
        opts.into_chain("vllm").sample(np.zeros(10, np.float32), [1, 2], prompt_len=3)
