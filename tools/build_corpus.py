"""Build the training corpus for rlx-lm's default model from a Debian package.

Source: Debian package ``r-cran-janeaustenr`` (Julia Silge's R data package, MIT licence for the
packaging; the six novels themselves, published 1811-1817, are in the public domain). The package
ships the novels as an R lazy-load database (``data/Rdata.rdb`` + ``Rdata.rdx``): each entry is a
4-byte length followed by a zlib stream of one serialised R character vector (one element per
line of the Project Gutenberg text). We fetch the .deb with ``apt-get download`` (no install, so R
is not pulled in), unpack it with ``dpkg-deb -x``, read the vectors with the ``rdata`` package and
clean them:

* drop title lines, "Chapter N" / "VOLUME I" headings and the like;
* remove the ``_underscore_`` italic markers, normalise quotes, dashes and whitespace;
* join wrapped lines into one paragraph per line.

Output: ``<out>/train.txt`` and ``<out>/valid.txt`` (one paragraph per line; the last 4% of
each novel's paragraphs, contiguous slices, form the validation split) and ``<out>/SOURCE.txt``
recording the package version and the sha256 of the .deb, and ``<out>/words.txt`` (the
training text's words, for the shipped model's test).

    python tools/build_corpus.py --out build/corpus
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import re
import subprocess
import tempfile
import warnings
import zlib
from collections import Counter
from pathlib import Path

PACKAGE = "r-cran-janeaustenr"
DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
# Fixed order so the corpus (and everything after it) is reproducible.
NOVELS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)
VALID_FRACTION = 0.04
WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")

HEADING = re.compile(
    r"^(chapter|volume|vol\.|book|finis|the end)\b[\sivxlcdm\d.]*$|^[IVXLC]+\.?$|^\d+$",
    re.IGNORECASE,
)


def fetch_deb(workdir: Path) -> Path:
    """Download the package's .deb into workdir (apt-get download needs no install)."""
    subprocess.run(["apt-get", "download", PACKAGE], cwd=workdir, check=True)
    debs = sorted(workdir.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        raise SystemExit(f"apt-get download {PACKAGE} produced no .deb in {workdir}")
    return debs[-1]


def read_novels(root: Path) -> dict[str, list[str]]:
    """Return each novel as its list of raw lines, read from the R lazy-load database."""
    import rdata  # dev-only dependency (the `train` extra)

    index_raw = gzip.decompress((root / f"{DATA}.rdx").read_bytes())
    blob = (root / f"{DATA}.rdb").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rdata warns that a bare stream is "assumed RDS"
        index = rdata.conversion.convert(rdata.parser.parse_data(index_raw))
        novels: dict[str, list[str]] = {}
        for name in NOVELS:
            offset, length = (int(v) for v in index["variables"][name])
            payload = zlib.decompress(blob[offset + 4 : offset + length])
            lines = rdata.conversion.convert(rdata.parser.parse_data(payload))
            novels[name] = [str(x) for x in lines]
    return novels


def clean_line(line: str) -> str:
    line = line.replace("_", "")
    line = line.replace("\u2019", "'").replace("\u2018", "'")
    line = line.replace("\u201c", '"').replace("\u201d", '"')
    line = line.replace("\u2014", "--").replace("\u2013", "-")
    return re.sub(r"\s+", " ", line).strip()


def paragraphs(lines: list[str]) -> list[str]:
    """Join wrapped lines into paragraphs; drop headings and the title block."""
    out: list[str] = []
    current: list[str] = []
    for raw in [*lines, ""]:
        line = clean_line(raw)
        if line:
            current.append(line)
            continue
        if current:
            para = " ".join(current)
            current = []
            if HEADING.match(para) or para.isupper() or para.lower().startswith("by jane austen"):
                continue
            if len(para) < 3 or not re.search(r"[A-Za-z]", para):
                continue  # also drops "* * * * *" section breaks
            out.append(para)
    # The novels open with a title (upper case, dropped above); anything before the first
    # chapter's text that is short and title-like goes too.
    while out and len(out[0]) < 40 and not out[0].endswith((".", '"', "!", "?")):
        out.pop(0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/corpus"))
    parser.add_argument("--deb", type=Path, help="use this .deb instead of apt-get download")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        deb = args.deb if args.deb else fetch_deb(work)
        digest = hashlib.sha256(deb.read_bytes()).hexdigest()
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "root")], check=True)
        novels = read_novels(work / "root")

    train: list[str] = []
    valid: list[str] = []
    for name in NOVELS:
        paras = paragraphs(novels[name])
        cut = int(len(paras) * (1 - VALID_FRACTION))
        train.extend(paras[:cut])
        valid.extend(paras[cut:])
        print(f"{name:18s} {len(paras):6d} paragraphs {sum(map(len, paras)):9d} chars")

    (args.out / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (args.out / "valid.txt").write_text("\n".join(valid) + "\n", encoding="utf-8")
    (args.out / "SOURCE.txt").write_text(
        f"package: {PACKAGE}\ndeb: {deb.name}\nsha256: {digest}\n"
        f"novels: {', '.join(NOVELS)}\n"
        "licence: texts public domain (published 1811-1817); packaging MIT (Julia Silge)\n",
        encoding="utf-8",
    )
    # Words of the training text (lower case, seen at least twice): the test of the shipped model
    # checks that its greedy continuations are made of these (tests/data/default_model_words.txt).
    counts = Counter(w for para in train for w in WORD.findall(para.lower()))
    words = sorted(w for w, c in counts.items() if c >= 2)
    (args.out / "words.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    n_train = sum(map(len, train))
    n_valid = sum(map(len, valid))
    print(f"train {len(train)} paragraphs {n_train} chars; valid {len(valid)} / {n_valid}")


if __name__ == "__main__":
    main()
