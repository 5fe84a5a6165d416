"""Run the README's first commands as a new user would, in a venv holding only the wheel.

    python .ci/readme_first_commands.py VENV

The README's first shell block must start with `pip install rlx-lm` (.ci/run has installed
the release wheel into VENV in its stead, with only its declared runtime dependencies); every
`rlx-lm ...` line after it must exit 0 and print text.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def main(venv: str) -> int:
    block = re.search(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    if block is None:
        raise SystemExit("README.md has no sh block")
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    if lines[0] != "pip install rlx-lm":
        raise SystemExit(f"README's first command is {lines[0]!r}, not 'pip install rlx-lm'")
    bindir = Path(venv).resolve() / "bin"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    for line in lines[1:]:
        argv = shlex.split(line)
        if argv[0] != "rlx-lm":
            raise SystemExit(f"unexpected README command {line!r}")
        print(f"$ {line}", file=sys.stderr)
        r = subprocess.run(
            argv,
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        sys.stderr.write(r.stdout + r.stderr)
        if r.returncode != 0 or not r.stdout.strip():
            raise SystemExit(f"{line!r} exited {r.returncode} with output {r.stdout!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
