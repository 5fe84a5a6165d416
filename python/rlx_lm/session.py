"""Session snapshots: a runner's KV state and the tokens that produced it.

A `SessionSnapshot` is immutable. It pickles, and saves to / loads from a
safetensors file (tensors ``layers.{i}.keys`` / ``layers.{i}.values``; tokens,
fingerprint and geometry in the metadata) written atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx_lm._core import KvCache, KvSnapshot
from rlx_lm.errors import ShapeError, SnapshotMismatchError, WeightFormatError

__all__ = ["ModelFingerprint", "SessionSnapshot"]

FORMAT = "rlx_lm.session"
FORMAT_VERSION = "1"
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit
_MAX_SEQ = 1 << 24  # refuse absurd capacities from hostile files before allocating
_DTYPES = {"float32": ("F32", 4), "float16": ("F16", 2)}


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of the model a snapshot belongs to: family, geometry and a runner-chosen id."""

    family: str
    geometry: tuple[int, ...]
    model_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "family", str(self.family))
        object.__setattr__(self, "geometry", tuple(int(g) for g in self.geometry))
        object.__setattr__(self, "model_id", str(self.model_id))

    def to_json(self) -> str:
        """The fingerprint as a JSON object string."""
        return json.dumps(
            {"family": self.family, "geometry": list(self.geometry), "model_id": self.model_id}
        )

    @classmethod
    def from_json(cls, text: str) -> ModelFingerprint:
        """Parse `to_json` output; anything else raises WeightFormatError."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or set(data) != {"family", "geometry", "model_id"}:
                raise ValueError("expected keys family, geometry, model_id")
            family, geometry, model_id = data["family"], data["geometry"], data["model_id"]
            if not isinstance(family, str) or not isinstance(model_id, str):
                raise ValueError("family and model_id must be strings")
            if not isinstance(geometry, list) or not all(
                isinstance(g, int) and not isinstance(g, bool) for g in geometry
            ):
                raise ValueError("geometry must be a list of integers")
        except ValueError as e:
            raise WeightFormatError(f"invalid model fingerprint {text[:80]!r}: {e}") from None
        return cls(family, tuple(geometry), model_id)

    def mismatch(self, other: ModelFingerprint | None) -> str | None:
        """Why a snapshot of `other` does not fit this model, or None when it does."""
        if other is None:
            return f"the snapshot has no fingerprint; this model is {self}"
        for name in ("family", "geometry", "model_id"):
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
        toks = tuple(int(t) for t in tokens)
        if isinstance(kv, KvSnapshot) and kv.len() != len(toks):
            raise ShapeError(
                f"the KV snapshot holds {kv.len()} tokens but {len(toks)} token ids were given"
            )
        if fingerprint is not None and not isinstance(fingerprint, ModelFingerprint):
            raise TypeError(f"fingerprint must be a ModelFingerprint, got {type(fingerprint)}")
        object.__setattr__(self, "kv", kv)
        object.__setattr__(self, "tokens", toks)
        object.__setattr__(self, "fingerprint", fingerprint)

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
        """Write a safetensors file atomically: temporary file, fsync (if `durable`), rename."""
        kv = self._kv()
        target = Path(path)
        header = _header(kv, self.tokens, self.fingerprint)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(struct.pack("<Q", len(header)))
                f.write(header)
            kv._write_data(tmp)
            if durable:
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if durable:
            _fsync_dir(target.parent)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, fingerprint: ModelFingerprint | None = None
    ) -> SessionSnapshot:
        """Read a file written by `save`; with `fingerprint`, refuse another model's snapshot."""
        info = read_header(path)
        if fingerprint is not None:
            why = fingerprint.mismatch(info.fingerprint)
            if why is not None:
                raise SnapshotMismatchError(f"{path}: {why}")
        kv = KvSnapshot._read_data(
            Path(path),
            info.data_offset,
            info.n_layers,
            info.n_kv_heads,
            info.head_dim,
            info.dtype,
            info.max_seq,
            len(info.tokens),
        )
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


