"""Writers for tiny weight files, valid and hostile, shared by the weight and builder tests."""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file


def write_gguf(
    path: Path,
    arch: str = "llama",
    tensors: Mapping[str, np.ndarray] | None = None,
    vocab: list[str] | None = None,
    extra: Mapping[str, int] | None = None,
    alignment: int | None = None,
) -> Path:
    """A small valid GGUF with float tensors, one Q8_0 tensor and an embedded tokenizer."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab or ["<s>", "a", "b", "c"])
    if tensors is None:
        rng = np.random.default_rng(0)
        tensors = {
            "token_embd.weight": rng.standard_normal((4, 8)).astype(np.float32),
            "output_norm.weight": np.ones(8, np.float16),
        }
        q8 = gguf.quants.quantize(
            rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
        )
        writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_safetensors(path: Path, seed: int = 0) -> Path:
    """A small valid safetensors file with a float32 and a float16 tensor."""
    rng = np.random.default_rng(seed)
    save_file(
        {
            f"layer{seed}.weight": rng.standard_normal((3, 4)).astype(np.float32),
            f"layer{seed}.bias": np.zeros(4, np.float16),
        },
        str(path),
    )
    return path


def gguf_bytes(
    n_tensors: int,
    kvs: Sequence[tuple[str, int, bytes]] = (),
    tail: bytes = b"",
    version: int = 3,
) -> bytes:
    """A raw GGUF header claiming ``n_tensors`` tensors with the given raw key/values."""
    out = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs))
    for key, vtype, value in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + value
    return out + tail


def safetensors_bytes(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    """A raw safetensors file: length prefix, JSON header, data."""
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def write_zip(path: Path, members: Mapping[str, bytes], stored: bool = True) -> Path:
    """A zip archive (stored, as DDUF requires, unless ``stored`` is False)."""
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path
