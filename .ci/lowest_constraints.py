"""Print pip constraints pinning each runtime dependency to its declared lower bound.

    python .ci/lowest_constraints.py [EXTRA ...] > lowest.txt
    pip install -c lowest.txt 'dist/rlx_lm-*.whl[dev]'
    python .ci/lowest_constraints.py --check VENV [EXTRA ...]   # VENV holds exactly those
    python .ci/lowest_constraints.py --requirements EXTRA [--without NAME ...]
                                   # EXTRA's requirements less NAME's, as pip -r lines

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


def requirements(extra: str, without: list[str]) -> list[str]:
    """EXTRA's requirements, less those naming a distribution in WITHOUT.

    The lowest-versions step tests the runtime bounds with the dev extra's test tools but
    not with its optional integrations (Ray): Ray Serve needs a newer typing_extensions
    than rlx_lm does, so with it the runtime lower bounds cannot be installed at all.
    Ray's tests skip where it is absent; `make check` runs them at the newest versions.
    """
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    drop = {w.lower() for w in without}
    out = []
    for req in project["optional-dependencies"][extra]:
        m = REQ.match(req.split(";", 1)[0])
        if m is None:
            raise SystemExit(f"cannot parse requirement {req!r}")
        if m.group(1).lower() not in drop:
            out.append(req)
    return out


def main(argv: list[str]) -> int:
    venv = None
    if argv[:1] == ["--requirements"]:
        extra, rest = argv[1], argv[2:]
        without = [rest[i + 1] for i in range(len(rest) - 1) if rest[i] == "--without"]
        print("\n".join(requirements(extra, without)))
        return 0
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