def _header(kv: KvSnapshot, tokens: Sequence[int], fingerprint: ModelFingerprint | None) -> bytes:
    st_dtype, itemsize = _DTYPES[kv.dtype]
    shape = [kv.n_kv_heads, kv.len(), kv.head_dim]
    size = kv.n_kv_heads * kv.len() * kv.head_dim * itemsize
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


def _positive(meta: dict[str, Any], key: str, minimum: int = 1) -> int:
    value = meta.get(key)
    if not isinstance(value, str) or not value.isdigit() or int(value) < minimum:
        raise ValueError(f"metadata {key!r} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def read_header(path: str | os.PathLike[str]) -> SnapshotFileInfo:
    """Validate a snapshot file's header and size without reading its rows."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise ValueError(f"header length {n} does not fit a file of {size} bytes")
            doc = json.loads(f.read(n))
        info = _parse(doc, data_offset=8 + n)
        if 8 + n + info.data_bytes != size:
            raise ValueError(
                f"expected {info.data_bytes} bytes of rows, file holds {size - 8 - n} "
                "(truncated or padded)"
            )
    except WeightFormatError as e:
        raise WeightFormatError(f"{p}: {e}") from None
    except (ValueError, UnicodeDecodeError, struct.error, KeyError, TypeError) as e:
        raise WeightFormatError(f"{p}: not a valid rlx_lm session snapshot: {e}") from None
    return info


def _parse(doc: Any, data_offset: int) -> SnapshotFileInfo:
    if not isinstance(doc, dict) or not isinstance(doc.get("__metadata__"), dict):
        raise ValueError("no __metadata__ in the header")
    meta = doc["__metadata__"]
    if meta.get("format") != FORMAT:
        raise ValueError(f"format is {meta.get('format')!r}, not {FORMAT!r} (a foreign file)")
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"unsupported snapshot version {meta.get('version')!r}")
    n_layers = _positive(meta, "n_layers")
    n_kv_heads = _positive(meta, "n_kv_heads")
    head_dim = _positive(meta, "head_dim")
    max_seq = _positive(meta, "max_seq")
    if max_seq > _MAX_SEQ:
        raise ValueError(f"max_seq={max_seq} is beyond any supported context ({_MAX_SEQ})")
    dtype = meta.get("dtype")
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    tokens = json.loads(meta.get("tokens", ""))
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise ValueError("tokens must be a list of non-negative integers")
    if len(tokens) > max_seq:
        raise ValueError(f"{len(tokens)} tokens exceed max_seq={max_seq}")
    fp_text = meta.get("fingerprint")
    if not isinstance(fp_text, str):
        raise ValueError("missing fingerprint")
    fingerprint = None if fp_text == "null" else ModelFingerprint.from_json(fp_text)
    st_dtype, itemsize = _DTYPES[dtype]
    size = n_kv_heads * len(tokens) * head_dim * itemsize
    expected_names = {f"layers.{i}.{h}" for i in range(n_layers) for h in ("keys", "values")}
    if set(doc) - {"__metadata__"} != expected_names:
        raise ValueError("tensor names do not match the declared number of layers")
    offset = 0
    for layer in range(n_layers):
        for half in ("keys", "values"):
            t = doc[f"layers.{layer}.{half}"]
            want = {
                "dtype": st_dtype,
                "shape": [n_kv_heads, len(tokens), head_dim],
                "data_offsets": [offset, offset + size],
            }
            if t != want:
                raise ValueError(f"tensor layers.{layer}.{half} is {t}, expected {want}")
            offset += size
    return SnapshotFileInfo(
        tuple(tokens),
        fingerprint,
        n_layers,
        n_kv_heads,
        head_dim,
        dtype,
        max_seq,
        data_offset,
        offset,
    )
