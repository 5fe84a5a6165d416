"""``inspect(path)``: what a weight file or directory holds, read from headers only.

GGUF headers are walked by `rlx_lm._headers` (bounds-checked against the file
size) and typed with the ``gguf`` package's tables. ``gguf.GGUFReader`` is not
used here: it decodes every metadata array element by element (about 4 s for a
150k-token vocabulary) and trusts array lengths, so a hostile header can keep it
looping; the tests use it as the reference the walker must agree with.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx_lm._headers import (
    fail,
    ggml_type,
    load_json,
    parse_safetensors_header,
    read_gguf_header,
    read_safetensors_header,
    read_safetensors_index,
)
from rlx_lm.weights import WeightFormat

__all__ = ["WeightReport", "architecture_of", "inspect"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class WeightReport:
    """What `inspect` found: format, architecture, tensors, tokenizer, size and shards."""

    path: Path
    format: WeightFormat
    architecture: str | None
    tensor_count: int
    dtypes: Mapping[str, int]
    """Tensor count per dtype or GGML quantisation type, most common first."""
    tokenizer: str | None
    """Where the tokenizer is (an embedded GGUF model name or a file name), or None."""
    size_bytes: int
    shards: tuple[Path, ...] = ()
    """Every file the weights are split across; empty when there is one file."""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def has_tokenizer(self) -> bool:
        """Whether a tokenizer was found."""
        return self.tokenizer is not None

    @property
    def sharded(self) -> bool:
        """Whether the weights are split across several files."""
        return len(self.shards) > 1

    def __str__(self) -> str:
        dtypes = ", ".join(f"{name} x{count}" for name, count in self.dtypes.items()) or "-"
        lines = [
            f"{self.path}",
            f"  format        {self.format}",
            f"  architecture  {self.architecture or 'unknown'}",
            f"  tensors       {self.tensor_count} ({dtypes})",
            f"  tokenizer     {self.tokenizer or 'none found'}",
            f"  size on disk  {_human(self.size_bytes)} ({self.size_bytes} bytes)",
            "  sharding      " + (f"{len(self.shards)} files" if self.sharded else "single file"),
        ]
        lines += [f"  {key:<13} {value}" for key, value in self.details.items()]
        return "\n".join(lines)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def inspect(path: str | os.PathLike[str]) -> WeightReport:
    """Describe the weights at ``path`` from their headers, without loading any tensor."""
    p = Path(path)
    if not p.exists():
        raise fail(p, "no such file or directory")
    try:
        fmt = WeightFormat.from_path(p)
        if fmt is WeightFormat.GGUF:
            return _inspect_gguf(p)
        if fmt is WeightFormat.DDUF:
            return _inspect_dduf(p)
        if p.is_dir():
            return _inspect_dir(p)
        if fmt is WeightFormat.MLX:
            return _inspect_numpy(p)
        return _inspect_safetensors(p)
    except OSError as exc:
        raise fail(p, f"cannot read: {exc}") from exc


def architecture_of(path: str | os.PathLike[str], fmt: WeightFormat | None = None) -> str:
    """The lowercase architecture of the weights at ``path``, or ``""`` when they do not say."""
    p = Path(path)
    fmt = fmt or WeightFormat.from_path(p)
    if fmt is WeightFormat.GGUF and p.is_file():
        arch = read_gguf_header(p).metadata.get("general.architecture")
        return arch.lower() if isinstance(arch, str) else ""
    return (inspect(p).architecture or "").lower()


# -- GGUF --------------------------------------------------------------------------


def _type_name(raw: int) -> str:
    known = ggml_type(raw)
    return known[0] if known is not None else f"#{raw}"


def _inspect_gguf(p: Path) -> WeightReport:
    if p.is_dir():
        files = sorted(e for e in p.iterdir() if e.is_file() and e.suffix.lower() == ".gguf")
        if len(files) != 1:
            listing = ", ".join(f.name for f in files)
            raise fail(p, f"directory holds {len(files)} GGUF files; inspect one ({listing})")
        p = files[0]
    shards = _split_siblings(p, ".gguf")
    from rlx_lm._core import engine_kernel_types

    kernels = frozenset(engine_kernel_types())
    no_kernel = Counter[str]()
    total, dtypes, arch, tokenizer, version = 0, Counter[str](), None, None, 0
    for shard in shards or (p,):
        header = read_gguf_header(shard)
        version = version or header.version
        total += len(header.tensors)
        dtypes.update(_type_name(t.ggml_type) for t in header.tensors)
        no_kernel.update(
            _type_name(t.ggml_type) for t in header.tensors if t.ggml_type not in kernels
        )
        meta = header.metadata
        arch = arch or _str_or_none(meta.get("general.architecture"))
        if tokenizer is None and "tokenizer.ggml.model" in meta:
            n_tokens = header.array_lengths.get("tokenizer.ggml.tokens")
            tokenizer = f"embedded ({meta['tokenizer.ggml.model']}" + (
                f", {n_tokens} tokens)" if n_tokens is not None else ")"
            )
    details: dict[str, Any] = {"gguf version": version}
    if no_kernel:
        # the engine dequantises these once at load (or refuses a type gguf.quants cannot read)
        details["dequantised at load"] = ", ".join(
            f"{name} x{count}" for name, count in _ordered(no_kernel).items()
        )
    return WeightReport(
        path=p,
        format=WeightFormat.GGUF,
        architecture=arch,
        tensor_count=total,
        dtypes=_ordered(dtypes),
        tokenizer=tokenizer,
        size_bytes=sum(s.stat().st_size for s in shards or (p,)),
        shards=shards,
        details=details,
    )


def _split_siblings(p: Path, suffix: str) -> tuple[Path, ...]:
    m = _SHARD.search(p.stem)
    if m is None:
        return ()
    stem, count = p.stem[: m.start()], int(m.group(2))
    return tuple(p.with_name(f"{stem}-{i:05d}-of-{count:05d}{suffix}") for i in range(1, count + 1))


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _ordered(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# -- safetensors files and MLX directories -------------------------------------------


def _read_config(directory: Path, required: bool) -> dict[str, Any] | None:
    config = directory / "config.json"
    if not config.is_file():
        if required:
            raise fail(directory, "directory has no config.json")
        return None
    with open(config, "rb") as f:
        raw = f.read(16_000_001)
    if len(raw) > 16_000_000:
        raise fail(config, "config.json is larger than 16 MB")
    value = load_json(raw, config, "config.json")
    if not isinstance(value, dict):
        raise fail(config, "config.json must hold a JSON object")
    return value


def _tokenizer_in(directory: Path) -> str | None:
    for name in _TOKENIZER_FILES:
        if (directory / name).is_file():
            return name
    return None


def _safetensors_report(
    path: Path, files: Iterable[Path], config: dict[str, Any] | None, fmt: WeightFormat
) -> WeightReport:
    shard_list = tuple(files)
    dtypes: Counter[str] = Counter()
    total = 0
    for shard in shard_list:
        if not shard.is_file():
            raise fail(shard, "shard listed for this model is missing")
        header = read_safetensors_header(shard)
        total += len(header.tensors)
        dtypes.update(dtype for dtype, _ in header.tensors.values())
    directory = path if path.is_dir() else path.parent
    arch = _str_or_none(config.get("model_type")) if config else None
    return WeightReport(
        path=path,
        format=fmt,
        architecture=arch,
        tensor_count=total,
        dtypes=_ordered(dtypes),
        tokenizer=_tokenizer_in(directory),
        size_bytes=sum(s.stat().st_size for s in shard_list),
        shards=shard_list if len(shard_list) > 1 else (),
    )


def _index_shards(directory: Path) -> tuple[Path, ...] | None:
    return read_safetensors_index(directory)


def _inspect_safetensors(p: Path) -> WeightReport:
    shards: tuple[Path, ...] = (p,)
    indexed = _index_shards(p.parent)
    if indexed is not None and p in indexed:
        shards = indexed
    elif _SHARD.search(p.stem):
        shards = _split_siblings(p, p.suffix)
    return _safetensors_report(
        p, shards, _read_config(p.parent, required=False), WeightFormat.SAFETENSORS
    )


def _inspect_dir(p: Path) -> WeightReport:
    config = _read_config(p, required=True)
    shards = _index_shards(p)
    if shards is None:
        shards = tuple(sorted(e for e in p.iterdir() if e.suffix == ".safetensors"))
    if not shards:
        raise fail(p, "directory has config.json but no safetensors files")
    return _safetensors_report(p, shards, config, WeightFormat.MLX)


# -- npz / npy (MLX) ----------------------------------------------------------------


def _npy_header(f: Any, p: Path, what: str) -> str:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            _, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            _, _, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise fail(p, f"{what} has an invalid npy header: {exc}") from None
    return str(dtype)


def _inspect_numpy(p: Path) -> WeightReport:
    dtypes: Counter[str] = Counter()
    if p.suffix.lower() == ".npy":
        with open(p, "rb") as f:
            dtypes[_npy_header(f, p, "file")] += 1
    else:
        with _open_zip(p) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".npy"):
                    with zf.open(info) as f:
                        dtypes[_npy_header(f, p, info.filename)] += 1
    return WeightReport(
        path=p,
        format=WeightFormat.MLX,
        architecture=_str_or_none((_read_config(p.parent, required=False) or {}).get("model_type")),
        tensor_count=sum(dtypes.values()),
        dtypes=_ordered(dtypes),
        tokenizer=_tokenizer_in(p.parent),
        size_bytes=p.stat().st_size,
    )


# -- DDUF ---------------------------------------------------------------------------


def _open_zip(p: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(p)
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise fail(p, f"not a readable zip archive: {exc}") from None


def _inspect_dduf(p: Path) -> WeightReport:
    dtypes: Counter[str] = Counter()
    total, arch, tokenizer = 0, None, None
    with _open_zip(p) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith(".safetensors"):
                if info.compress_type != zipfile.ZIP_STORED:
                    raise fail(p, f"DDUF member {name!r} is compressed; DDUF stores files as is")
                try:
                    with zf.open(info) as f:
                        header = parse_safetensors_header(f, info.file_size, p / name)
                except (zipfile.BadZipFile, EOFError) as exc:
                    raise fail(p, f"DDUF member {name!r} is unreadable: {exc}") from None
                total += len(header.tensors)
                dtypes.update(dtype for dtype, _ in header.tensors.values())
            elif name.rsplit("/", 1)[-1] in _TOKENIZER_FILES and tokenizer is None:
                tokenizer = name
            elif name in ("model_index.json", "config.json") and arch is None:
                arch = _dduf_arch(zf, info, p)
    return WeightReport(
        path=p,
        format=WeightFormat.DDUF,
        architecture=arch,
        tensor_count=total,
        dtypes=_ordered(dtypes),
        tokenizer=tokenizer,
        size_bytes=p.stat().st_size,
    )


def _dduf_arch(zf: zipfile.ZipFile, info: zipfile.ZipInfo, p: Path) -> str | None:
    if info.file_size > 16_000_000:
        raise fail(p, f"DDUF member {info.filename!r} is too large for a config")
    try:
        raw = zf.read(info)
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise fail(p, f"DDUF member {info.filename!r} is unreadable: {exc}") from None
    value = load_json(raw, p / info.filename, f"DDUF member {info.filename!r}")
    if not isinstance(value, dict):
        return None
    return _str_or_none(value.get("model_type")) or _str_or_none(value.get("_class_name"))
