"""``rlx-lm check``: the report on stdout and the exit status (0 held, 1 broken, 2 usage)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlx_lm import InvalidOptionError
from rlx_lm.testing import clause_names, cli_check, load_factory

TESTS = Path(__file__).parent


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli_check(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_a_conforming_runner_exits_zero_and_lists_every_clause() -> None:
    status, out, _ = run("conformance_runners:ToyRunner", "--max-examples=5")
    assert status == 0
    assert out.splitlines()[0] == "rlx-lm conformance: conformance_runners:ToyRunner"
    for name in clause_names():
        assert f"  PASS  {name}" in out
    assert out.splitlines()[-1] == f"{len(clause_names())} passed, 0 failed, 0 skipped"


def test_a_broken_runner_exits_one_and_prints_the_shrunk_example() -> None:
    status, out, _ = run("conformance_runners:IgnoresSuffix", "--max-examples=5")
    assert status == 1
    assert "  FAIL  sessions.reuse" in out
    assert "falsifying example: prompt=[0, 0], cached=1, tail=[], next=0" in out


def test_clause_selection_and_tolerances() -> None:
    status, out, _ = run(
        "conformance_runners:OffByOneDecode", "--clause=greedy", "--clause=logits.row"
    )
    assert status == 0
    assert "host_driven" not in out
    assert out.splitlines()[-1] == "3 passed, 0 failed, 0 skipped"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_colon"], "must look like 'pkg.module:factory'"),
        (["no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["conformance_runners:Nope"], "has no attribute 'Nope'"),
        (["conformance_runners:VOCAB"], "not a callable"),
        (["conformance_runners:ToyRunner", "--clause=nope"], "unknown clause"),
        (["conformance_runners:ToyRunner", "--seed=x"], "--seed must be an int or 'random'"),
        (["conformance_runners:ToyRunner", "--atol=-1"], "atol must be"),
        ([], "give a runner spec"),
    ],
)
def test_usage_errors_exit_two(argv: list[str], message: str) -> None:
    status, out, err = run(*argv)
    assert status == 2
    assert out == ""
    assert message in err


def test_unknown_flags_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_check(["--frobnicate"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_list_prints_the_clauses() -> None:
    status, out, _ = run("--list")
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()] == clause_names()


def test_load_factory_resolves_dotted_attributes() -> None:
    assert load_factory("rlx_lm.testing.conformance:CheckOptions") is not None
    with pytest.raises(InvalidOptionError, match="has no attribute 'nope'"):
        load_factory("rlx_lm.testing:CheckOptions.nope")


def test_python_dash_m_runs_the_check_from_the_working_directory() -> None:
    # The module is found in the working directory, as `python -m` users expect. The path
    # keeps only where rlx_lm itself comes from (an unpacked wheel, in development), not
    # the tests directory.
    import rlx_lm

    env = {**os.environ, "PYTHONPATH": str(Path(rlx_lm.__file__).resolve().parents[1])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlx_lm.testing",
            "conformance_runners:WrongLength",
            "--clause=logits",
        ],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "  FAIL  logits.row" in proc.stdout
    assert "returned 31 values; expected vocab_size=32" in proc.stdout


def test_load_factory_finds_a_module_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd_runner_module.py").write_text("def make():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    factory = load_factory("cwd_runner_module:make")
    assert factory() == 42


def test_rlx_lm_check_hands_over_to_the_kit(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_lm.cli import main

    assert main(["check", "conformance_runners:ToyRunner", "--clause=structure"]) == 0
    assert "3 passed, 0 failed, 0 skipped" in capsys.readouterr().out
    assert main(["check", "conformance_runners:ZeroVocab", "--clause=structure"]) == 1
    assert "FAIL  structure.vocab_size" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "check" in capsys.readouterr().out


def test_the_installed_rlx_lm_command_runs_check() -> None:
    command = Path(sys.executable).parent / "rlx-lm"
    if not command.exists():
        pytest.skip(f"no rlx-lm console script next to {sys.executable}")
    proc = subprocess.run(
        [str(command), "check", "conformance_runners:DropsStopToken", "--clause=greedy"],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAIL  greedy.stop" in proc.stdout
    assert "the stopping token is kept" in proc.stdout
