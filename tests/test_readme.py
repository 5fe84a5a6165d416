"""The README's Python examples run as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {})
    capsys.readouterr()


def _first_sh_block() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_starts_with_pip_install_then_generate() -> None:
    lines = _first_sh_block()
    assert lines[0] == "pip install rlx-lm"
    assert lines[1].startswith("rlx-lm generate ")


def test_the_readmes_first_generate_command_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_lm.cli import main

    argv = shlex.split(_first_sh_block()[1])
    assert main(argv[1:]) == 0
    out, err = capsys.readouterr()
    assert out.strip(), "the README's command printed no text"
    assert "tok/s" in err


def test_the_readme_names_the_contributor_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_section = text.split("\n## ", 1)[0]
    assert "make dev" in first_section
    assert "make check" in first_section
