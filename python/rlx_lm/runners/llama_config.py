"""Hyper-parameters of a Llama-family model, from a GGUF header or a Hugging Face config.

The family is the Llama block and its variants: Mistral's window, Qwen2's biases, Qwen3's
q/k norms, Phi-3's fused q/k/v and gate/up matrices (split as stored, no copy), and Gemma's
(GeGLU, scaled embeddings, its own score scale; Gemma 2 and 3: norms after attention and MLP,
windowed layers, Gemma 2's soft-capping, Gemma 3's local RoPE).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from rlx_lm.errors import InvalidOptionError, UnsupportedError, WeightFormatError

__all__ = [
    "GEMMA_ARCHITECTURES",
    "HF_MODEL_TYPES",
    "LLAMA_ARCHITECTURES",
    "LlamaConfig",
    "RopeScaling",
    "longrope_scaling",
]

#: Architectures this runner implements (GGUF ``general.architecture`` / HF ``model_type``).
LLAMA_ARCHITECTURES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
    "granite",
    "smollm3",
    "qwen2moe",
    "qwen3moe",
    "granitemoe",
    "olmo2",
    "olmoe",
    "exaone4",
    "ernie4_5",
    "gpt-oss",
)

#: The Gemma generations (GeGLU, embeddings times sqrt(hidden), norms stored as ``w`` in GGUF
#: and as ``w - 1`` in Hugging Face checkpoints).
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")

_HF_ARCH_ALIASES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "GraniteForCausalLM": "granite",
    "SmolLM3ForCausalLM": "smollm3",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "MixtralForCausalLM": "mistral",
    "GraniteMoeForCausalLM": "granitemoe",
    "Olmo2ForCausalLM": "olmo2",
    "OlmoeForCausalLM": "olmoe",
    "Exaone4ForCausalLM": "exaone4",
    "Ernie4_5ForCausalLM": "ernie4_5",
    "GptOssForCausalLM": "gpt-oss",
}
# Hugging Face ``model_type`` spellings of our names (Mixtral is Mistral with experts, as
# llama.cpp's converter writes it: architecture llama with expert tensors).
_HF_TYPE_ALIASES = {
    "gemma3_text": "gemma3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "mixtral": "mistral",
    "gpt_oss": "gpt-oss",
}
#: Hugging Face ``model_type`` names the family answers to beyond its own.
HF_MODEL_TYPES = tuple(_HF_TYPE_ALIASES)

# llama.cpp's defaults where a Gemma GGUF leaves a key out (llama-model.cpp).
_GEMMA2_WINDOW = 4096
_GEMMA2_ATTN_SOFTCAP = 50.0
_GEMMA2_FINAL_SOFTCAP = 30.0
_GEMMA3_LOCAL_THETA = 10000.0
# Layers windowed in a pattern of n: layer i when i % n < n - 1 (Gemma 2: 2, Gemma 3: 6).
_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}
# SmolLM3: every fourth layer has no RoPE (llama.cpp's fixed n_no_rope_layer_step; Hugging
# Face's default no_rope_layer_interval).
_SMOLLM3_NOPE_INTERVAL = 4
# Block counts llama.cpp takes for the 27B models, whose score scale is 1/sqrt(hidden/heads).
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


# Architectures whose RoPE covers the whole head: llama.cpp 0.3.36 refuses another n_rot for
# llama (so mistral's files) at load and asserts on it in qwen2/qwen3's graphs; it runs a
# partial one for gemma 1-3 and phi3. Every other architecture (a new one too, until shown
# otherwise) is held to the whole head.
_FULL_ROPE_ARCHS = tuple(a for a in LLAMA_ARCHITECTURES if a not in ("phi3", *GEMMA_ARCHITECTURES))
# Mixtures of experts: the architectures that are nothing else, and those whose GGUF may add
# experts to a dense design (llama.cpp's converter writes Mixtral as llama with experts).
_MOE_ARCHS = ("qwen2moe", "qwen3moe", "granitemoe", "olmoe", "gpt-oss")
_MAY_HAVE_EXPERTS = ("llama", "mistral", *_MOE_ARCHS)
# Whether llama.cpp renormalises the picked experts' weights (its build_moe_ffn's norm_w):
# Mixtral, Qwen3-MoE and Granite MoE do, Qwen2-MoE does not.
_NORM_EXPERT_WEIGHTS = {
    "llama": True,
    "mistral": True,
    "qwen2moe": False,
    "qwen3moe": True,
    "granitemoe": True,
    "olmoe": False,
    "gpt-oss": False,  # its weights are the softmax over the picked logits already
}
_GRANITE_ARCHS = ("granite", "granitemoe")
# llama.cpp's expert gating functions (LLAMA_EXPERT_GATING_FUNC_TYPE_*): softmax over all
# experts, and softmax over the picked ones' logits (gpt-oss); 2 is DeepSeek V3's sigmoid.
_GATING_FUNC = {"softmax": 1, "softmax_picked": 3}
#: The most experts a block may have (llama.cpp's LLAMA_MAX_EXPERTS).
MAX_EXPERTS = 512
_QKV_BIAS_ARCHS = ("qwen2", "qwen2moe", "gpt-oss")
# gpt-oss: every other layer (the even ones) windowed, llama.cpp's pattern of 2; biases on the
# output projection, the router and the experts; a sink logit a head; its clamped gate.
_GPT_OSS_WINDOW_PERIOD = 2
# YaRN's defaults where a GGUF leaves them out (llama.cpp's yarn_beta_fast / yarn_beta_slow).
_YARN_BETA_FAST = 32.0
_YARN_BETA_SLOW = 1.0
_QK_NORM_ARCHS = ("qwen3", "qwen3moe", "gemma3", "olmo2", "olmoe", "exaone4")
# Norms after attention and the MLP only, none before (OLMo 2, EXAONE 4).
_POST_NORM_ONLY_ARCHS = ("olmo2", "exaone4")
# EXAONE 4: llama.cpp windows its 64-block (32B) model only, three layers of four with a
# window of 4096 (the global fourth without RoPE), whatever else the header says.
_EXAONE4_SWA_LAYERS = 64
_EXAONE4_WINDOW = 4096
# q and k normed over the whole projection, not head by head (OLMo 2, OLMoE).
_QK_NORM_FULL_ARCHS = ("olmo2", "olmoe")

#: The widest attention head a model may declare (real models: 64-256).
MAX_HEAD_DIM = 1 << 16


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``llama3`` smoothing, ``linear`` positions, explicit factors
    (``factors``: the frequencies divided by ``freq_factors``), or ``longrope`` before a session
    length picks its set (``freq_factors`` the short set, ``long_factors`` the long one,
    ``factor`` the cos/sin factor; see :meth:`LlamaConfig.for_context`)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    freq_factors: tuple[float, ...] = ()
    long_factors: tuple[float, ...] = ()
    beta_fast: float = _YARN_BETA_FAST
    """YaRN: the pairs turning more than this many times over the original context keep
    their frequency; those turning fewer than ``beta_slow`` times are divided by ``factor``;
    the band between is blended."""
    beta_slow: float = _YARN_BETA_SLOW
    truncate: bool = True
    """YaRN: round the band's ends outwards to whole pairs (llama.cpp always does)."""


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
    window_layers: tuple[bool, ...] = ()
    """Which layers the window applies to, one flag a layer; empty: every layer."""
    rope_local_theta: float | None = None
    """RoPE base of the windowed layers (Gemma 3's local layers: no scaling), else the model's."""
    embed_scale: float = 1.0
    """Factor on the embedding rows (Gemma: ``sqrt(hidden_size)``)."""
    attn_scale: float | None = None
    """Factor on ``q . k`` (Gemma: ``query_pre_attn_scalar ** -0.5``); None: 1/sqrt(head_dim)."""
    attn_softcap: float | None = None
    """Scores become ``c * tanh(s / c)`` (Gemma 2)."""
    final_softcap: float | None = None
    """Logits become ``c * tanh(z / c)`` (Gemma 2)."""
    gelu: bool = False
    """GeGLU (GELU, tanh form) instead of SwiGLU."""
    post_norms: bool = False
    """Norms of the attention and MLP outputs before the residual adds (Gemma 2/3)."""
    rope_mscale: float = 1.0
    """Factor on RoPE's cos and sin, so on the rotated elements of q and k (LongRoPE's
    attention factor, llama.cpp's ``attn_factor``)."""
    residual_scale: float = 1.0
    """Factor on the attention and MLP outputs before each residual add (Granite)."""
    logit_scale: float = 1.0
    """The logits are divided by it (Granite)."""
    nope_layers: tuple[bool, ...] = ()
    """Layers whose q and k are not rotated, one flag a layer (SmolLM3: every fourth); empty:
    RoPE in every layer."""
    rope_dims: int | None = None
    """Elements of each head that RoPE rotates, the first ones (partial RoPE: Phi-4-mini's
    96 of 128); None: the whole head."""
    no_pre_norms: bool = False
    """No norm before attention and the MLP, only after them (OLMo 2, with ``post_norms``)."""
    qk_norm_full: bool = False
    """The q/k norms span the whole projection, not one head (OLMo 2, OLMoE)."""
    n_experts: int = 0
    """Experts of each block's mixture (Mixtral, Qwen2-MoE, Qwen3-MoE); 0: a dense MLP."""
    n_experts_used: int = 0
    """Experts each token runs (the router's top k)."""
    expert_ff: int = 0
    """Width of each expert's MLP."""
    experts_norm: bool = False
    """Whether the picked experts' softmax weights are divided by their sum."""
    shared_expert_ff: int = 0
    """Width of the shared expert every token runs, gated by a sigmoid (Qwen2-MoE); 0: none."""
    expert_gating: str = "softmax"
    """How router logits become the picks' weights: ``"softmax"`` over all experts, or
    ``"softmax_picked"``, the softmax of the picked (top) logits only (gpt-oss)."""
    expert_biases: bool = False
    """Biases on the router and on every expert's gate, up and down (gpt-oss)."""
    o_bias: bool = False
    """A bias on the attention's output projection (gpt-oss)."""
    attn_sinks: bool = False
    """A learned logit a query head that joins its softmax with a zero value (gpt-oss)."""
    oai_glu: bool = False
    """gpt-oss's gate: ``min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)``."""

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
        if self.window_layers and len(self.window_layers) != self.n_layers:
            raise WeightFormatError(
                f"window_layers has {len(self.window_layers)} flags for {self.n_layers} layers"
            )
        if self.window_layers and self.sliding_window is None:
            raise WeightFormatError("window_layers is set but there is no sliding_window")
        if self.nope_layers and len(self.nope_layers) != self.n_layers:
            raise WeightFormatError(
                f"nope_layers has {len(self.nope_layers)} flags for {self.n_layers} layers"
            )
        for name in ("rope_local_theta", "attn_scale", "attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise WeightFormatError(f"{name} must be positive and finite, got {value}")
        if self.rope_dims is not None and not (
            0 < self.rope_dims <= self.head_dim and self.rope_dims % 2 == 0
        ):
            raise WeightFormatError(
                f"rope_dims must be an even number from 2 to head_dim={self.head_dim}, "
                f"got {self.rope_dims}"
            )
        for name in ("rope_mscale", "residual_scale", "logit_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise WeightFormatError(f"{name} must be positive and finite, got {value}")
        if not (math.isfinite(self.embed_scale) and self.embed_scale > 0):
            raise WeightFormatError(
                f"embed_scale must be positive and finite, got {self.embed_scale}"
            )
        if self.no_pre_norms and not self.post_norms:
            raise WeightFormatError("no_pre_norms needs post_norms (a block must norm something)")
        self._check_experts()

    def _check_experts(self) -> None:
        if self.n_experts == 0:
            if self.arch in _MOE_ARCHS:
                raise WeightFormatError(f"{self.arch} needs n_experts (a mixture of experts)")
            if self.n_experts_used or self.expert_ff or self.shared_expert_ff:
                raise WeightFormatError("expert fields are set but n_experts is 0")
            return
        if self.arch not in _MAY_HAVE_EXPERTS:
            raise UnsupportedError(
                f"{self.arch} with a mixture of experts is not supported (experts run for "
                f"{', '.join(_MAY_HAVE_EXPERTS)})"
            )
        if self.expert_gating not in ("softmax", "softmax_picked"):
            raise WeightFormatError(
                f'expert_gating must be "softmax" or "softmax_picked", got {self.expert_gating!r}'
            )
        if not 0 < self.n_experts <= MAX_EXPERTS:
            raise WeightFormatError(f"n_experts must be 1 to {MAX_EXPERTS}, got {self.n_experts}")
        if not 0 < self.n_experts_used <= self.n_experts:
            raise WeightFormatError(
                f"n_experts_used must be 1 to n_experts={self.n_experts}, got {self.n_experts_used}"
            )
        if self.expert_ff <= 0 or self.shared_expert_ff < 0:
            raise WeightFormatError(
                f"expert widths must be positive (expert_ff={self.expert_ff}, "
                f"shared_expert_ff={self.shared_expert_ff})"
            )

    def rotates(self, layer: int) -> bool:
        """Whether ``layer`` applies RoPE to q and k (all but SmolLM3's NoPE layers)."""
        return not (self.nope_layers and self.nope_layers[layer])

    def window_of(self, layer: int) -> int | None:
        """The attention window of ``layer``, if it has one."""
        if self.sliding_window is None:
            return None
        if self.window_layers and not self.window_layers[layer]:
            return None
        return self.sliding_window

    @property
    def rotary_dims(self) -> int:
        """Elements of each head RoPE rotates: ``rope_dims``, else the whole head."""
        return self.head_dim if self.rope_dims is None else self.rope_dims

    def local_inv_freq(self) -> npt.NDArray[np.float64] | None:
        """RoPE inverse frequencies of the windowed layers, if they have their own."""
        if self.rope_local_theta is None:
            return None
        d = self.rotary_dims
        inv: npt.NDArray[np.float64] = 1.0 / (
            self.rope_local_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
        )
        return inv

    def score_scale(self) -> float:
        """The factor on ``q . k`` before the softmax."""
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

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
        """Per-pair RoPE inverse frequencies ``[rotary_dims / 2]``, with any scaling applied.
        A partial RoPE spreads its frequencies over the rotated elements only (the exponent's
        denominator is ``rotary_dims``), as llama.cpp and Hugging Face do."""
        d = self.rotary_dims
        inv = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        rs = self.rope_scaling
        if rs is None or rs.kind == "linear":
            return inv
        if rs.kind == "longrope":
            raise InvalidOptionError(
                "LongRoPE picks its factor set by the session length: use "
                "LlamaConfig.for_context(max_seq) first"
            )
        if rs.kind == "factors":
            factors = np.asarray(rs.freq_factors, dtype=np.float64)
            if factors.shape != inv.shape:
                raise WeightFormatError(
                    f"rope_freqs has {factors.size} factors, expected {inv.size}"
                )
            return inv / factors
        if rs.kind == "yarn":
            return _yarn_inv_freq(inv, d, self.rope_theta, rs)
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

    def for_context(self, context: int | None) -> tuple[LlamaConfig, tuple[int, bool] | None]:
        """This config for sessions of ``context`` tokens (None: the trained context), and
        LongRoPE's choice ``(original context, long set)`` if the model has LongRoPE.

        As llama.cpp picks it: the long factor set when the context is longer than the
        original one, else the short set; cos/sin times the attention factor either way.
        Other models come back unchanged."""
        rs = self.rope_scaling
        if rs is None or rs.kind != "longrope":
            return self, None
        use_long = (context if context is not None else self.max_position) > (
            rs.original_max_position
        )
        chosen = rs.long_factors if use_long else rs.freq_factors
        resolved = replace(
            self,
            rope_scaling=RopeScaling("factors", freq_factors=chosen),
            rope_mscale=self.rope_mscale * rs.factor,
        )
        return resolved, (rs.original_max_position, use_long)

    def position_scale(self) -> float:
        """Divisor applied to positions before RoPE (``linear`` scaling), else 1."""
        rs = self.rope_scaling
        return rs.factor if rs is not None and rs.kind == "linear" else 1.0

    # ------------------------------------------------------------------ parsing

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], *, where: str = "config.json") -> LlamaConfig:
        """Read a Hugging Face ``config.json`` mapping (MLX directories use the same keys)."""
        arch = str(cfg.get("model_type", "")).lower()
        arch = _HF_TYPE_ALIASES.get(arch, arch)
        if not arch:
            archs = cfg.get("architectures") or []
            arch = _HF_ARCH_ALIASES.get(archs[0], "") if archs else ""
        if arch not in LLAMA_ARCHITECTURES:
            raise UnsupportedError(
                f"{where}: architecture {arch or '<missing model_type>'!r} is not supported "
                f"(supported: {', '.join(LLAMA_ARCHITECTURES)})"
            )
        if arch == "gpt-oss":
            raise UnsupportedError(
                f"{where}: gpt-oss runs from GGUF files (llama.cpp's conversion), not from its "
                "Hugging Face checkpoints"
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
        n_layers = need("num_hidden_layers")
        rope_dims = _hf_rope_dims(cfg, arch, int(head_dim), where)
        gemma = _hf_gemma(cfg, arch, n_layers, hidden, where) if arch in GEMMA_ARCHITECTURES else {}
        if arch in _GRANITE_ARCHS:
            gemma = _hf_granite(cfg)
        if arch == "smollm3":
            gemma = {"nope_layers": _hf_nope_layers(cfg, n_layers, where)}
        if arch in _POST_NORM_ONLY_ARCHS:
            gemma = {"post_norms": True, "no_pre_norms": True}
        if arch == "exaone4":
            gemma.update(_hf_exaone4_windows(cfg, n_layers, where))
        window = gemma.pop("sliding_window", None) or _hf_sliding_window(cfg, arch, where)
        gemma.update(_hf_experts(cfg, arch, where))
        if arch == "ernie4_5" and cfg.get("use_bias"):
            # Its attention output would have a bias too, which llama.cpp does not run either.
            raise UnsupportedError(f"{where}: ERNIE 4.5 with use_bias is not supported")
        if cfg.get("clip_qkv") is not None:
            raise UnsupportedError(f"{where}: clip_qkv (q/k/v clamped) is not supported")
        scaling = _hf_rope_scaling(
            cfg.get("rope_scaling"), where, cfg, (rope_dims or int(head_dim)) // 2
        )
        if scaling is not None and scaling.kind == "yarn":
            gemma["rope_mscale"] = _hf_yarn_mscale(cfg["rope_scaling"], scaling.factor, where)
        return cls(
            arch=arch,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            max_position=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch in GEMMA_ARCHITECTURES)),
            attention_bias=bool(cfg.get("attention_bias", arch in _QKV_BIAS_ARCHS)),
            qk_norm=arch in _QK_NORM_ARCHS,
            qk_norm_full=arch in _QK_NORM_FULL_ARCHS,
            rope_scaling=scaling,
            sliding_window=window,
            rope_dims=rope_dims,
            **gemma,
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
        rotated = opt_int("rope.dimension_count", head_dim)
        if rotated != head_dim and arch in _FULL_ROPE_ARCHS:
            # llama.cpp does not run these with it (see _FULL_ROPE_ARCHS).
            raise UnsupportedError(
                f"{where}: {arch}.rope.dimension_count={rotated} rotates part of each "
                f"{head_dim}-wide head (partial RoPE), which {arch} models do not do"
            )
        vocab = opt_int("vocab_size", 0) or vocab_fallback
        scaling = None
        gemma: dict[str, Any] = {}
        scaling_type = str(get(f"{arch}.rope.scaling.type") or "none")
        if scaling_type == "linear":
            scaling = RopeScaling("linear", factor=opt_float("rope.scaling.factor", 1.0) or 1.0)
        elif scaling_type == "yarn":
            scaling, gemma["rope_mscale"] = _gguf_yarn(opt_float, opt_int, where)
        elif scaling_type not in ("none", "", "longrope"):
            # (LongRoPE comes from its factor tensors, read where the file is opened.)
            raise UnsupportedError(
                f"{where}: {arch}.rope.scaling.type={scaling_type!r} is not supported "
                "(none, linear, yarn, longrope)"
            )
        n_layers = need("block_count")
        if arch in GEMMA_ARCHITECTURES:
            gemma = {"embed_scale": math.sqrt(hidden), "gelu": True}
            scale = 1.0 / math.sqrt(head_dim)
            if _GEMMA_27B_LAYERS.get(arch) == n_layers:
                scale = 1.0 / math.sqrt(hidden // n_heads)
            gemma["attn_scale"] = scale
        if arch in ("gemma2", "gemma3"):
            gemma["post_norms"] = True
            window = opt_int("attention.sliding_window", _GEMMA2_WINDOW if arch == "gemma2" else 0)
            if window <= 0:
                raise WeightFormatError(
                    f"{where}: GGUF header lacks {arch}.attention.sliding_window"
                )
            gemma["sliding_window"] = window
            gemma["window_layers"] = _window_flags(
                get(f"{arch}.attention.sliding_window_pattern"), arch, n_layers, where
            )
        if arch == "gemma2":
            gemma["attn_softcap"] = opt_float("attn_logit_softcapping", _GEMMA2_ATTN_SOFTCAP)
            gemma["final_softcap"] = opt_float("final_logit_softcapping", _GEMMA2_FINAL_SOFTCAP)
        if arch == "gemma3":
            gemma["rope_local_theta"] = opt_float("rope.freq_base_swa", _GEMMA3_LOCAL_THETA)
        if arch in _GRANITE_ARCHS:
            # llama.cpp's keys; 0 or absent means "not scaled" there (its attention scale then
            # 1/sqrt(head_dim)).
            for key, name in (
                ("embedding_scale", "embed_scale"),
                ("residual_scale", "residual_scale"),
                ("attention.scale", "attn_scale"),
                ("logit_scale", "logit_scale"),
            ):
                value = opt_float(key, 0.0)
                if value != 0.0:
                    gemma[name] = value
        if arch == "smollm3":
            gemma["nope_layers"] = _interval_nope(_SMOLLM3_NOPE_INTERVAL, n_layers)
        if arch in _POST_NORM_ONLY_ARCHS:
            gemma.update(post_norms=True, no_pre_norms=True)
        if arch == "exaone4" and n_layers == _EXAONE4_SWA_LAYERS:
            gemma["sliding_window"] = opt_int("attention.sliding_window", _EXAONE4_WINDOW)
            gemma["window_layers"] = _pattern_flags(4, n_layers)
            gemma["nope_layers"] = tuple(not w for w in gemma["window_layers"])
        if arch == "gpt-oss":
            window = opt_int("attention.sliding_window", 0)
            if window <= 0:
                raise WeightFormatError(
                    f"{where}: GGUF header lacks {arch}.attention.sliding_window"
                )
            gemma.update(
                sliding_window=window,
                window_layers=_pattern_flags(_GPT_OSS_WINDOW_PERIOD, n_layers),
                o_bias=True,
                attn_sinks=True,
                oai_glu=True,
                expert_gating="softmax_picked",
                expert_biases=True,
            )
        if get(f"{arch}.attention.clamp_kqv") is not None:
            raise UnsupportedError(f"{where}: {arch}.attention.clamp_kqv is not supported")
        n_experts = opt_int("expert_count", 0)
        if n_experts:
            if arch not in _MAY_HAVE_EXPERTS:
                raise UnsupportedError(
                    f"{where}: {arch}.expert_count={n_experts}: a {arch} mixture of experts is "
                    f"not supported (experts run for {', '.join(_MAY_HAVE_EXPERTS)})"
                )
            # llama.cpp's keys: Mixtral's experts are feed_forward_length wide, the Qwen MoEs
            # give expert_feed_forward_length (and Qwen2-MoE its shared expert's width).
            dense_ff = opt_int("feed_forward_length", 0)
            gemma["n_experts"] = n_experts
            gemma["n_experts_used"] = need("expert_used_count")
            gemma["expert_ff"] = opt_int("expert_feed_forward_length", 0) or dense_ff
            gemma["experts_norm"] = _NORM_EXPERT_WEIGHTS[arch]
            # llama.cpp's routing keys, for architectures that read them (DeepSeek's, ...):
            # what ours route by is fixed, so a header that says otherwise is refused.
            gating = opt_int("expert_gating_func", 0)
            fixed = _GATING_FUNC["softmax_picked" if arch == "gpt-oss" else "softmax"]
            if gating not in (0, fixed):
                raise UnsupportedError(
                    f"{where}: {arch}.expert_gating_func={gating} is not supported ({arch} "
                    f"routes by llama.cpp's gating function {fixed})"
                )
            if opt_float("expert_weights_scale", 1.0) not in (0.0, 1.0):
                raise UnsupportedError(f"{where}: {arch}.expert_weights_scale is not supported")
            if arch == "qwen2moe":
                gemma["shared_expert_ff"] = opt_int("expert_shared_feed_forward_length", 0) or (
                    dense_ff
                )
            elif opt_int("expert_shared_feed_forward_length", 0):
                # Granite MoE's shared expert is added ungated; not built here.
                raise UnsupportedError(
                    f"{where}: {arch}.expert_shared_feed_forward_length: a shared expert in a "
                    f"{arch} model is not supported"
                )
        elif arch in _MOE_ARCHS:
            raise WeightFormatError(f"{where}: GGUF header lacks {arch}.expert_count")
        try:
            return cls(
                arch=arch,
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=(
                    need("feed_forward_length")
                    if not n_experts
                    else opt_int("feed_forward_length", 0) or gemma["expert_ff"]
                ),
                n_layers=n_layers,
                n_heads=n_heads,
                n_kv_heads=n_kv,
                head_dim=head_dim,
                rms_norm_eps=opt_float("attention.layer_norm_rms_epsilon", 1e-5),
                rope_theta=opt_float("rope.freq_base", 10000.0),
                max_position=opt_int("context_length", 0) or 4096,
                attention_bias=arch in _QKV_BIAS_ARCHS,
                qk_norm=arch in _QK_NORM_ARCHS,
                qk_norm_full=arch in _QK_NORM_FULL_ARCHS,
                rope_scaling=scaling,
                rope_dims=None if rotated == head_dim else rotated,
                **gemma,
            )
        except WeightFormatError as exc:
            raise WeightFormatError(f"{where}: {exc}") from None


def _hf_rope_dims(cfg: Mapping[str, Any], arch: str, head_dim: int, where: str) -> int | None:
    """The rotated elements of a head under ``partial_rotary_factor``, where the model's
    Hugging Face definition applies it (Phi-3's, whose Phi-4-mini rotates 3/4)."""
    factor = cfg.get("partial_rotary_factor")
    if factor is None or float(factor) == 1.0:
        return None
    if arch != "phi3":
        raise UnsupportedError(
            f"{where}: partial_rotary_factor={factor} (partial RoPE) is not part of "
            f"Hugging Face's {arch} model"
        )
    if not (math.isfinite(float(factor)) and 0 < float(factor) < 1):
        raise WeightFormatError(f"{where}: partial_rotary_factor must be in (0, 1], got {factor}")
    return int(head_dim * float(factor))


def _hf_experts(cfg: Mapping[str, Any], arch: str, where: str) -> dict[str, Any]:
    """The mixture-of-experts fields of a Hugging Face config (Mixtral's ``num_local_experts``,
    the Qwen MoEs' ``num_experts``), with Hugging Face's defaults: Mixtral always renormalises
    the picked experts' weights, the Qwen MoEs when ``norm_topk_prob`` says so."""
    count = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    if not count:
        return {}
    if arch not in _MAY_HAVE_EXPERTS:
        raise UnsupportedError(f"{where}: a {arch} mixture of experts is not supported")
    if arch in _MOE_ARCHS:
        step = int(cfg.get("decoder_sparse_step") or 1)
        if step != 1 or cfg.get("mlp_only_layers"):
            raise UnsupportedError(
                f"{where}: dense layers among the experts (decoder_sparse_step={step}, "
                f"mlp_only_layers={cfg.get('mlp_only_layers')}) are not supported"
            )
    # Mixtral and Granite MoE: num_local_experts, intermediate_size wide, always
    # renormalised (Granite's router takes the softmax of the top k logits, the same thing);
    # OLMoE: num_experts, intermediate_size wide, norm_topk_prob.
    local = arch in ("mistral", "granitemoe")
    if arch == "granitemoe" and cfg.get("shared_intermediate_size"):
        raise UnsupportedError(f"{where}: a Granite MoE shared expert is not supported")
    width = "intermediate_size" if local or arch == "olmoe" else "moe_intermediate_size"
    out: dict[str, Any] = {
        "n_experts": _require_int(cfg, "num_local_experts" if local else "num_experts", where),
        "n_experts_used": _require_int(cfg, "num_experts_per_tok", where),
        "expert_ff": _require_int(cfg, width, where),
        "experts_norm": local or bool(cfg.get("norm_topk_prob", False)),
    }
    if arch == "qwen2moe":
        out["shared_expert_ff"] = _require_int(cfg, "shared_expert_intermediate_size", where)
    return out


def _interval_nope(n: int, n_layers: int) -> tuple[bool, ...]:
    """SmolLM3's NoPE layers for an interval ``n``: layer ``i`` has no RoPE when
    ``(i + 1) % n == 0``."""
    return tuple((i + 1) % n == 0 for i in range(n_layers))


def _hf_nope_layers(cfg: Mapping[str, Any], n_layers: int, where: str) -> tuple[bool, ...]:
    """SmolLM3's ``no_rope_layers`` (1: RoPE, 0: none, one a layer), else its interval."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = int(cfg.get("no_rope_layer_interval") or _SMOLLM3_NOPE_INTERVAL)
        if interval <= 0:
            raise WeightFormatError(f"{where}: no_rope_layer_interval must be positive")
        return _interval_nope(interval, n_layers)
    if len(flags) != n_layers:
        raise WeightFormatError(
            f"{where}: no_rope_layers has {len(flags)} entries for {n_layers} layers"
        )
    return tuple(not bool(f) for f in flags)


def _hf_granite(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Granite's multipliers (Hugging Face names) as config fields."""
    out: dict[str, Any] = {}
    for key, name in (
        ("embedding_multiplier", "embed_scale"),
        ("residual_multiplier", "residual_scale"),
        ("attention_multiplier", "attn_scale"),
        ("logits_scaling", "logit_scale"),
    ):
        if cfg.get(key) is not None:
            out[name] = float(cfg[key])
    return out


def _pattern_flags(n: int, n_layers: int) -> tuple[bool, ...]:
    """llama.cpp's window pattern of ``n``: layer ``i`` is windowed when ``i % n < n - 1``."""
    return tuple(i % n < n - 1 for i in range(n_layers))


def _window_flags(value: Any, arch: str, n_layers: int, where: str) -> tuple[bool, ...]:
    """The windowed layers of a Gemma 2/3 GGUF: ``{arch}.attention.sliding_window_pattern``
    (a period, or one flag a layer) when the header has it, else llama.cpp's fixed period."""
    if value is None:
        return _pattern_flags(_WINDOW_PATTERN[arch], n_layers)
    key = f"{arch}.attention.sliding_window_pattern"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) <= 0:
            raise WeightFormatError(f"{where}: GGUF field {key} must be positive, got {value}")
        return _pattern_flags(int(value), n_layers)
    flags = np.asarray(value).reshape(-1)
    if flags.size != n_layers:
        raise WeightFormatError(
            f"{where}: GGUF field {key} has {flags.size} flags for {n_layers} layers"
        )
    return tuple(bool(f) for f in flags)


