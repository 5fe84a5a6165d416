"""The dropped-builder-copy guard's bytecode reading: checked on every interpreter it runs on.

`rlx_lm._discarded.reliable` probes the running interpreter's bytecode once; where any
answer is wrong the guard is off, so another CPython's layout can make it miss a dropped
copy but never raise on a kept one. The reading is run here under every other CPython
found on this machine (3.10, 3.12, 3.13 where installed), as a standalone file.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlx_lm._discarded as discarded
import rlx_lm.builder as builder
from rlx_lm import LmRunnerBuilder

SOURCE = Path(discarded.__file__)
CHECKED = [(3, 10), (3, 11), (3, 12), (3, 13)]
"""The CPython versions the reading is known to be right on (the probes pass there)."""


def test_the_reading_is_reliable_on_this_interpreter() -> None:
    known = sys.implementation.name == "cpython" and sys.version_info[:2] in CHECKED
    if not known:
        pytest.skip(f"{sys.implementation.name} {sys.version_info[:2]}: not a checked version")
    assert discarded.reliable()


def _interpreter(version: tuple[int, int]) -> str | None:
    name = f"python{version[0]}.{version[1]}"
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(
        glob.glob(os.path.join(root, "versions", f"{version[0]}.{version[1]}.*", "bin", name))
    )
    candidates = [*found, shutil.which(name)]
    for exe in candidates:
        if exe and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    return None


PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("d", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
scope = {}
exec(m._PROBES, scope)
seen = {}
for name in m._EXPECTED:
    p = m._Probe()
    scope[name](p)
    seen[name] = p.seen
print(json.dumps({"reliable": m.reliable(), "seen": seen, "want": m._EXPECTED}))
"""


@pytest.mark.parametrize("version", [v for v in CHECKED if v != sys.version_info[:2]])
def test_the_reading_under_other_cpythons(version: tuple[int, int]) -> None:
    exe = _interpreter(version)
    if exe is None:
        pytest.skip(f"no python{version[0]}.{version[1]} on this machine")
    out = subprocess.run(
        [exe, "-I", "-c", PROBE, str(SOURCE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["seen"] == got["want"]
    assert got["reliable"] is True


@pytest.fixture
def fresh_calibration() -> object:
    discarded.reliable.cache_clear()
    yield
    discarded.reliable.cache_clear()


def test_a_reading_wrong_anywhere_turns_the_guard_off(
    monkeypatch: pytest.MonkeyPatch, fresh_calibration: object
) -> None:
    # Another layout where every call looked thrown away would refuse kept copies too:
    # the probes catch it, and the guard is off rather than wrong.
    monkeypatch.setattr(discarded, "result_discarded", lambda frame: True)
    assert not discarded.reliable()
    b = LmRunnerBuilder()
    kept = b.max_seq(512)
    assert kept.max_seq() == 512
    assert builder.reliable is discarded.reliable
    b.max_seq(256)  # missed, not refused: the guard is off


def test_a_reading_that_raises_turns_the_guard_off(
    monkeypatch: pytest.MonkeyPatch, fresh_calibration: object
) -> None:
    def broken(frame: object) -> bool:
        raise ValueError("no bytecode here")

    monkeypatch.setattr(discarded, "result_discarded", broken)
    assert not discarded.reliable()
    monkeypatch.setattr(discarded, "result_discarded", lambda frame: False)
    discarded.reliable.cache_clear()
    assert not discarded.reliable(), "a reading that never sees a statement is wrong too"
