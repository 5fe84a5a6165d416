"""Hyper-parameters of a Llama-family model, from a GGUF header or a Hugging Face config."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rlx_lm.errors import UnsupportedError, WeightFormatError

__all__ = ["LLAMA_ARCHITECTURES", "LlamaConfig", "RopeScaling"]

#: Architectures this runner implements (GGUF ``general.architecture`` / HF ``model_type``).
LLAMA_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

_HF_ARCH_ALIASES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


#: The widest attention head a model may declare (real models: 64-256).
MAX_HEAD_DIM = 1 << 16


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``llama3`` smoothing, ``linear`` positions, or explicit factors."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    freq_factors: tuple[float, ...] = ()


@dataclass(frozen=True)
class LlamaConfig:
    """Geometry and numerics of one Llama/Mistral/Qwen2/Qwen3 model."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = field(default=None)
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in LLAMA_ARCHITECTURES:
            raise UnsupportedError(
                f"architecture {self.arch!r} is not a Llama-family model "
                f"(supported: {', '.join(LLAMA_ARCHITECTURES)})"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads"):
            if getattr(self, name) <= 0:
                raise WeightFormatError(
                    f"config field {name} must be positive, got {getattr(self, name)}"
                )
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise WeightFormatError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise WeightFormatError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise WeightFormatError(f"head_dim must be a positive even number, got {self.head_dim}")
        if self.head_dim > MAX_HEAD_DIM:
            # Checked before anything is sized by it (RoPE's tables are head_dim / 2 long); the
            # widest head of a real model is 256, and no weight could match a larger one here.
            raise WeightFormatError(
                f"head_dim {self.head_dim} is over the supported {MAX_HEAD_DIM}"
            )
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise WeightFormatError(
                f"rope_theta must be positive and finite, got {self.rope_theta}"
            )
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0):
            raise WeightFormatError(
                f"rms_norm_eps must be finite and >= 0, got {self.rms_norm_eps}"
            )
        if self.max_position <= 0:
            raise WeightFormatError(f"max_position must be positive, got {self.max_position}")
        rs = self.rope_scaling
        if rs is not None and not (math.isfinite(rs.factor) and rs.factor > 0):
            raise WeightFormatError(f"rope scaling factor must be positive, got {rs.factor}")

    @property
    def geometry(self) -> tuple[int, ...]:
        """What a KV snapshot depends on: (layers, kv heads, head dim, heads, hidden, vocab)."""
        return (
            self.n_layers,
            self.n_kv_heads,
            self.head_dim,
            self.n_heads,
            self.hidden_size,
            self.vocab_size,
        )

    def inv_freq(self) -> npt.NDArray[np.float64]:
        """Per-pair RoPE inverse frequencies ``[head_dim / 2]``, with any scaling applied."""
        hd = self.head_dim
        inv = 1.0 / (self.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        rs = self.rope_scaling
        if rs is None or rs.kind == "linear":
            return inv
        if rs.kind == "factors":
            factors = np.asarray(rs.freq_factors, dtype=np.float64)
            if factors.shape != inv.shape:
                raise WeightFormatError(
                    f"rope_freqs has {factors.size} factors, expected {inv.size}"
                )
            return inv / factors
        # llama3: long wavelengths divided by `factor`, short ones kept, the middle band blended.
        low_wavelen = rs.original_max_position / rs.low_freq_factor
        high_wavelen = rs.original_max_position / rs.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
        smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor
        )
        blended = (1 - smooth) * scaled / rs.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled)

    def position_scale(self) -> float:
        """Divisor applied to positions before RoPE (``linear`` scaling), else 1."""
        rs = self.rope_scaling
        return rs.factor if rs is not None and rs.kind == "linear" else 1.0

    # ------------------------------------------------------------------ parsing

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], *, where: str = "config.json") -> LlamaConfig:
        """Read a Hugging Face ``config.json`` mapping (MLX directories use the same keys)."""
        arch = str(cfg.get("model_type", "")).lower()
        if not arch:
            archs = cfg.get("architectures") or []
            arch = _HF_ARCH_ALIASES.get(archs[0], "") if archs else ""
        if arch not in LLAMA_ARCHITECTURES:
            raise UnsupportedError(
                f"{where}: architecture {arch or '<missing model_type>'!r} is not supported "
                f"(supported: {', '.join(LLAMA_ARCHITECTURES)})"
            )
        if "quantization" in cfg or "quantization_config" in cfg:
            raise UnsupportedError(
                f"{where}: quantized safetensors/MLX weights are not supported; "
                "use an unquantized checkpoint or a GGUF file"
            )
        need: Callable[[str], int] = lambda key: _require_int(cfg, key, where)  # noqa: E731
        hidden = need("hidden_size")
        n_heads = need("num_attention_heads")
        head_dim = cfg.get("head_dim") or (hidden // n_heads if n_heads > 0 else 0)
        return cls(
            arch=arch,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            n_layers=need("num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            max_position=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            qk_norm=arch == "qwen3",
            rope_scaling=_hf_rope_scaling(cfg.get("rope_scaling"), where),
            sliding_window=_hf_sliding_window(cfg, arch, where),
        )

    @classmethod
    def from_gguf_fields(
        cls, get: Callable[[str], Any], *, where: str, vocab_fallback: int
    ) -> LlamaConfig:
        """Read the ``{arch}.*`` keys of a GGUF header through ``get(key) -> value | None``."""
        arch = str(get("general.architecture") or "").lower()
        if arch not in LLAMA_ARCHITECTURES:
            raise UnsupportedError(
                f"{where}: architecture {arch or '<missing>'!r} is not supported "
                f"(supported: {', '.join(LLAMA_ARCHITECTURES)})"
            )

        def need(key: str) -> int:
            value = get(f"{arch}.{key}")
            if value is None:
                raise WeightFormatError(f"{where}: GGUF header lacks {arch}.{key}")
            return _gguf_int(value, f"{arch}.{key}", where)

        def opt_int(key: str, default: int) -> int:
            value = get(f"{arch}.{key}")
            return default if value is None else _gguf_int(value, f"{arch}.{key}", where)

        def opt_float(key: str, default: float) -> float:
            value = get(f"{arch}.{key}")
            return default if value is None else _gguf_float(value, f"{arch}.{key}", where)

        hidden = need("embedding_length")
        n_heads = need("attention.head_count")
        n_kv = opt_int("attention.head_count_kv", n_heads)
        head_dim = opt_int("attention.key_length", 0) or (hidden // n_heads if n_heads > 0 else 0)
        v_dim = opt_int("attention.value_length", head_dim)
        if v_dim != head_dim:
            raise UnsupportedError(
                f"{where}: {arch}.attention.value_length={v_dim} differs from the key length "
                f"{head_dim}; the engine needs keys and values of one head size"
            )
        vocab = opt_int("vocab_size", 0) or vocab_fallback
        scaling = None
        if str(get(f"{arch}.rope.scaling.type") or "none") == "linear":
            scaling = RopeScaling("linear", factor=opt_float("rope.scaling.factor", 1.0) or 1.0)
        try:
            return cls(
                arch=arch,
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=need("feed_forward_length"),
                n_layers=need("block_count"),
                n_heads=n_heads,
                n_kv_heads=n_kv,
                head_dim=head_dim,
                rms_norm_eps=opt_float("attention.layer_norm_rms_epsilon", 1e-5),
                rope_theta=opt_float("rope.freq_base", 10000.0),
                max_position=opt_int("context_length", 0) or 4096,
                attention_bias=arch == "qwen2",
                qk_norm=arch == "qwen3",
                rope_scaling=scaling,
            )
        except WeightFormatError as exc:
            raise WeightFormatError(f"{where}: {exc}") from None


def _gguf_int(value: Any, key: str, where: str) -> int:
    """A GGUF integer field; a float, string, bool or array there is a malformed header
    (llama.cpp refuses a key of the wrong type too)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise WeightFormatError(
            f"{where}: GGUF field {key} must be an integer, got {type(value).__name__} {value!r}"
        )
    return int(value)


def _gguf_float(value: Any, key: str, where: str) -> float:
    """A GGUF number field: an integer or a float, finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise WeightFormatError(
            f"{where}: GGUF field {key} must be a number, got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(float(value)):
        raise WeightFormatError(f"{where}: GGUF field {key} must be finite, got {value!r}")
    return float(value)


def _require_int(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if value is None:
        raise WeightFormatError(f"{where}: missing {key!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise WeightFormatError(f"{where}: {key!r} is not an integer: {value!r}") from None


def _hf_sliding_window(cfg: Mapping[str, Any], arch: str, where: str) -> int | None:
    """Mistral's attention window (each query sees its last ``W`` positions), if any."""
    window = cfg.get("sliding_window")
    if arch == "mistral":
        return int(window) if window else None
    if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        raise UnsupportedError(
            f"{where}: use_sliding_window (per-layer windows) is not supported for {arch}"
        )
    return None


def _hf_rope_scaling(rs: Any, where: str) -> RopeScaling | None:
    if not rs:
        return None
    kind = str(rs.get("rope_type") or rs.get("type") or "")
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(rs["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=float(rs["factor"]),
            low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
            original_max_position=int(rs.get("original_max_position_embeddings", 8192)),
        )
    raise UnsupportedError(f"{where}: rope_scaling type {kind!r} is not supported")
