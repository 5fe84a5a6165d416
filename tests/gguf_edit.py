"""Edit a written GGUF file's header in place, to make it lie: a metadata integer, or one
tensor's dimensions, type or data offset. Used by the hostile-model tests and the GGUF
engine-load fuzz harness (tests/fuzz_io.py)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

_UINT32, _INT32, _FLOAT32 = 4, 5, 6


def _after_key(data: bytes | bytearray, key: str) -> int:
    """The byte just after the length-prefixed string ``key`` (a metadata key or tensor name)."""
    needle = struct.pack("<Q", len(key)) + key.encode()
    pos = bytes(data).find(needle)
    if pos < 0:
        raise KeyError(key)
    return pos + len(needle)


def set_u32(path: Path, key: str, value: int) -> None:
    """Overwrite the 32-bit integer metadata value ``key``."""
    data = bytearray(path.read_bytes())
    at = _after_key(data, key)
    (vtype,) = struct.unpack_from("<I", data, at)
    if vtype not in (_UINT32, _INT32):
        raise TypeError(f"{key} has GGUF value type {vtype}, not a 32-bit integer")
    struct.pack_into("<I", data, at + 4, value & 0xFFFFFFFF)
    path.write_bytes(bytes(data))


def set_f32(path: Path, key: str, value: float) -> None:
    """Make the 4-byte metadata value ``key`` (an integer or a float) a float32 ``value``:
    a header whose field has the wrong type, or a float that is NaN, zero or negative."""
    data = bytearray(path.read_bytes())
    at = _after_key(data, key)
    (vtype,) = struct.unpack_from("<I", data, at)
    if vtype not in (_UINT32, _INT32, _FLOAT32):
        raise TypeError(f"{key} has GGUF value type {vtype}, not a 4-byte number")
    struct.pack_into("<If", data, at, _FLOAT32, value)
    path.write_bytes(bytes(data))


def tensor_fields(path: Path, name: str) -> tuple[list[int], int, int]:
    """``(dims, ggml_type, offset)`` of tensor ``name`` as its header entry states them."""
    data = path.read_bytes()
    at = _after_key(data, name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    dims = list(struct.unpack_from(f"<{n_dims}Q", data, at + 4))
    ggml_type, offset = struct.unpack_from("<IQ", data, at + 4 + 8 * n_dims)
    return dims, ggml_type, offset


def set_tensor(
    path: Path,
    name: str,
    *,
    dims: Sequence[int] | None = None,
    ggml_type: int | None = None,
    offset: int | None = None,
) -> None:
    """Overwrite tensor ``name``'s header entry (``dims`` keeps its dimension count)."""
    data = bytearray(path.read_bytes())
    at = _after_key(data, name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    if dims is not None:
        if len(dims) != n_dims:
            raise ValueError(f"{name} has {n_dims} dimensions, got {len(dims)}")
        for i, d in enumerate(dims):
            struct.pack_into("<Q", data, at + 4 + 8 * i, d & 0xFFFFFFFFFFFFFFFF)
    typed_at = at + 4 + 8 * n_dims
    if ggml_type is not None:
        struct.pack_into("<I", data, typed_at, ggml_type)
    if offset is not None:
        struct.pack_into("<Q", data, typed_at + 4, offset & 0xFFFFFFFFFFFFFFFF)
    path.write_bytes(bytes(data))
