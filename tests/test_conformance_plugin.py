"""The pytest plugin: ``pytest --rlx-runner=pkg.module:factory`` gives one item per clause."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rlx_lm.testing import clause_names

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent


@pytest.fixture
def runner_path(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.syspathinsert(TESTS)
    return pytester


def test_the_plugin_is_registered_through_pytest11() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("rlx_lm") == "rlx_lm.testing.pytest_plugin"


def test_each_clause_is_its_own_passing_item(runner_path: pytest.Pytester) -> None:
    result = runner_path.runpytest_inprocess(
        "--rlx-runner=conformance_runners:ToyRunner", "--rlx-max-examples=5", "-v"
    )
    result.assert_outcomes(passed=len(clause_names()))
    result.stdout.fnmatch_lines(
        [
            f"rlx-conformance?conformance_runners:ToyRunner?::{name} PASSED*"
            for name in clause_names()
        ]
    )


def test_a_broken_clause_fails_alone_with_its_example(runner_path: pytest.Pytester) -> None:
    result = runner_path.runpytest_inprocess(
        "--rlx-runner=conformance_runners:OffByOneDecode", "--rlx-max-examples=5"
    )
    result.assert_outcomes(passed=len(clause_names()) - 1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "conformance clause host_driven.decode failed:",
            "decode_logits(0) after prefill_logits([[]0[]]) differs from predict_logits*",
            "falsifying example: prompt=[[]0[]], continuation=[[]0[]]",
            "FAILED rlx-conformance?conformance_runners:OffByOneDecode?::host_driven.decode*",
        ]
    )


def test_unclaimed_capabilities_are_skips_with_reasons(runner_path: pytest.Pytester) -> None:
    result = runner_path.runpytest_inprocess(
        "--rlx-runner=conformance_runners:CoreOnly", "--rlx-max-examples=5", "-rs"
    )
    result.assert_outcomes(passed=len(clause_names()) - 4, skipped=4)
    result.stdout.fnmatch_lines(["SKIPPED*does not claim sessions*"])


def test_k_selects_clauses_and_runners_combine(runner_path: pytest.Pytester) -> None:
    result = runner_path.runpytest_inprocess(
        "--rlx-runner=conformance_runners:ToyRunner",
        "--rlx-runner=conformance_runners:CoreOnly",
        "--rlx-max-examples=5",
        "-k",
        "host_driven",
    )
    result.assert_outcomes(passed=6)


def test_options_reach_the_clauses(runner_path: pytest.Pytester) -> None:
    runner_path.makepyfile(
        slightly_off="""
        import numpy as np
        from conformance_runners import ToyRunner

        class SlightlyOff(ToyRunner):
            def decode_logits(self, token, /):
                return super().decode_logits(token) + np.float32(1e-3)
        """
    )
    # "decode" selects host_driven.decode, host_driven.decode_before_prefill and batched.decode
    args = ["--rlx-runner=slightly_off:SlightlyOff", "--rlx-max-examples=5", "-k", "decode"]
    runner_path.runpytest_inprocess(*args).assert_outcomes(passed=2, failed=1)
    runner_path.runpytest_inprocess(*args, "--rlx-atol=1e-2").assert_outcomes(passed=3)


def test_a_bad_spec_is_a_usage_error(runner_path: pytest.Pytester) -> None:
    result = runner_path.runpytest_inprocess("--rlx-runner=no_such_module:factory")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--rlx-runner=no_such_module:factory: cannot import*"])


def test_without_the_option_nothing_is_added(runner_path: pytest.Pytester) -> None:
    runner_path.makepyfile("def test_plain(): pass")
    runner_path.runpytest_inprocess().assert_outcomes(passed=1)


def test_a_missing_hypothesis_is_a_usage_error_naming_the_extra(
    runner_path: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlx_lm.testing.options as options

    def missing() -> None:
        raise ImportError("install it with: pip install 'rlx-lm[testing]'")

    monkeypatch.setattr(options, "require_hypothesis", missing)
    result = runner_path.runpytest_inprocess("--rlx-runner=conformance_runners:ToyRunner")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pip install 'rlx-lm[[]testing[]]'*"])
