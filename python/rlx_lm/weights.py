"""Weight formats: naming them, and telling them apart by content as well as by extension."""

from __future__ import annotations

import enum
import os
import re
from pathlib import Path

from rlx_lm._headers import (
    GGUF_MAGIC,
    fail,
    read_gguf_header,
    read_safetensors_header,
    safetensors_header_len,
)
from rlx_lm.errors import InvalidOptionError

__all__ = ["DEFAULT_GGUF_PREFERENCE", "WeightFormat", "pick_gguf", "sniff_format"]

_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


class WeightFormat(enum.Enum):
    """A weight file format: safetensors, GGUF, MLX (directory/npz/npy) or DDUF (zip)."""

    SAFETENSORS = "safetensors"
    GGUF = "gguf"
    MLX = "mlx"
    DDUF = "dduf"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> WeightFormat:
        """The format named by ``text`` (``safetensors``, ``gguf``, ``mlx``/``npz``, ``dduf``)."""
        name = text.strip().lower()
        found = _NAMES.get(name)
        if found is None:
            raise InvalidOptionError(f"format: expected safetensors|gguf|mlx|dduf, got {text!r}")
        return found

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> WeightFormat:
        """Detect the format of a file or directory: content first, then the extension.

        A directory holding ``config.json`` and safetensors files is MLX; one
        holding GGUF files (and no such config) is GGUF. For an existing file
        the first bytes decide (GGUF magic, a safetensors header, a zip for
        DDUF or ``.npz``, the npy magic); an extension the content contradicts
        is an error. A path that does not exist is judged by its extension.
        """
        p = Path(path)
        if p.is_dir():
            return _from_dir(p)
        by_ext = _EXTENSIONS.get(p.suffix.lower().lstrip("."))
        if p.is_file():
            sniffed = sniff_format(p)
            if sniffed is not None:
                return sniffed
            if by_ext is not None:
                _explain_mismatch(p, by_ext)
                raise fail(
                    p,
                    f"the extension says {by_ext} but the content is not {by_ext} "
                    f"(first bytes {_head(p)!r})",
                )
            raise fail(
                p,
                f"cannot tell the weight format: unknown extension {p.suffix!r} and the content "
                f"is not GGUF, safetensors, zip (DDUF/npz) or npy (first bytes {_head(p)!r})",
            )
        if by_ext is not None:
            return by_ext
        raise fail(p, f"cannot detect the weight format from the extension {p.suffix!r}")


_NAMES = {
    "safetensors": WeightFormat.SAFETENSORS,
    "gguf": WeightFormat.GGUF,
    "mlx": WeightFormat.MLX,
    "npz": WeightFormat.MLX,
    "dduf": WeightFormat.DDUF,
}
_EXTENSIONS = {
    "safetensors": WeightFormat.SAFETENSORS,
    "gguf": WeightFormat.GGUF,
    "npz": WeightFormat.MLX,
    "npy": WeightFormat.MLX,
    "dduf": WeightFormat.DDUF,
}


def _explain_mismatch(p: Path, claimed: WeightFormat) -> None:
    """Raise the precise reason a file is not the format its extension claims, if one exists."""
    if claimed is WeightFormat.GGUF:
        read_gguf_header(p)
    elif claimed is WeightFormat.SAFETENSORS:
        read_safetensors_header(p)


def _head(path: Path, n: int = 16) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def sniff_format(path: str | os.PathLike[str]) -> WeightFormat | None:
    """The format a file's first bytes show, or None; reads at most 16 bytes."""
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(16)
        f.seek(0, 2)
        size = f.tell()
    if head.startswith(GGUF_MAGIC):
        return WeightFormat.GGUF
    if head.startswith(_ZIP_MAGICS):
        return WeightFormat.MLX if p.suffix.lower() == ".npz" else WeightFormat.DDUF
    if head.startswith(_NPY_MAGIC):
        return WeightFormat.MLX
    if safetensors_header_len(head, size) is not None:
        return WeightFormat.SAFETENSORS
    return None


def _from_dir(p: Path) -> WeightFormat:
    names = [e.name for e in p.iterdir() if e.is_file()]
    has_config = "config.json" in names
    safetensors = [n for n in names if n.endswith(".safetensors")]
    if has_config and (safetensors or "model.safetensors.index.json" in names):
        return WeightFormat.MLX
    if any(n.lower().endswith(".gguf") for n in names):
        return WeightFormat.GGUF
    if safetensors:
        raise fail(p, "directory has safetensors files but no config.json")
    raise fail(
        p,
        "directory is not a weight directory (need config.json with safetensors files, "
        "or .gguf files)",
    )


DEFAULT_GGUF_PREFERENCE = "Q4_K_M"
"""The quantisation picked from a directory of several GGUFs when no preference is given."""


def pick_gguf(directory: str | os.PathLike[str], prefer: str | None = None) -> Path:
    """The one GGUF file in ``directory`` to load, choosing by substring when there are several.

    ``prefer`` (default `DEFAULT_GGUF_PREFERENCE`) is matched case-insensitively
    against file names; split files (``-00002-of-00003``) other than the first
    are ignored. No candidate, or several equally good ones, is an error that
    lists the files.
    """
    d = Path(directory)
    files = sorted(e for e in d.iterdir() if e.is_file() and e.suffix.lower() == ".gguf")
    files = [f for f in files if not _SPLIT_TAIL.search(f.stem)]
    if not files:
        raise fail(d, "directory holds no .gguf file")
    if len(files) == 1:
        return files[0]
    want = (prefer or DEFAULT_GGUF_PREFERENCE).lower()
    chosen = [f for f in files if want in f.name.lower()]
    if len(chosen) == 1:
        return chosen[0]
    listing = ", ".join(f.name for f in files)
    if not chosen:
        raise fail(
            d,
            f"{len(files)} GGUF files and none matches {want!r}; pick one with "
            f"prefer_gguf(...) ({listing})",
        )
    raise fail(
        d,
        f"{len(chosen)} GGUF files match {want!r}; use a longer prefer_gguf(...) substring "
        f"({', '.join(f.name for f in chosen)})",
    )


_SPLIT_TAIL = re.compile(r"-(?!0*1-)\d{5}-of-\d{5}$")
