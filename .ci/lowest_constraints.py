"""Print pip constraints pinning each runtime dependency to its declared lower bound.

    python .ci/lowest_constraints.py [EXTRA ...] > lowest.txt
    pip install -c lowest.txt 'dist/rlx_lm-*.whl[dev]'
    python .ci/lowest_constraints.py --check VENV [EXTRA ...]   # VENV holds exactly those

Every requirement of `[project] dependencies` (and of the named extras) must carry a
`>=` lower bound; installing exactly those versions and running the tests is how CI
checks that the bounds we publish are true. A requirement without a lower bound is an
error, so a new dependency cannot slip in unbounded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def lower_bounds(requirements: list[str]) -> list[str]:
    pins = []
    for req in requirements:
        spec = req.split(";", 1)[0]
        m = REQ.match(spec)
        if m is None:
            raise SystemExit(f"cannot parse requirement {req!r}")
        name, _, rest = m.groups()
        low = re.search(r">=\s*([^,\s]+)", rest)
        if low is None:
            raise SystemExit(f"{req!r} has no '>=' lower bound")
        pins.append(f"{name}=={low.group(1)}")
    return pins


def _release(version: str) -> tuple[int, ...]:
    parts = [int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def check(venv: str, pins: list[str]) -> int:
    """Fail unless VENV has each pinned distribution at exactly its lower bound."""
    code = (
        "import json, sys, importlib.metadata as m;"
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    names = [pin.split("==")[0] for pin in pins]
    out = subprocess.run(
        [f"{venv}/bin/python", "-c", code, *names], check=True, capture_output=True, text=True
    ).stdout
    have = json.loads(out)
    bad = [
        f"{pin} (installed {have[pin.split('==')[0]]})"
        for pin in pins
        if _release(have[pin.split("==")[0]]) != _release(pin.split("==")[1])
    ]
    if bad:
        raise SystemExit("not at the lower bound: " + ", ".join(bad))
    print("at the lower bounds:", ", ".join(f"{n} {v}" for n, v in have.items()), file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    venv = None
    if argv[:1] == ["--check"]:
        venv, argv = argv[1], argv[2:]
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra in argv:
        reqs += project["optional-dependencies"][extra]
    pins = lower_bounds(reqs)
    if venv is not None:
        return check(venv, pins)
    for pin in pins:
        print(pin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
