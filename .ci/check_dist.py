"""Check what would ship: the wheel's platform tag (auditwheel), licences, metadata; the sdist.

    python .ci/check_dist.py DIST ARCH

The wheel must be abi3, tagged manylinux_2_17 (manylinux2014) for ARCH, and auditwheel
must agree that its symbols need nothing newer; it must carry both licence texts and PEP 639
metadata. The sdist (when DIST has one) must carry the licence texts and the changelog.
"""

from __future__ import annotations

import email.parser
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

LICENSES = ("LICENSE-MIT", "LICENSE-APACHE")


def fail(msg: str) -> None:
    raise SystemExit(f"check_dist: {msg}")


def check_wheel(wheel: Path, arch: str) -> None:
    if "-cp310-abi3-" not in wheel.name:
        fail(f"{wheel.name}: not an abi3 wheel for CPython >= 3.10")
    if f"manylinux_2_17_{arch}" not in wheel.name:
        fail(f"{wheel.name}: not tagged manylinux_2_17_{arch}")
    shown = subprocess.run(
        ["auditwheel", "show", str(wheel)], check=True, capture_output=True, text=True
    ).stdout
    print(shown, file=sys.stderr)
    flat = " ".join(shown.split())
    if f'consistent with the following platform tag: "manylinux_2_17_{arch}"' not in flat:
        fail(f"auditwheel does not find {wheel.name} consistent with manylinux_2_17_{arch}")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        for lic in LICENSES:
            if f"{info}/licenses/{lic}" not in names:
                fail(f"{wheel.name}: no {info}/licenses/{lic}")
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
    version = tuple(int(x) for x in meta["Metadata-Version"].split("."))
    if version < (2, 4):
        fail(f"Metadata-Version {meta['Metadata-Version']} predates PEP 639 (2.4)")
    if meta["License-Expression"] != "MIT OR Apache-2.0":
        fail(f"License-Expression is {meta['License-Expression']!r}")
    if sorted(meta.get_all("License-File") or []) != sorted(LICENSES):
        fail(f"License-File entries are {meta.get_all('License-File')}")
    requires = [r.split(";")[0] for r in meta.get_all("Requires-Dist") or []]
    print("Requires-Dist (runtime):", [r for r in requires], file=sys.stderr)


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for want in (*LICENSES, "CHANGELOG.md", "README.md", "Cargo.lock"):
        if want not in names:
            fail(f"{sdist.name}: no {want}")


def main(dist: str, arch: str) -> int:
    wheels = sorted(Path(dist).glob(f"rlx_lm-*_{arch}.whl"))
    if len(wheels) != 1:
        fail(f"expected one {arch} wheel in {dist}, found {[w.name for w in wheels]}")
    check_wheel(wheels[0], arch)
    for sdist in Path(dist).glob("rlx_lm-*.tar.gz"):
        check_sdist(sdist)
    print(f"check_dist: {wheels[0].name}: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
