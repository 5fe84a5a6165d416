"""Bounds-checked reading of GGUF and safetensors headers.

Every count and length a header claims is checked against the bytes the file
actually has before anything is allocated or looped over, so a hostile or
truncated file fails fast with `WeightFormatError` naming the path and the
reason. Only headers are read (through a memory map); tensor data never is.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Collection, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from rlx_lm.errors import WeightFormatError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
MAX_METADATA_ARRAY = 1 << 21
"""Longest ``tokenizer.*`` metadata array accepted (2M items: a 262k-token vocabulary and
its merges are far below it)."""
MAX_OTHER_METADATA_ARRAY = 1 << 16
"""Longest metadata array outside ``tokenizer.*`` (per-layer settings, tags, languages):
a long array there is no model's, and readers such as ``gguf.GGUFReader`` spend about a
kilobyte of memory per item they decode."""
MAX_NESTING = 4
SAFETENSORS_MAX_HEADER = 100_000_000
"""The safetensors format's own cap on its JSON header, in bytes."""

# GGUF metadata value types: id -> (struct code, size) for scalars.
_GGUF_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
_GGUF_STRING = 8
_GGUF_ARRAY = 9

SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


def fail(path: Path, reason: str) -> WeightFormatError:
    """The format error for ``path``: it always names the file and the reason."""
    return WeightFormatError(f"{path}: {reason}")


def load_json(raw: bytes | str, path: Path, what: str) -> Any:
    """Parse JSON from a file, every failure (nesting too deep included) a WeightFormatError."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise fail(path, f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise fail(path, f"{what} nests JSON too deeply to be read") from None


@contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """A read-only memory map of ``path`` (pages are read only when touched)."""
    with open(path, "rb") as f:
        if _size(f) == 0:
            raise fail(path, "the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                yield view
            finally:
                view.release()


def _size(f: BinaryIO) -> int:
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    return size


# -- GGUF ------------------------------------------------------------------------


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor's header entry: name, GGML type id, shape (GGUF order), data range."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    n_bytes: int


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF header that has been checked against the file's size."""

    version: int
    byte_order: str
    metadata: dict[str, Any]
    """Scalar and string values; arrays are kept only as their lengths."""
    array_lengths: dict[str, int]
    tensors: tuple[GgufTensorInfo, ...]
    data_offset: int
    file_size: int
    arrays: dict[str, Any] = field(default_factory=dict)
    """Values of the arrays asked for by name: ``list[str]`` or a 1-D numpy array."""
    array_types: dict[str, int] = field(default_factory=dict)
    """The GGUF item type of every array (4 uint32, 6 float32, 8 string, ...)."""


