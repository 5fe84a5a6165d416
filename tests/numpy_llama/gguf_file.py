"""The numpy reference's GGUF access, through ``gguf.GGUFReader``: header fields and config.

A reader independent of the library's own (`rlx_lm._headers`, the one bounds-checked GGUF
reader everything in `rlx_lm` uses), so the reference forward does not share its bugs. It
trusts its input: use it on files the tests wrote, never on hostile ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rlx_lm.errors import WeightFormatError
from rlx_lm.runners.llama_config import LlamaConfig, RopeScaling

__all__ = ["GgufFile", "open_gguf"]


class GgufFile:
    """An opened GGUF file: typed access to header fields and tensors (memory-mapped)."""

    def __init__(self, path: Path, reader: Any) -> None:
        self.path = path
        self.reader = reader
        self.tensors = {t.name: t for t in reader.tensors}

    def field(self, key: str) -> Any:
        """The value of header field ``key`` (scalar, string or list), or None if absent."""
        f = self.reader.get_field(key)
        if f is None:
            return None
        try:
            return f.contents() if hasattr(f, "contents") else _field_value(f)
        except Exception as exc:  # the gguf package raises assorted errors on corrupt fields
            raise WeightFormatError(f"{self.path}: unreadable header field {key}: {exc}") from None

    def config(self) -> LlamaConfig:
        """The model's hyper-parameters from the header (vocab from the embedding if absent)."""
        emb = self.tensors.get("token_embd.weight")
        vocab_fallback = int(emb.shape[1]) if emb is not None and len(emb.shape) == 2 else 0
        if not vocab_fallback:
            tokens = self.field("tokenizer.ggml.tokens")
            vocab_fallback = len(tokens) if tokens else 0
        cfg = LlamaConfig.from_gguf_fields(
            self.field, where=str(self.path), vocab_fallback=vocab_fallback
        )
        if "output.weight" not in self.tensors:
            cfg = _replace(cfg, tie_word_embeddings=True)
        freqs = self.tensors.get("rope_freqs.weight")
        if freqs is not None:
            factors = tuple(float(x) for x in self._dequant(freqs).ravel())
            cfg = _replace(cfg, rope_scaling=RopeScaling("factors", freq_factors=factors))
        return cfg

    def _dequant(self, t: Any) -> npt.NDArray[np.float32]:
        from gguf.quants import dequantize

        shape = tuple(int(d) for d in reversed(t.shape))
        try:
            out = dequantize(np.asarray(t.data), t.tensor_type)
        except Exception as exc:
            raise WeightFormatError(f"{self.path}: cannot decode tensor {t.name}: {exc}") from None
        return np.asarray(out, dtype=np.float32).reshape(shape)


def open_gguf(path: str | Path) -> GgufFile:
    """Open ``path`` as GGUF, turning the reader's failures into WeightFormatError."""
    from gguf import GGUFReader

    p = Path(path)
    if not p.is_file():
        raise WeightFormatError(f"{p}: no such file")
    try:
        reader = GGUFReader(p)
    except Exception as exc:
        raise WeightFormatError(f"{p}: not a readable GGUF file: {exc}") from None
    return GgufFile(p, reader)


def _field_value(f: Any) -> Any:
    """A header field's value from its raw parts (gguf releases before ``contents()``)."""
    from gguf import GGUFValueType

    def one(part: Any, vtype: Any) -> Any:
        return bytes(part).decode("utf-8") if vtype == GGUFValueType.STRING else part.tolist()[0]

    if f.types[0] == GGUFValueType.ARRAY:
        return [one(f.parts[i], f.types[-1]) for i in f.data]
    return one(f.parts[f.data[0]], f.types[0])


def _f32(a: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return np.asarray(a, dtype=np.float32)


def _replace(cfg: LlamaConfig, **kw: Any) -> LlamaConfig:
    return replace(cfg, **kw)
