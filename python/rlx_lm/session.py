"""Session snapshots: a runner's KV state and the tokens that produced it.

A `SessionSnapshot` is immutable. It pickles, and saves to / loads from a
safetensors file (tensors ``layers.{i}.keys`` / ``layers.{i}.values``; tokens,
fingerprint and geometry in the metadata) written atomically.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import struct
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from rlx_lm._core import (
    KV_MAX_HEAD_DIM,
    KV_MAX_KV_HEADS,
    KV_MAX_LAYERS,
    KV_MAX_SEQ,
    KvCache,
    KvSnapshot,
)
from rlx_lm._headers import SafetensorsHeader, parse_safetensors_header
from rlx_lm.errors import InvalidOptionError, ShapeError, SnapshotMismatchError, WeightFormatError

__all__ = ["ModelFingerprint", "SessionSnapshot"]

FORMAT = "rlx_lm.session"
FORMAT_VERSION = "1"
MAX_TOKEN_ID = (1 << 63) - 1
"""Largest token id a snapshot file holds (token ids are stored as JSON integers)."""
_DTYPES = {"float32": ("F32", 4), "float16": ("F16", 2)}


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of the model a snapshot belongs to: family, geometry, a runner-chosen id,
    and the KV storage dtype (``""`` when the runner does not say).

    Two runners of one model whose KV caches store different dtypes have
    different fingerprints, so a prompt cache or a restore tells their
    snapshots apart instead of failing later.
    """

    family: str
    geometry: tuple[int, ...]
    model_id: str = ""
    kv_dtype: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", str(self.family))
        object.__setattr__(self, "geometry", tuple(int(g) for g in self.geometry))
        object.__setattr__(self, "model_id", str(self.model_id))
        object.__setattr__(self, "kv_dtype", str(self.kv_dtype))

    def to_json(self) -> str:
        """The fingerprint as a JSON object string (``kv_dtype`` only when set)."""
        data: dict[str, Any] = {
            "family": self.family,
            "geometry": list(self.geometry),
            "model_id": self.model_id,
        }
        if self.kv_dtype:
            data["kv_dtype"] = self.kv_dtype
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> ModelFingerprint:
        """Parse `to_json` output; anything else raises WeightFormatError."""
        try:
            data = json.loads(text)
            keys = {"family", "geometry", "model_id"}
            if not isinstance(data, dict) or set(data) - {"kv_dtype"} != keys:
                raise ValueError("expected keys family, geometry, model_id (and kv_dtype)")
            family, geometry, model_id = data["family"], data["geometry"], data["model_id"]
            kv_dtype = data.get("kv_dtype", "")
            if not all(isinstance(x, str) for x in (family, model_id, kv_dtype)):
                raise ValueError("family, model_id and kv_dtype must be strings")
            if not isinstance(geometry, list) or not all(
                isinstance(g, int) and not isinstance(g, bool) for g in geometry
            ):
                raise ValueError("geometry must be a list of integers")
        except ValueError as e:
            raise WeightFormatError(f"invalid model fingerprint {text[:80]!r}: {e}") from None
        except RecursionError:
            raise WeightFormatError(
                f"invalid model fingerprint {text[:80]!r}: nested too deeply"
            ) from None
        return cls(family, tuple(geometry), model_id, kv_dtype)

    def mismatch(self, other: ModelFingerprint | None) -> str | None:
        """Why a snapshot of `other` does not fit this model, or None when it does."""
        if other is None:
            return f"the snapshot has no fingerprint; this model is {self}"
        for name in ("family", "geometry", "model_id", "kv_dtype"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"snapshot {name} {theirs!r} does not match this model's {mine!r}"
        return None


@dataclass(frozen=True, eq=False)
class SessionSnapshot:
    """A decode session frozen in time: KV state, token history and model fingerprint.

    ``kv`` is normally an `rlx_lm.KvSnapshot` (then ``len(tokens)`` must equal
    ``kv.len()``); saving, loading, pickling and geometry checks need one.
    """

    kv: Any
    tokens: tuple[int, ...]
    fingerprint: ModelFingerprint | None = None

    def __init__(
        self, kv: Any, tokens: Sequence[int], fingerprint: ModelFingerprint | None = None
    ) -> None:
        toks = tuple(map(int, tokens))
        if isinstance(kv, KvSnapshot) and kv.len() != len(toks):
            raise ShapeError(
                f"the KV snapshot holds {kv.len()} tokens but {len(toks)} token ids were given"
            )
        if fingerprint is not None and not isinstance(fingerprint, ModelFingerprint):
            raise TypeError(f"fingerprint must be a ModelFingerprint, got {type(fingerprint)}")
        object.__setattr__(self, "kv", kv)
        object.__setattr__(self, "tokens", toks)
        object.__setattr__(self, "fingerprint", fingerprint)

    def advanced(
        self, kv: Any, token: int, fingerprint: ModelFingerprint | None = None
    ) -> SessionSnapshot:
        """This session one token later: ``kv`` holds the history plus ``token``.

        Equal to ``SessionSnapshot(kv, [*self.tokens, token], fingerprint)`` without
        converting the history again, so a decode step costs the same at any context
        length (a batched decode makes one of these per sequence per step).
        """
        toks = (*self.tokens, int(token))
        if isinstance(kv, KvSnapshot) and kv.len() != len(toks):
            raise ShapeError(
                f"the KV snapshot holds {kv.len()} tokens but {len(toks)} token ids were given"
            )
        if fingerprint is not None and not isinstance(fingerprint, ModelFingerprint):
            raise TypeError(f"fingerprint must be a ModelFingerprint, got {type(fingerprint)}")
        new = object.__new__(SessionSnapshot)
        object.__setattr__(new, "kv", kv)
        object.__setattr__(new, "tokens", toks)
        object.__setattr__(new, "fingerprint", fingerprint)
        return new

    def __reduce__(self) -> tuple[Any, ...]:
        return (SessionSnapshot, (self.kv, self.tokens, self.fingerprint))

    def __repr__(self) -> str:
        return (
            f"SessionSnapshot(tokens={len(self.tokens)}, kv={self.kv!r}, "
            f"fingerprint={self.fingerprint!r})"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the KV rows held (0 when ``kv`` is not a KvSnapshot)."""
        return self.kv.nbytes if isinstance(self.kv, KvSnapshot) else 0

    def _kv(self) -> KvSnapshot:
        if not isinstance(self.kv, KvSnapshot):
            raise TypeError(
                f"this operation needs the snapshot's kv to be an rlx_lm.KvSnapshot, "
                f"got {type(self.kv).__name__}"
            )
        return self.kv

    def check(self, fingerprint: ModelFingerprint | None, cache: KvCache | None = None) -> None:
        """Raise SnapshotMismatchError unless this belongs to `fingerprint` and fits `cache`."""
        if fingerprint is not None:
            why = fingerprint.mismatch(self.fingerprint)
            if why is not None:
                raise SnapshotMismatchError(why)
        if cache is not None:
            kv = self._kv()
            mine = (kv.n_layers, kv.n_kv_heads, kv.head_dim, kv.dtype)
            theirs = (cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.dtype)
            if mine != theirs:
                raise SnapshotMismatchError(
                    f"snapshot geometry (layers, kv_heads, head_dim, dtype) {mine} does not "
                    f"match the cache's {theirs}"
                )
            if kv.len() > cache.max_seq:
                raise SnapshotMismatchError(
                    f"snapshot holds {kv.len()} tokens, more than the cache's "
                    f"max_seq={cache.max_seq}"
                )

    def restore_into(
        self,
        cache: KvCache,
        fingerprint: ModelFingerprint | None,
        reuse_len: int | None = None,
    ) -> None:
        """Check, then make `cache` hold this snapshot's first `reuse_len` tokens (default all)."""
        self.check(fingerprint, cache)
        keep = len(self.tokens) if reuse_len is None else int(reuse_len)
        if not 0 <= keep <= len(self.tokens):
            raise SnapshotMismatchError(
                f"reuse_len={keep} is outside 0..{len(self.tokens)} for this snapshot"
            )
        cache.restore(self._kv())
        cache.truncate(keep)

    # ------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike[str], *, durable: bool = True) -> None:
        """Write a safetensors file atomically: temporary file, fsync (if `durable`), rename.

        What `load` would refuse is refused here first (InvalidOptionError), so a
        saved file can always be loaded. The file keeps the mode of the one it
        replaces (a new file gets the usual ``0o666`` less the umask). Temporary
        files that a killed save left for the same target are removed.
        """
        kv = self._kv()
        target = Path(path)
        header = _header(kv, self.tokens, self.fingerprint)
        try:
            _check_header(header, data_size=2 * kv.n_layers * _tensor_bytes(kv))
        except (ValueError, WeightFormatError) as e:
            raise InvalidOptionError(
                f"cannot save this snapshot to {target}: the file could not be loaded back ({e})"
            ) from None
        mode = _mode_for(target)
        fd, tmp_name = tempfile.mkstemp(
            prefix=f".{target.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=target.parent
        )
        tmp = Path(tmp_name)
        _SAVING.add(tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                if hasattr(os, "fchmod"):
                    os.fchmod(f.fileno(), mode)
                f.write(struct.pack("<Q", len(header)))
                f.write(header)
                f.flush()
                kv._write_data(f.fileno(), 8 + len(header))
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        finally:
            _SAVING.discard(tmp)
        if durable:
            _fsync_dir(target.parent)
        reclaim_temp_files(target.parent, target.name)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, fingerprint: ModelFingerprint | None = None
    ) -> SessionSnapshot:
        """Read a file written by `save`; with `fingerprint`, refuse another model's snapshot.

        The file is opened once: header and rows come from the same file even
        if it is replaced (saved again) meanwhile.
        """
        p = Path(path)
        with open(p, "rb") as f:
            info = _read_header(f, p)
            if fingerprint is not None:
                why = fingerprint.mismatch(info.fingerprint)
                if why is not None:
                    raise SnapshotMismatchError(f"{path}: {why}")
            kv = _read_rows(f, info)
        return cls(kv, info.tokens, info.fingerprint)


@dataclass(frozen=True)
class SnapshotFileInfo:
    """What a snapshot file's header says, validated."""

    tokens: tuple[int, ...]
    fingerprint: ModelFingerprint | None
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str
    max_seq: int
    data_offset: int
    data_bytes: int


def _read_rows(f: BinaryIO, info: SnapshotFileInfo) -> KvSnapshot:
    """The rows `info` describes, from the open file `f` (never reopened by path)."""
    return KvSnapshot._read_data(
        f.fileno(),
        info.data_offset,
        info.n_layers,
        info.n_kv_heads,
        info.head_dim,
        info.dtype,
        info.max_seq,
        len(info.tokens),
    )


def _tensor_bytes(kv: KvSnapshot) -> int:
    return kv.n_kv_heads * kv.len() * kv.head_dim * _DTYPES[kv.dtype][1]


def _header(kv: KvSnapshot, tokens: Sequence[int], fingerprint: ModelFingerprint | None) -> bytes:
    st_dtype, _ = _DTYPES[kv.dtype]
    shape = [kv.n_kv_heads, kv.len(), kv.head_dim]
    size = _tensor_bytes(kv)
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "n_layers": str(kv.n_layers),
        "n_kv_heads": str(kv.n_kv_heads),
        "head_dim": str(kv.head_dim),
        "dtype": kv.dtype,
        "max_seq": str(kv.max_seq),
        "tokens": json.dumps(list(tokens)),
        "fingerprint": "null" if fingerprint is None else fingerprint.to_json(),
    }
    doc: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    for layer in range(kv.n_layers):
        for half in ("keys", "values"):
            doc[f"layers.{layer}.{half}"] = {
                "dtype": st_dtype,
                "shape": shape,
                "data_offsets": [offset, offset + size],
            }
            offset += size
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # 8-byte aligned data, as safetensors writers do


def _check_header(header: bytes, data_size: int) -> SnapshotFileInfo:
    """Validate a header about to be written exactly as `load` will read it."""
    size = 8 + len(header) + data_size
    buf = io.BytesIO(struct.pack("<Q", len(header)) + header)
    return _parse_stream(buf, size, Path("<snapshot being saved>"))


def _mode_for(target: Path) -> int:
    """The mode a saved file gets: the replaced file's, else 0o666 less the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # read without changing it (os.umask would race other threads)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


TEMP_SUFFIX = ".tmp"
"""Suffix of the temporary files a save writes (``.{name}.{pid}.{random}.tmp``)."""

_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")
_LEGACY_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp$")
_LEGACY_TEMP_AGE = 3600.0
"""Temporary files of writers that did not record their pid are reclaimed after an hour."""
_SAVING: set[Path] = set()
"""Temporary files this process is writing now (never reclaimed)."""


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def reclaim_temp_files(directory: Path, name: str | None = None) -> list[Path]:
    """Remove temporary files a killed save left in `directory` (for target `name`, or any).

    A temporary file is reclaimed when the process that wrote it is gone (its
    pid is in the name), or, for names without a pid, when it is an hour old.
    Files this process is writing are never touched. Returns what was removed.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for e in entries:
        if not e.name.endswith(TEMP_SUFFIX) or not e.name.startswith("."):
            continue
        path = Path(directory) / e.name
        if path in _SAVING:
            continue
        m = _TEMP_NAME.match(e.name)
        if m is not None:
            stale = not _pid_alive(int(m.group("pid")))
        else:
            m = _LEGACY_TEMP_NAME.match(e.name)
            if m is None:
                continue
            try:
                stale = now - e.stat(follow_symlinks=False).st_mtime > _LEGACY_TEMP_AGE
            except OSError:
                continue
        if not stale or (name is not None and m.group("name") != name):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _bounded(meta: dict[str, str], key: str, maximum: int, minimum: int = 1) -> int:
    value = meta.get(key)
    if (
        not isinstance(value, str)
        or not value.isascii()
        or not value.isdigit()
        or len(value) > 20
        or not minimum <= int(value) <= maximum
    ):
        raise ValueError(
            f"metadata {key!r} must be an integer in {minimum}..{maximum}, got {value!r}"
        )
    return int(value)


def read_header(path: str | os.PathLike[str]) -> SnapshotFileInfo:
    """Validate a snapshot file's header and size without reading its rows."""
    p = Path(path)
    with open(p, "rb") as f:
        return _read_header(f, p)


def _read_header(f: BinaryIO, p: Path) -> SnapshotFileInfo:
    size = os.fstat(f.fileno()).st_size
    return _parse_stream(f, size, p)


def _parse_stream(f: IO[bytes], size: int, p: Path) -> SnapshotFileInfo:
    try:
        header = parse_safetensors_header(f, size, p)
        info = _parse(header)
        if info.data_offset + info.data_bytes != size:
            raise ValueError(
                f"expected {info.data_bytes} bytes of rows, file holds {size - info.data_offset} "
                "(truncated or padded)"
            )
    except WeightFormatError as e:
        reason = str(e).removeprefix(f"{p}: ")
        raise WeightFormatError(f"{p}: not a valid rlx_lm session snapshot: {reason}") from None
    except (ValueError, OverflowError) as e:
        raise WeightFormatError(f"{p}: not a valid rlx_lm session snapshot: {e}") from None
    return info


def _parse(header: SafetensorsHeader) -> SnapshotFileInfo:
    meta = header.metadata
    if meta.get("format") != FORMAT:
        raise ValueError(f"format is {meta.get('format')!r}, not {FORMAT!r} (a foreign file)")
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"unsupported snapshot version {meta.get('version')!r}")
    n_layers = _bounded(meta, "n_layers", KV_MAX_LAYERS)
    n_kv_heads = _bounded(meta, "n_kv_heads", KV_MAX_KV_HEADS)
    head_dim = _bounded(meta, "head_dim", KV_MAX_HEAD_DIM)
    max_seq = _bounded(meta, "max_seq", KV_MAX_SEQ)
    dtype = meta.get("dtype")
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    if len(header.tensors) != 2 * n_layers:  # before anything is built per layer
        raise ValueError(
            f"{len(header.tensors)} tensors for the declared {n_layers} layers "
            f"(expected {2 * n_layers})"
        )
    try:
        tokens = json.loads(meta.get("tokens", ""))
    except RecursionError:
        raise ValueError("tokens nest too deeply") from None
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in tokens
    ):
        raise ValueError(f"tokens must be a list of integers in 0..{MAX_TOKEN_ID}")
    if len(tokens) > max_seq:
        raise ValueError(f"{len(tokens)} tokens exceed max_seq={max_seq}")
    fp_text = meta.get("fingerprint")
    if not isinstance(fp_text, str):
        raise ValueError("missing fingerprint")
    fingerprint = None if fp_text == "null" else ModelFingerprint.from_json(fp_text)
    st_dtype, itemsize = _DTYPES[dtype]
    size = n_kv_heads * len(tokens) * head_dim * itemsize
    shape = (n_kv_heads, len(tokens), head_dim)
    offset = 0
    for layer in range(n_layers):
        for half in ("keys", "values"):
            name = f"layers.{layer}.{half}"
            found = header.tensors.get(name)
            if found is None:
                raise ValueError(f"tensor {name} is missing")
            want = (st_dtype, shape)
            if found != want or header.offsets[name] != (offset, offset + size):
                raise ValueError(
                    f"tensor {name} is {found} at {header.offsets[name]}, expected {want} at "
                    f"{(offset, offset + size)}"
                )
            offset += size
    return SnapshotFileInfo(
        tuple(tokens),
        fingerprint,
        n_layers,
        n_kv_heads,
        head_dim,
        dtype,
        max_seq,
        header.data_offset,
        offset,
    )