def _hf_gemma(
    cfg: Mapping[str, Any], arch: str, n_layers: int, hidden: int, where: str
) -> dict[str, Any]:
    """The Gemma fields of a Hugging Face config."""
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise UnsupportedError(f"{where}: hidden_activation {act!r} is not supported for {arch}")
    out: dict[str, Any] = {"embed_scale": math.sqrt(hidden), "gelu": True}
    scalar = cfg.get("query_pre_attn_scalar")
    if scalar is not None:
        out["attn_scale"] = float(scalar) ** -0.5
    if arch == "gemma":
        return out
    out["post_norms"] = True
    window = cfg.get("sliding_window")
    if not window:
        raise WeightFormatError(f"{where}: {arch} needs 'sliding_window'")
    out["sliding_window"] = int(window)
    types = cfg.get("layer_types")
    if types:
        if len(types) != n_layers:
            raise WeightFormatError(
                f"{where}: layer_types has {len(types)} entries for {n_layers} layers"
            )
        out["window_layers"] = tuple(t == "sliding_attention" for t in types)
    else:
        period = cfg.get("sliding_window_pattern") or _WINDOW_PATTERN[arch]
        out["window_layers"] = _pattern_flags(int(period), n_layers)
    for key, name in (
        ("attn_logit_softcapping", "attn_softcap"),
        ("final_logit_softcapping", "final_softcap"),
    ):
        if cfg.get(key):
            out[name] = float(cfg[key])
    if arch == "gemma3":
        out["rope_local_theta"] = float(cfg.get("rope_local_base_freq", _GEMMA3_LOCAL_THETA))
    return out