class _Cursor:
    __slots__ = ("buf", "order", "path", "pos", "size")

    def __init__(self, buf: memoryview, path: Path, order: str) -> None:
        self.buf, self.path, self.order = buf, path, order
        self.pos, self.size = 0, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise fail(
                self.path,
                f"truncated or corrupt GGUF header: {what} needs {n} bytes at offset "
                f"{self.pos}, but the file has {self.size} bytes",
            )

    def scalar(self, code: str, width: int, what: str) -> Any:
        self.need(width, what)
        (value,) = struct.unpack_from(self.order + code, self.buf, self.pos)
        self.pos += width
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar("I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar("Q", 8, what))

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise fail(self.path, f"{what} is not valid UTF-8 ({exc.reason})") from None

    def skip_string(self, what: str) -> None:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        self.pos += n

    def room(self) -> int:
        return self.size - self.pos


def read_gguf_header(path: Path, *, arrays: Collection[str] | bool = ()) -> GgufHeader:
    """Walk a GGUF header, checking every count and length against the file size.

    ``arrays`` names metadata arrays whose values to keep (a tokenizer's tokens, scores,
    merges): strings as ``list[str]``, numbers as a numpy array. Their counts are checked
    against the file before anything is allocated; nested arrays keep only their length.
    ``arrays=True`` keeps every flat array.

    A header read without arrays is served from a small cache when the file's bytes up
    to its tensor data are the ones it was read from (same size, same BLAKE2 digest of
    the header bytes, a few milliseconds): loading a model asks for the header from
    several places (architecture, context length, weights, tensor checks), and each walk
    reads every token string of the vocabulary to skip it (~0.1 s for 49k tokens). Every
    read refreshes the cache; each caller gets its own dicts.
    """
    with mapped(path) as buf:
        if not arrays:
            hit = _cached(path, buf)
            if hit is not None:
                return hit
        header = walk_gguf(buf, path, arrays=arrays)
        _remember(path, buf, header)
        return header


_CACHE_SIZE = 8
_CACHE: OrderedDict[str, tuple[int, bytes, GgufHeader]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _digest(buf: memoryview, n: int) -> bytes:
    return hashlib.blake2b(buf[:n], digest_size=16).digest()


def _copy(header: GgufHeader) -> GgufHeader:
    """The header with dicts of its own (without array values)."""
    return replace(
        header,
        metadata=dict(header.metadata),
        array_lengths=dict(header.array_lengths),
        array_types=dict(header.array_types),
        arrays={},
    )


def _cached(path: Path, buf: memoryview) -> GgufHeader | None:
    with _CACHE_LOCK:
        entry = _CACHE.get(os.path.realpath(path))
    if entry is None:
        return None
    size, digest, header = entry
    if len(buf) != size or _digest(buf, header.data_offset) != digest:
        return None
    return _copy(header)


def _remember(path: Path, buf: memoryview, header: GgufHeader) -> None:
    entry = (len(buf), _digest(buf, header.data_offset), _copy(header))
    key = os.path.realpath(path)
    with _CACHE_LOCK:
        _CACHE[key] = entry
        _CACHE.move_to_end(key)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)


def walk_gguf(
    buf: memoryview | bytes, path: Path, *, arrays: Collection[str] | bool = ()
) -> GgufHeader:
    """`read_gguf_header` over bytes already in memory (``path`` names them in errors)."""
    view = memoryview(buf) if isinstance(buf, bytes) else buf
    wanted: Container[str] = _All() if arrays is True else frozenset(arrays or ())
    return _walk_gguf(view, path, wanted)


class _All:
    def __contains__(self, key: object) -> bool:
        return True


def _walk_gguf(buf: memoryview, path: Path, wanted: Container[str] = frozenset()) -> GgufHeader:
    if len(buf) < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        raise fail(path, f"not a GGUF file (first bytes {bytes(buf[:4])!r}, expected b'GGUF')")
    if len(buf) < 24:
        raise fail(path, f"truncated GGUF header: {len(buf)} bytes, the fixed part needs 24")
    order = "<"
    (version,) = struct.unpack_from("<I", buf, 4)
    if version & 0xFFFF == 0:
        order = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version not in GGUF_VERSIONS:
        raise fail(path, f"unsupported GGUF version {version} (supported: 2, 3)")
    cur = _Cursor(buf, path, order)
    cur.pos = 8
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # Smallest possible entries: a key/value is 8 (key length) + 4 (type) + 1
    # byte; a tensor info is 8 (name length) + 4 (dims) + 4 (type) + 8 (offset).
    if n_kv > cur.room() // 13:
        raise fail(
            path,
            f"GGUF header claims {n_kv} metadata entries, but the file has room for at "
            f"most {cur.room() // 13}",
        )
    if n_tensors > cur.room() // 24:
        raise fail(
            path,
            f"GGUF header claims {n_tensors} tensors, but the file has room for at most "
            f"{cur.room() // 24}",
        )
    metadata: dict[str, Any] = {}
    arrays: dict[str, int] = {}
    values: dict[str, Any] = {}
    types: dict[str, int] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata or key in arrays:
            raise fail(path, f"duplicate metadata key {key!r}")
        vtype = cur.u32(f"type of {key!r}")
        if vtype == _GGUF_ARRAY:
            types[key] = cur.u32(f"item type of {key!r}")
            cur.pos -= 4
        if vtype == _GGUF_ARRAY and key in wanted:
            arrays[key], value = _read_array(cur, key)
            if value is not None:
                values[key] = value
        elif vtype == _GGUF_ARRAY:
            arrays[key] = _skip_array(cur, key, 0)
        else:
            metadata[key] = _value(cur, vtype, key)
    _check_tokenizer_arrays(path, arrays, types)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise fail(path, f"general.alignment must be a power of two, got {alignment!r}")
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    names: set[str] = set()
    for info in infos:
        if info.name in names:
            raise fail(path, f"duplicate tensor name {info.name!r}")
        names.add(info.name)
        if info.offset % alignment:
            raise fail(path, f"tensor {info.name!r} data offset {info.offset} is not aligned")
        end = data_offset + info.offset + info.n_bytes
        if end > cur.size:
            raise fail(
                path,
                f"truncated: tensor {info.name!r} needs bytes up to {end}, but the file has "
                f"{cur.size}",
            )
    _check_tensor_layout(path, infos, alignment)
    return GgufHeader(
        version=version,
        byte_order=order,
        metadata=metadata,
        array_lengths=arrays,
        tensors=tuple(infos),
        data_offset=data_offset,
        file_size=cur.size,
        arrays=values,
        array_types=types,
    )


def _check_tensor_layout(path: Path, infos: list[GgufTensorInfo], alignment: int) -> None:
    """Tensor data lies packed, as every GGUF writer lays it out (llama.cpp refuses any other
    layout): in offset order each tensor starts where the previous one ends, rounded up to
    the alignment. A tensor whose type or shape lies about its size overlaps its neighbour or
    leaves a gap, so it is refused here instead of being read as the wrong numbers."""
    ordered = sorted(infos, key=lambda t: (t.offset, t.n_bytes))
    expected = 0
    previous: GgufTensorInfo | None = None
    for info in ordered:
        if info.offset < expected and previous is not None:
            raise fail(
                path,
                f"tensor {info.name!r} (data offset {info.offset}) overlaps tensor "
                f"{previous.name!r} (bytes {previous.offset}..{previous.offset + previous.n_bytes})"
                "; a tensor's type or shape does not match its data",
            )
        if info.offset > expected:
            after = f"after tensor {previous.name!r}" if previous else "before the first tensor"
            raise fail(
                path,
                f"{info.offset - expected} bytes of tensor data {after} belong to no tensor "
                f"(tensor {info.name!r} starts at {info.offset}, expected {expected}); a "
                "tensor's type or shape does not match its data",
            )
        expected = -(-(info.offset + info.n_bytes) // alignment) * alignment
        previous = info


_TOKENIZER_ARRAY_TYPES = {
    "tokenizer.ggml.tokens": (_GGUF_STRING, "strings"),
    "tokenizer.ggml.merges": (_GGUF_STRING, "strings"),
    "tokenizer.ggml.scores": (6, "float32"),
    "tokenizer.ggml.token_type": (5, "int32"),
}


def _check_tokenizer_arrays(path: Path, lengths: dict[str, int], types: dict[str, int]) -> None:
    """The vocabulary arrays have llama.cpp's item types, and one item per token."""
    for key, (want, name) in _TOKENIZER_ARRAY_TYPES.items():
        if key in types and types[key] != want:
            raise fail(
                path, f"metadata {key!r} must be an array of {name}, not of type {types[key]}"
            )
    n_tokens = lengths.get("tokenizer.ggml.tokens")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in lengths and lengths[key] != n_tokens:
            raise fail(
                path,
                f"metadata {key!r} has {lengths[key]} items for "
                f"{n_tokens if n_tokens is not None else 'no'} tokens",
            )


def _check_array_length(cur: _Cursor, key: str, count: int) -> None:
    limit = MAX_METADATA_ARRAY if key.startswith("tokenizer.") else MAX_OTHER_METADATA_ARRAY
    if count > limit:
        raise fail(cur.path, f"metadata array {key!r} claims {count} items (limit {limit})")


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype == _GGUF_STRING:
        return cur.string(f"value of {key!r}")
    scalar = _GGUF_SCALARS.get(vtype)
    if scalar is None:
        raise fail(cur.path, f"metadata {key!r} has unknown value type {vtype}")
    return cur.scalar(scalar[0], scalar[1], f"value of {key!r}")


def _skip_array(cur: _Cursor, key: str, depth: int) -> int:
    if depth >= MAX_NESTING:
        raise fail(cur.path, f"metadata {key!r} nests arrays deeper than {MAX_NESTING}")
    itype = cur.u32(f"item type of {key!r}")
    count = cur.u64(f"length of {key!r}")
    _check_array_length(cur, key, count)
    if itype in _GGUF_SCALARS:
        width = _GGUF_SCALARS[itype][1]
        cur.need(count * width, f"{count} items of {key!r}")
        cur.pos += count * width
    elif itype == _GGUF_STRING:
        _read_strings(cur, key, count, keep=False)
    elif itype == _GGUF_ARRAY:
        if count > cur.room() // 12:
            raise fail(cur.path, f"metadata array {key!r} claims {count} nested arrays")
        for _ in range(count):
            _skip_array(cur, key, depth + 1)
    else:
        raise fail(cur.path, f"metadata array {key!r} has unknown item type {itype}")
    return count


_NUMPY_TYPES = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8"}
_NUMPY_TYPES |= {11: "i8", 12: "f8"}


def _read_array(cur: _Cursor, key: str) -> tuple[int, Any]:
    """(length, values) of a flat array; nested arrays are skipped (values None)."""
    start = cur.pos
    itype = cur.u32(f"item type of {key!r}")
    count = cur.u64(f"length of {key!r}")
    _check_array_length(cur, key, count)
    if itype in _NUMPY_TYPES:
        width = _GGUF_SCALARS[itype][1]
        cur.need(count * width, f"{count} items of {key!r}")
        dtype = np.dtype(cur.order + _NUMPY_TYPES[itype])
        out = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos).copy()
        cur.pos += count * width
        return count, out.astype(np.dtype(_NUMPY_TYPES[itype]), copy=False)
    if itype == _GGUF_STRING:
        return count, _read_strings(cur, key, count)
    cur.pos = start
    return _skip_array(cur, key, 0), None


_CHUNK = 1 << 20


def _read_strings(cur: _Cursor, key: str, count: int, *, keep: bool = True) -> list[str]:
    """Walk ``count`` length-prefixed strings (decoded when ``keep``), every length checked.

    The strings are stepped over by the core (`rlx_lm._core.gguf_strings`, ~50x faster
    than a Python loop over length prefixes), a chunk of the mapped bytes at a time; a
    string longer than a chunk gets a chunk of its own. Lengths that run past the file
    end the walk with the header's truncation error.
    """
    if count > cur.room() // 8:
        raise fail(
            cur.path,
            f"metadata array {key!r} claims {count} strings, but the file has room for at most "
            f"{cur.room() // 8}",
        )
    from rlx_lm._core import gguf_strings

    buf, size, big = cur.buf, cur.size, cur.order == ">"
    out: list[str] = []
    done, base, want = 0, cur.pos, _CHUNK
    try:
        while done < count:
            chunk = bytes(buf[base : base + want])
            parsed, used, texts, bad = gguf_strings(chunk, count - done, big, keep)
            if bad is not None:
                raise fail(cur.path, f"item {done + bad} of {key!r} is not valid UTF-8")
            out += texts
            done, base, want = done + parsed, base + used, _CHUNK
            if done < count and parsed == 0:  # the next string is not whole in the chunk
                if base + 8 > size:
                    cur.pos = base
                    cur.need(8, f"length of item {done} of {key!r}")
                (n,) = struct.unpack_from(cur.order + "Q", buf, base)
                if n > size - (base + 8):
                    cur.pos = base + 8
                    cur.need(n, f"item {done} of {key!r}")
                want = 8 + n
    finally:
        cur.pos = base
    return out


#: GGML tensor types as gguf-py 0.19 lists them: id -> (name, values a block, bytes a
#: block). Our own table, so that reading a header does not import gguf-py (~80 ms);
#: an id missing here is looked up in gguf-py, which may know newer ones (and a test
#: checks the two agree on every id both know).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


def ggml_type(raw: int) -> tuple[str, int, int] | None:
    """(name, values a block, bytes a block) of GGML type id ``raw``, or None."""
    known = GGML_TYPES.get(raw)
    if known is not None:
        return known
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qt = GGMLQuantizationType(raw)
        block, size = GGML_QUANT_SIZES[qt]
    except (ValueError, KeyError):
        return None
    return qt.name, block, size


def _tensor_info(cur: _Cursor, index: int) -> GgufTensorInfo:
    name = cur.string(f"name of tensor #{index}")
    n_dims = cur.u32(f"dimension count of {name!r}")
    if n_dims > GGML_MAX_DIMS:
        raise fail(cur.path, f"tensor {name!r} claims {n_dims} dimensions (max {GGML_MAX_DIMS})")
    shape = tuple(cur.u64(f"dimension {d} of {name!r}") for d in range(n_dims))
    raw_type = cur.u32(f"type of {name!r}")
    offset = cur.u64(f"data offset of {name!r}")
    known = ggml_type(raw_type)
    if known is None:
        raise fail(cur.path, f"tensor {name!r} has unknown GGML type {raw_type}")
    _, block, type_size = known
    n_elements = math.prod(shape)
    if n_elements % block:
        raise fail(
            cur.path,
            f"tensor {name!r} has {n_elements} elements, not a multiple of its block size {block}",
        )
    n_bytes = n_elements // block * type_size
    if n_bytes > cur.size:
        raise fail(
            cur.path,
            f"tensor {name!r} claims shape {list(shape)} ({n_bytes} bytes), more than the "
            f"whole file ({cur.size} bytes)",
        )
    return GgufTensorInfo(name, raw_type, shape, offset, n_bytes)


# -- safetensors -------------------------------------------------------------------


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors header checked against the file: tensors name -> (dtype, shape)."""

    tensors: dict[str, tuple[str, tuple[int, ...]]]
    metadata: dict[str, str]
    header_len: int
    file_size: int
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each tensor's ``data_offsets`` (begin, end), relative to the data section."""

    @property
    def data_offset(self) -> int:
        """Where the data section starts in the file."""
        return 8 + self.header_len


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Read and check a safetensors header, never reading more than its claimed length."""
    with open(path, "rb") as f:
        size = _size(f)
        return parse_safetensors_header(f, size, path)


def safetensors_header_len(prefix: bytes, size: int) -> int | None:
    """The header length if ``prefix`` (the first 9+ bytes) plausibly starts a safetensors file."""
    if len(prefix) < 9 or size < 10:
        return None
    (n,) = struct.unpack_from("<Q", prefix)
    if 2 <= n <= min(size - 8, SAFETENSORS_MAX_HEADER) and prefix[8:9] == b"{":
        return int(n)
    return None


def parse_safetensors_header(f: IO[bytes], size: int, path: Path) -> SafetensorsHeader:
    """Check the header of a safetensors stream of ``size`` bytes positioned at its start."""
    if size < 8:
        raise fail(path, f"truncated safetensors file: {size} bytes, the length prefix needs 8")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > SAFETENSORS_MAX_HEADER:
        raise fail(
            path,
            f"safetensors header length {n} exceeds the format's limit of "
            f"{SAFETENSORS_MAX_HEADER} bytes",
        )
    if n > size - 8:
        raise fail(
            path, f"truncated safetensors file: header length {n}, but only {size - 8} bytes follow"
        )
    raw = f.read(n)
    if len(raw) != n:
        raise fail(path, f"truncated safetensors header: read {len(raw)} of {n} bytes")
    header = load_json(raw, path, "safetensors header")
    if not isinstance(header, dict):
        raise fail(path, "safetensors header must be a JSON object")
    data_size = size - 8 - n
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise fail(path, "safetensors __metadata__ must be an object of strings")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    offsets: dict[str, tuple[int, int]] = {}
    for name, entry in header.items():
        tensors[name] = _safetensors_entry(path, name, entry, data_size)
        begin, end = entry["data_offsets"]
        offsets[name] = (begin, end)
    if not all(isinstance(v, str) for v in meta.values()):
        raise fail(path, "safetensors __metadata__ must be an object of strings")
    return SafetensorsHeader(
        tensors=tensors,
        metadata=dict(meta),
        header_len=n,
        file_size=size,
        offsets=offsets,
    )


def _safetensors_entry(
    path: Path, name: str, entry: object, data_size: int
) -> tuple[str, tuple[int, ...]]:
    if not isinstance(entry, dict):
        raise fail(path, f"safetensors entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise fail(path, f"tensor {name!r} has no dtype")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise fail(path, f"tensor {name!r} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise fail(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if end > data_size:
        raise fail(
            path,
            f"truncated: tensor {name!r} ends at data byte {end}, but the data section has "
            f"{data_size} bytes",
        )
    bits = SAFETENSORS_DTYPE_BITS.get(dtype)
    if bits is not None:
        want = -(-math.prod(shape) * bits // 8)
        if end - begin != want:
            raise fail(
                path,
                f"tensor {name!r} ({dtype}, shape {shape}) should take {want} bytes, its "
                f"data_offsets span {end - begin}",
            )
    return dtype, tuple(shape)


SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64_000_000
"""Largest shard index read (real ones are a few hundred KB)."""


def read_safetensors_index(directory: Path) -> tuple[Path, ...] | None:
    """The shard files a directory's ``model.safetensors.index.json`` names, or None.

    Every name must be a plain file name in ``directory``: an index naming
    ``../x``, an absolute path or a subdirectory is refused, so loading never
    follows it out of the model directory.
    """
    index = directory / SAFETENSORS_INDEX
    if not index.is_file():
        return None
    with open(index, "rb") as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    if len(raw) > MAX_INDEX_BYTES:
        raise fail(index, f"safetensors index is larger than {MAX_INDEX_BYTES} bytes")
    doc = load_json(raw, index, "safetensors index")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise fail(index, "safetensors index has no weight_map of file names")
    names = sorted(set(weight_map.values()))
    for name in names:
        if (
            not name
            or Path(name).name != name
            or name in (".", "..")
            or "/" in name
            or "\\" in name
            or "\0" in name
        ):
            raise fail(
                index, f"safetensors index names {name!r}, a file outside the model directory"
            )
    return tuple(directory / n for n in names)
