"""The conformance kit: a correct runner passes; each broken one is caught by the right clause."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from conformance_runners import (
    DEFECTS,
    VOCAB,
    CoreOnly,
    NonDeterministic,
    OffByOneDecode,
    ToyRunner,
    logits_at,
    states,
)

from rlx_lm import InvalidOptionError, with_defaults
from rlx_lm.runner import LmCore, LmRunner, SupportsHostDriven, SupportsPromptCache
from rlx_lm.testing import (
    CLAUSES,
    ClauseResult,
    ConformanceError,
    Report,
    check_runner,
    clause_names,
    require_hypothesis,
    run_clause,
)
from rlx_lm.testing.capabilities import MEMBERS

# Few examples keep the suite fast; every defect shows on the smallest prompt anyway.
FAST = {"max_examples": 10}


def test_the_correct_toy_passes_every_clause() -> None:
    report = check_runner(ToyRunner, **FAST)
    assert report.clauses() == clause_names()
    assert [r.clause for r in report.passes] == clause_names(), report.format()
    report.raise_for_failures()


def test_a_core_only_runner_passes_through_the_defaults_and_skips_what_it_lacks() -> None:
    report = check_runner(CoreOnly, **FAST)
    assert report.ok, report.format()
    assert {r.clause for r in report.skips} == {
        "sessions.roundtrip",
        "sessions.reuse",
        "sessions.foreign",
        "multimodal.phases",
    }
    assert "HostDriven" in report["host_driven.decode"].message
    assert "with_defaults" in report["greedy.stop"].message
    assert "does not claim sessions" in report["sessions.reuse"].message


def test_the_defaults_adapter_is_itself_a_conforming_runner() -> None:
    # RunnerAdapter defines the pair but raises UnsupportedError: the kit must fall back
    # to HostDriven rather than report the adapter's documented refusal.
    report = check_runner(lambda: with_defaults(CoreOnly()), **FAST)
    assert report.ok, report.format()
    assert "HostDriven" in report["host_driven.prefill"].message


@pytest.mark.parametrize("defect", list(DEFECTS), ids=list(DEFECTS))
def test_each_defect_is_reported_by_its_clause(defect: str) -> None:
    runner_class, clause = DEFECTS[defect]
    report = check_runner(runner_class, **FAST)
    assert clause in report.failed_clauses, report.format()
    if runner_class is not NonDeterministic:
        # Noise in predict_logits legitimately breaks every clause that compares against
        # it; every other defect must be pinned to exactly one clause.
        assert report.failed_clauses == {clause}, report.format()
    failure = report[clause]
    assert failure.message
    with pytest.raises(ConformanceError, match=clause):
        report.raise_for_failures()


def test_a_failure_is_shrunk_to_a_minimal_example_and_printed() -> None:
    report = check_runner(OffByOneDecode, clauses=["host_driven.decode"], max_examples=30)
    failure = report["host_driven.decode"]
    assert failure.example == {"prompt": [0], "continuation": [0]}
    assert "decode_logits(0) after prefill_logits([0])" in failure.message
    assert "predict_logits([0, 0])" in failure.message
    assert "falsifying example: prompt=[0], continuation=[0]" in report.format()


def test_the_printed_example_reproduces_the_failure() -> None:
    report = check_runner(OffByOneDecode, clauses=["host_driven.decode"], **FAST)
    example = report["host_driven.decode"].example
    assert example is not None
    runner = OffByOneDecode()
    runner.prefill_logits(example["prompt"])
    got = runner.decode_logits(example["continuation"][0])
    want = OffByOneDecode().predict_logits([*example["prompt"], example["continuation"][0]])
    assert not np.allclose(got, want)


def test_non_determinism_is_named_when_a_failure_does_not_replay() -> None:
    predictions = itertools.count()

    class WrongOnce(ToyRunner):
        """Only the first predict_logits of the whole run is wrong, so it cannot replay."""

        def predict_logits(self, prompt_ids: Sequence[int], /) -> Any:
            row = super().predict_logits(prompt_ids)
            return -row if next(predictions) == 0 else row

    report = check_runner(WrongOnce, clauses=["host_driven.prefill"], **FAST)
    failure = report["host_driven.prefill"]
    assert failure.failed
    assert "did not reproduce when the example was replayed" in failure.message


class SlightlyOffDecode(ToyRunner):
    """decode_logits is off by 1e-3 everywhere, as a cached float path might be."""

    def decode_logits(self, token: int, /) -> Any:
        return super().decode_logits(token) + np.float32(1e-3)


def test_tolerances_are_parameters() -> None:
    strict = check_runner(SlightlyOffDecode, clauses=["host_driven.decode"], **FAST)
    assert strict.failed_clauses == {"host_driven.decode"}
    assert "atol=0.0001" in strict["host_driven.decode"].message
    loose = check_runner(SlightlyOffDecode, clauses=["host_driven.decode"], atol=1e-2, **FAST)
    assert loose.ok, loose.format()


class TieBreaksHigh(ToyRunner):
    """Logits with a two-way tie at the top; generate picks the higher index of the pair."""

    def _logits(self, state: int) -> Any:
        row = logits_at(state, self.vocab_size)
        row[:2] = row.max() + 1.0
        return row

    def generate(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        out = [1] * n_new
        for i, t in enumerate(out):
            if on_token is not None and not on_token(t):
                return out[: i + 1]
        return out


def test_greedy_accepts_a_different_token_only_within_the_tolerance() -> None:
    report = check_runner(TieBreaksHigh, clauses=["greedy"], **FAST)
    assert report.ok, report.format()

    class NotATie(TieBreaksHigh):
        def _logits(self, state: int) -> Any:
            row = super()._logits(state)
            row[1] -= 0.01
            return row

    report = check_runner(NotATie, clauses=["greedy.argmax"], **FAST)
    assert report.failed_clauses == {"greedy.argmax"}
    assert "argmax of predict_logits" in report["greedy.argmax"].message


def test_generate_must_produce_n_new_tokens_when_never_stopped() -> None:
    class StopsEarly(ToyRunner):
        def generate(self, prompt_ids: Sequence[int], n_new: int, on_token: Any = None, /) -> Any:
            return super().generate(prompt_ids, min(n_new, 1), on_token)

    report = check_runner(StopsEarly, clauses=["greedy.argmax"], **FAST)
    assert report.failed_clauses == {"greedy.argmax"}
    assert "returned 1 tokens" in report["greedy.argmax"].message
    assert report["greedy.argmax"].example == {"prompt": [0], "n_new": 2}


def test_a_runner_that_raises_is_reported_with_the_call_and_the_error() -> None:
    class Crashes(ToyRunner):
        def decode_logits(self, token: int, /) -> Any:
            raise KeyError("cache slot")

    report = check_runner(Crashes, clauses=["host_driven.decode"], **FAST)
    message = report["host_driven.decode"].message
    assert "decode_logits(0) after prefill_logits([0]) raised KeyError" in message


def test_a_factory_that_raises_fails_structure_and_skips_the_rest() -> None:
    def factory() -> object:
        raise OSError("weights not found")

    report = check_runner(factory, **FAST)
    assert report.failed_clauses == {
        "structure.members",
        "structure.family",
        "structure.vocab_size",
    }
    assert "factory() raised OSError: weights not found" in report["structure.family"].message
    assert all("weights not found" in r.message for r in report.skips)


def test_missing_core_members_are_named() -> None:
    class NoPredict:
        family = "x"
        vocab_size = 4

    report = check_runner(NoPredict, **FAST)
    assert "missing required method predict_logits(prompt_ids)" in (
        report["structure.members"].message
    )
    assert {r.clause for r in report.skips} == set(clause_names()) - {
        "structure.members",
        "structure.family",
        "structure.vocab_size",
    }


def test_half_a_pair_is_reported() -> None:
    class PrefillOnly(CoreOnly):
        def prefill_logits(self, tokens: Sequence[int], /) -> Any:
            return self.predict_logits(tokens)

    report = check_runner(PrefillOnly, clauses=["structure"], **FAST)
    assert "has prefill_logits but not decode_logits" in report["structure.members"].message


def test_sessions_need_the_tokens_that_produced_them() -> None:
    class WrongTokens(ToyRunner):
        def export_session(self) -> Any:
            snap = super().export_session()
            if snap is not None:
                object.__setattr__(snap, "tokens", snap.tokens[:-1])
            return snap

    report = check_runner(WrongTokens, clauses=["sessions.roundtrip"], **FAST)
    assert report.failed_clauses == {"sessions.roundtrip"}
    assert "has tokens []; expected [0]" in report["sessions.roundtrip"].message


def test_a_foreign_snapshot_must_raise_a_value_error() -> None:
    class ReturnsFalse(ToyRunner):
        def restore_session(self, snapshot: Any, /) -> bool:
            if snapshot.fingerprint != self._fingerprint():
                return False
            return super().restore_session(snapshot)

    report = check_runner(ReturnsFalse, clauses=["sessions.foreign"], **FAST)
    assert report.failed_clauses == {"sessions.foreign"}
    assert "returned False" in report["sessions.foreign"].message


def test_the_member_table_is_read_from_the_protocols() -> None:
    names = {m.name for m in MEMBERS}
    for proto in (LmCore, LmRunner, SupportsHostDriven, SupportsPromptCache):
        declared = {n for n in vars(proto) if not n.startswith("_")}
        assert declared <= names
    required = {m.name for m in MEMBERS if m.required}
    assert required == {"family", "vocab_size", "predict_logits"}
    generate = next(m for m in MEMBERS if m.name == "generate")
    assert (generate.params, generate.n_required) == (("prompt_ids", "n_new", "on_token"), 2)


def test_clauses_are_selected_by_name_or_group() -> None:
    report = check_runner(ToyRunner, clauses=["sessions", "logits.row"], **FAST)
    assert report.clauses() == [
        "logits.row",
        "sessions.roundtrip",
        "sessions.reuse",
        "sessions.foreign",
    ]
    with pytest.raises(InvalidOptionError, match="unknown clause"):
        check_runner(ToyRunner, clauses=["sessionz"])
    with pytest.raises(InvalidOptionError, match="unknown clause"):
        run_clause("nope", ToyRunner)


def test_run_clause_runs_one_clause() -> None:
    result = run_clause("host_driven.decode", OffByOneDecode)
    assert isinstance(result, ClauseResult)
    assert result.failed
    assert result.clause == "host_driven.decode"
    assert run_clause("host_driven.decode", ToyRunner).passed


@pytest.mark.parametrize(
    ("option", "value"),
    [("atol", -1.0), ("rtol", float("nan")), ("max_examples", 0), ("max_prompt_len", 1)],
)
def test_bad_options_are_refused(option: str, value: object) -> None:
    with pytest.raises(InvalidOptionError, match=option):
        check_runner(ToyRunner, **{option: value})  # type: ignore[arg-type]


def test_a_fixed_seed_gives_the_same_examples() -> None:
    a = check_runner(OffByOneDecode, clauses=["host_driven.decode"], seed=7, max_examples=5)
    b = check_runner(OffByOneDecode, clauses=["host_driven.decode"], seed=7, max_examples=5)
    assert a["host_driven.decode"].message == b["host_driven.decode"].message


def test_the_report_formats_and_indexes() -> None:
    report = check_runner(OffByOneDecode, clauses=["host_driven", "multimodal"], **FAST)
    text = str(report)
    assert text.splitlines()[0] == "rlx-lm conformance: conformance_runners:OffByOneDecode"
    assert "  FAIL  host_driven.decode" in text
    assert "  PASS  host_driven.prefill" in text
    assert text.splitlines()[-1] == "3 passed, 1 failed, 0 skipped" == report.summary()
    assert not report.ok
    assert len(report) == 4
    assert [r.clause for r in report] == report.clauses()
    with pytest.raises(KeyError, match=r"greedy\.stop"):
        report["greedy.stop"]
    named = check_runner(ToyRunner, clauses=["structure"], name="my runner")
    assert named.target == "my runner"
    assert Report("empty").ok


def test_every_clause_has_a_summary_and_a_unique_name() -> None:
    assert len(set(clause_names())) == len(CLAUSES)
    assert all(c.summary for c in CLAUSES)


def test_a_missing_hypothesis_is_a_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    with pytest.raises(ImportError, match=r"pip install 'rlx-lm\[testing\]'"):
        require_hypothesis()
    with pytest.raises(ImportError, match="hypothesis"):
        check_runner(ToyRunner)


def test_the_toy_is_what_it_says() -> None:
    # The kit's verdicts are only as good as the toy they are measured against.
    toy = ToyRunner()
    prompt = [3, 1, 4]
    np.testing.assert_array_equal(toy.predict_logits(prompt), logits_at(states(prompt)[-1], VOCAB))
    toy.prefill_logits(prompt[:2])
    np.testing.assert_array_equal(toy.decode_logits(4), toy.predict_logits(prompt))


def test_a_factory_must_build_a_fresh_runner_each_call() -> None:
    shared = ToyRunner()
    report = check_runner(lambda: shared, **FAST)
    assert report.failed_clauses == {"structure.members"}
    assert "returned the same object twice" in report["structure.members"].message
    assert all("same object" in r.message for r in report.skips)


def test_passing_a_runner_instead_of_a_factory_says_so() -> None:
    with pytest.raises(InvalidOptionError, match="got a ToyRunner instance"):
        check_runner(ToyRunner())  # type: ignore[arg-type]


def test_nan_is_reported_by_the_logits_clause_not_by_every_comparison() -> None:
    class NanLogit(ToyRunner):
        def _logits(self, state: int) -> Any:
            row = logits_at(state, self.vocab_size)
            row[3] = np.nan
            return row

    report = check_runner(NanLogit, **FAST)
    assert "logits.row" in report.failed_clauses
    assert "not finite float32, first at index 3: nan" in report["logits.row"].message
    # The pair agrees with predict_logits (NaN for NaN), so those clauses hold; only
    # greedy, whose reference is rlx_lm.argmax, cannot run on a NaN row.
    assert report.failed_clauses == {"logits.row", "greedy.argmax"}
    assert "InvalidLogitsError" in report["greedy.argmax"].message


def test_a_row_that_does_not_convert_is_named() -> None:
    class Text(CoreOnly):
        def predict_logits(self, tokens: Sequence[int], /) -> Any:
            return "0.5 1.5"

    report = check_runner(Text, clauses=["logits.row"], **FAST)
    assert "returned str, which does not convert to a row of floats" in (
        report["logits.row"].message
    )


def test_generated_tokens_must_be_in_the_vocabulary() -> None:
    class OutOfVocab(ToyRunner):
        def generate(self, prompt_ids: Sequence[int], n_new: int, on_token: Any = None, /) -> Any:
            return [t + VOCAB for t in super().generate(prompt_ids, n_new, on_token)]

    report = check_runner(OutOfVocab, clauses=["greedy.argmax"], **FAST)
    assert "outside the vocabulary 0..31" in report["greedy.argmax"].message


def test_a_member_that_is_not_callable_is_reported() -> None:
    class Attribute(ToyRunner):
        decode_logits = 5  # type: ignore[assignment]

    report = check_runner(Attribute, clauses=["structure", "host_driven"], **FAST)
    assert report.failed_clauses == {"structure.members"}
    assert "decode_logits is a int, not a method" in report["structure.members"].message
    assert "incompatible signature" in report["host_driven.decode"].message


def test_the_kit_imports_without_hypothesis_and_says_what_to_install() -> None:
    # A backend that only imports rlx_lm (or whose pytest loads the plugin) must not need
    # hypothesis; the kit asks for it when it runs, and the strategies when imported.
    code = """
import sys
sys.modules["hypothesis"] = None
import rlx_lm.testing, rlx_lm.testing.pytest_plugin
try:
    rlx_lm.testing.check_runner(lambda: None)
except ImportError as e:
    print("check:", e)
try:
    import rlx_lm.testing.strategies
except ImportError as e:
    print("strategies:", e)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["check", "strategies"]
    assert all("pip install 'rlx-lm[testing]'" in line for line in lines)
