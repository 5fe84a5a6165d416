"""Read a Llama-family GGUF file: header fields, config, and weights (dequantised or packed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.linear import DenseMatrix, Matrix, PackedMatrix
from rlx_lm.runners.llama_config import LlamaConfig, RopeScaling
from rlx_lm.runners.llama_weights import LlamaWeights, unpermute_rope_rows

__all__ = ["SUPPORTED_QUANTS", "GgufFile", "open_gguf"]

#: GGML tensor types this loader dequantises (by name, as ``GGMLQuantizationType`` spells them).
SUPPORTED_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K")

# Architectures whose q/k rows llama.cpp's converter permutes for its NORM-style RoPE.
_PERMUTED_ARCHS = ("llama", "mistral")


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

    def check_quant_types(self) -> None:
        """Raise UnsupportedError naming the first tensor whose type this loader cannot read."""
        for t in self.tensors.values():
            if t.tensor_type.name not in SUPPORTED_QUANTS:
                raise UnsupportedError(
                    f"{self.path}: tensor {t.name} uses quant type {t.tensor_type.name}, "
                    f"which is not supported (supported: {', '.join(SUPPORTED_QUANTS)})"
                )

    def _dequant(self, t: Any) -> npt.NDArray[np.float32]:
        from gguf.quants import dequantize

        shape = tuple(int(d) for d in reversed(t.shape))
        try:
            out = dequantize(np.asarray(t.data), t.tensor_type)
        except Exception as exc:
            raise WeightFormatError(f"{self.path}: cannot decode tensor {t.name}: {exc}") from None
        return np.asarray(out, dtype=np.float32).reshape(shape)

    def weights(
        self,
        cfg: LlamaConfig,
        *,
        packed: bool,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> LlamaWeights:
        """Load every tensor; ``packed`` keeps quantised matrices as blocks, dequantised per use."""
        self.check_quant_types()
        permute = cfg.arch in _PERMUTED_ARCHS

        def get(name: str, kind: str) -> Matrix | npt.NDArray[np.float32] | None:
            t = self.tensors.get(name if name.endswith(".bias") else name + ".weight")
            if t is None:
                return None
            heads = 0
            if permute and name.endswith(("attn_q", "attn_k", "attn_q.bias", "attn_k.bias")):
                heads = cfg.n_heads if ".attn_q" in name else cfg.n_kv_heads
            if kind == "vector":
                vec = self._dequant(t)
                return _f32(unpermute_rope_rows(vec, heads)) if heads else vec
            if len(t.shape) != 2:
                raise WeightFormatError(f"{self.path}: tensor {t.name} is not a matrix")
            shape = (int(t.shape[1]), int(t.shape[0]))
            if packed and t.tensor_type.name != "F32":
                raw = np.asarray(t.data)
                if raw.dtype != np.uint8:
                    raw = raw.view(np.uint8).reshape(shape[0], -1)
                if heads:
                    raw = unpermute_rope_rows(raw, heads)
                return PackedMatrix(raw, t.tensor_type, shape)
            w = self._dequant(t)
            return DenseMatrix(_f32(unpermute_rope_rows(w, heads)) if heads else w)

        return LlamaWeights.gather(cfg, get, where=str(self.path), on_progress=on_progress)


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