def longrope_scaling(
    short: Any, long: Any, original: Any, attention_factor: Any, pairs: int, where: str
) -> RopeScaling:
    """LongRoPE's two factor sets (one factor a rotated pair, positive), its original context
    and its cos/sin factor, checked."""
    if isinstance(original, bool) or not isinstance(original, (int, np.integer)) or original <= 0:
        raise WeightFormatError(f"{where}: LongRoPE needs a positive original context length")
    if isinstance(attention_factor, bool) or not isinstance(
        attention_factor, (int, float, np.number)
    ):
        raise WeightFormatError(f"{where}: LongRoPE attention factor is {attention_factor!r}")
    if not (math.isfinite(attention_factor) and attention_factor > 0):
        raise WeightFormatError(f"{where}: LongRoPE attention factor is {attention_factor!r}")
    sets: list[tuple[float, ...]] = []
    for name, values in (("short_factor", short), ("long_factor", long)):
        try:
            arr = np.asarray(values, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise WeightFormatError(f"{where}: LongRoPE {name} is not a list of numbers") from None
        if arr.size != pairs:
            raise WeightFormatError(
                f"{where}: LongRoPE {name} has {arr.size} factors, the rotated pairs are {pairs}"
            )
        if not np.all(np.isfinite(arr) & (arr > 0)):
            raise WeightFormatError(f"{where}: LongRoPE {name} holds a factor that is not positive")
        sets.append(tuple(float(x) for x in arr))
    return RopeScaling(
        "longrope",
        factor=float(attention_factor),
        original_max_position=int(original),
        freq_factors=sets[0],
        long_factors=sets[1],
    )


def _hf_yarn_mscale(rs: Mapping[str, Any], factor: float, where: str) -> float:
    """The factor on cos and sin of Hugging Face's YaRN: ``attention_factor``, by default
    ``0.1 ln(factor) + 1`` (what llama.cpp multiplies); DeepSeek's ``mscale`` over
    ``mscale_all_dim`` is refused."""
    if rs.get("mscale") and rs.get("mscale_all_dim"):
        raise UnsupportedError(
            f"{where}: rope_scaling.mscale with mscale_all_dim (DeepSeek's YaRN) is not supported"
        )
    attention = rs.get("attention_factor")
    if attention is None:
        return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    value = float(attention)
    if not (math.isfinite(value) and value > 0):
        raise WeightFormatError(f"{where}: rope_scaling.attention_factor must be positive")
    return value


def _hf_longrope(
    rs: Mapping[str, Any], where: str, cfg: Mapping[str, Any], pairs: int
) -> RopeScaling:
    """Hugging Face's LongRoPE fields, with its default attention factor
    ``sqrt(1 + log(s) / log(original))`` for ``s = max_position / original`` (1 when s <= 1),
    which llama.cpp's converter writes as ``attn_factor`` too."""
    original = cfg.get("original_max_position_embeddings") or rs.get(
        "original_max_position_embeddings"
    )
    attention = rs.get("attention_factor")
    if attention is None and isinstance(original, int) and original > 1:
        s = float(cfg.get("max_position_embeddings", original)) / original
        attention = math.sqrt(1 + math.log(s) / math.log(original)) if s > 1 else 1.0
    return longrope_scaling(
        rs.get("short_factor"), rs.get("long_factor"), original, attention, pairs, where
    )


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


def _hf_exaone4_windows(cfg: Mapping[str, Any], n_layers: int, where: str) -> dict[str, Any]:
    """EXAONE 4's windowed layers (``layer_types``, or ``sliding_window_pattern`` as a string
    such as ``"LLLG"`` or a period), RoPE on those only; none without ``sliding_window``."""
    window = cfg.get("sliding_window")
    if not window:
        return {}
    types = cfg.get("layer_types")
    pattern = cfg.get("sliding_window_pattern")
    if types:
        flags = tuple(t == "sliding_attention" for t in types)
    elif isinstance(pattern, str) and pattern:
        flags = tuple(pattern[i % len(pattern)] == "L" for i in range(n_layers))
    elif pattern:
        flags = _pattern_flags(int(pattern), n_layers)
    else:
        raise WeightFormatError(f"{where}: sliding_window without layer_types or a pattern")
    if len(flags) != n_layers:
        raise WeightFormatError(
            f"{where}: layer_types has {len(flags)} entries for {n_layers} layers"
        )
    return {
        "sliding_window": int(window),
        "window_layers": flags,
        "nope_layers": tuple(not f for f in flags),
    }


def _hf_sliding_window(cfg: Mapping[str, Any], arch: str, where: str) -> int | None:
    """Mistral's attention window (each query sees its last ``W`` positions), if any."""
    window = cfg.get("sliding_window")
    if arch == "mistral":
        return int(window) if window else None
    if arch in GEMMA_ARCHITECTURES:
        return None  # Gemma 2/3's windowed layers come with the rest of its fields
    if arch == "phi3":
        return None  # llama.cpp runs Phi-3 without its window (llama.cpp PR 13676); so do we
    if arch in ("qwen2", "qwen3", *_MOE_ARCHS) and cfg.get("use_sliding_window"):
        raise UnsupportedError(
            f"{where}: use_sliding_window (per-layer windows) is not supported for {arch}"
        )
    return None


def _gguf_yarn(
    opt_float: Callable[[str, float], float], opt_int: Callable[[str, int], int], where: str
) -> tuple[RopeScaling, float]:
    """YaRN from llama.cpp's keys, and the factor on RoPE's cos and sin it implies: the
    attention factor (``rope.scaling.attn_factor``, default 1) times ``1 + 0.1 ln(factor)``,
    as ggml's ``rope_yarn`` multiplies it."""
    factor = opt_float("rope.scaling.factor", 0.0)
    original = opt_int("rope.scaling.original_context_length", 0)
    if not (math.isfinite(factor) and factor >= 1.0) or original <= 0:
        raise WeightFormatError(
            f"{where}: YaRN needs rope.scaling.factor >= 1 and "
            f"rope.scaling.original_context_length (got {factor}, {original})"
        )
    scaling = RopeScaling(
        "yarn",
        factor=factor,
        original_max_position=original,
        beta_fast=opt_float("rope.scaling.yarn_beta_fast", _YARN_BETA_FAST),
        beta_slow=opt_float("rope.scaling.yarn_beta_slow", _YARN_BETA_SLOW),
    )
    attn = opt_float("rope.scaling.attn_factor", 1.0)
    return scaling, attn * (1.0 + 0.1 * math.log(factor))


def _yarn_inv_freq(
    inv: npt.NDArray[np.float64], dims: int, base: float, rs: RopeScaling
) -> npt.NDArray[np.float64]:
    """YaRN's frequencies (ggml's ``rope_yarn`` with ``ext_factor`` 1): pair ``i`` keeps its
    frequency below the band of pairs ``[low, high]``, is divided by ``factor`` above it, and
    blends linearly across it. ``low``/``high`` are the pairs that turn ``beta_fast`` /
    ``beta_slow`` times over the original context."""

    def corr(rotations: float) -> float:
        return (
            dims
            * math.log(rs.original_max_position / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = corr(rs.beta_fast), corr(rs.beta_slow)
    if rs.truncate:
        low, high = max(0.0, math.floor(low)), min(dims - 1.0, math.ceil(high))
    y = (np.arange(inv.size, dtype=np.float64) - low) / max(0.001, high - low)
    keep = 1.0 - np.clip(y, 0.0, 1.0)
    out: npt.NDArray[np.float64] = inv / rs.factor * (1.0 - keep) + inv * keep
    return out


def _hf_rope_scaling(rs: Any, where: str, cfg: Mapping[str, Any], pairs: int) -> RopeScaling | None:
    if not rs:
        return None
    kind = str(rs.get("rope_type") or rs.get("type") or "")
    if kind == "default":
        return None
    if kind in ("longrope", "su"):
        return _hf_longrope(rs, where, cfg, pairs)
    if kind == "linear":
        return RopeScaling("linear", factor=float(rs["factor"]))
    if kind == "yarn":
        # As llama.cpp's converter reads it (its GGUF keys): the factor given, over the
        # original context (else the config's max_position_embeddings, as Hugging Face's).
        original = rs.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
        factor = float(rs.get("factor") or 0.0)
        if not (isinstance(original, int) and original > 0 and factor >= 1.0):
            raise WeightFormatError(
                f"{where}: YaRN needs rope_scaling.factor >= 1 and "
                f"original_max_position_embeddings (got {factor}, {original})"
            )
        return RopeScaling(
            "yarn",
            factor=factor,
            original_max_position=original,
            beta_fast=float(rs.get("beta_fast", _YARN_BETA_FAST)),
            beta_slow=float(rs.get("beta_slow", _YARN_BETA_SLOW)),
            truncate=bool(rs.get("truncate", True)),
        )
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=float(rs["factor"]),
            low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
            original_max_position=int(rs.get("original_max_position_embeddings", 8192)),
        )
    raise UnsupportedError(f"{where}: rope_scaling type {kind!r} is not supported")
