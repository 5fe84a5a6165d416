"""Build the Rust engine for a Llama-family checkpoint: headers read once, weights mapped in place.

GGUF headers are walked once by `rlx_lm._headers` (bounds-checked; split files from their
first shard), safetensors headers likewise. The architecture and every tensor's type are
checked before anything is built, so an unsupported file is refused at once, naming the
tensor, its type and what is supported. The tensor table (file, offset, type, shape) goes to
Rust, which maps the files, checks every tensor against its file and multiplies the weights
as stored. A type with no kernel that ``gguf.quants`` decodes is dequantised once, here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rlx_lm._core import QUANT_TYPES, Engine, engine_kernel_types
from rlx_lm._headers import GgufHeader, read_gguf_header, read_safetensors_header
from rlx_lm._headers import ggml_type as ggml_type_info
from rlx_lm.config import available_cores
from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama_config import (
    GEMMA_ARCHITECTURES,
    LlamaConfig,
    RopeScaling,
    longrope_scaling,
)

__all__ = [
    "EngineLoad",
    "default_threads",
    "engine_config",
    "gguf_plan",
    "load_gguf_engine",
    "load_safetensors_engine",
]

# Architectures whose q/k rows llama.cpp's converter permutes for its NORM-style RoPE: the
# engine uses the interleaved pairing on those rows as stored (equal to rotate-half on the
# original rows), so nothing is copied.
_PERMUTED_ARCHS = ("llama", "mistral", "granite", "granitemoe", "smollm3")
# Architectures whose checkpoints pair q/k elements for RoPE as (2i, 2i + 1) already (ERNIE
# 4.5's rotary embedding): interleaved in both formats, nothing permuted by the converter.
_INTERLEAVED_ARCHS = ("ernie4_5",)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")

# ggml ids of the plain float types, as the core defines them (F64, which only this loader
# converts, comes from the gguf package's table where it is used).
_F32, _F16, _BF16 = (QUANT_TYPES[name][0] for name in ("F32", "F16", "BF16"))
_ST_TYPES = {"F32": _F32, "F16": _F16, "BF16": _BF16}

Tensor = tuple[str, int, int, int, list[int]]
Owned = tuple[str, list[int], npt.NDArray[np.float32]]


def default_threads() -> int:
    """The cores this process may run on (the builder's default ``threads``)."""
    return available_cores()


def engine_config(cfg: LlamaConfig, rope_style: str) -> dict[str, Any]:
    """The mapping the engine reads: geometry, numerics and the block variant."""
    return {
        "arch": cfg.arch,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": float(cfg.rms_norm_eps),
        "rope_inv_freq": [float(f) for f in cfg.inv_freq()],
        "rope_position_scale": float(cfg.position_scale()),
        "rope_style": rope_style,
        "sliding_window": cfg.sliding_window,
        "qkv_bias": cfg.attention_bias,
        "qk_norm": cfg.qk_norm,
        "window_layers": list(cfg.window_layers),
        "rope_local_inv_freq": (
            None if (local := cfg.local_inv_freq()) is None else [float(f) for f in local]
        ),
        "rope_local_position_scale": 1.0,
        "embed_scale": float(cfg.embed_scale),
        "attn_scale": float(cfg.score_scale()),
        "rope_mscale": float(cfg.rope_mscale),
        "residual_scale": float(cfg.residual_scale),
        "logit_scale": float(cfg.logit_scale),
        "nope_layers": list(cfg.nope_layers),
        "attn_softcap": cfg.attn_softcap,
        "final_softcap": cfg.final_softcap,
        "gelu": cfg.gelu,
        "post_norms": cfg.post_norms,
        "no_pre_norms": cfg.no_pre_norms,
        "qk_norm_full": cfg.qk_norm_full,
        "n_experts": cfg.n_experts,
        "n_experts_used": cfg.n_experts_used,
        "expert_ff": cfg.expert_ff,
        "experts_norm": cfg.experts_norm,
        "shared_expert_ff": cfg.shared_expert_ff,
        "expert_gating": cfg.expert_gating,
        "expert_biases": cfg.expert_biases,
        "o_bias": cfg.o_bias,
        "attn_sinks": cfg.attn_sinks,
        "oai_glu": cfg.oai_glu,
    }


@dataclass
class EngineLoad:
    """A built engine and what loading it found."""

    cfg: LlamaConfig
    engine: Engine
    files: list[Path]
    dequantised: dict[str, str] = field(default_factory=dict)
    """Tensors with no kernel, dequantised to float32 at load: name -> type name."""
    sample: bytes = b""
    """A few bytes of the weights, for the model fingerprint."""
    packed: bool = True
    """Whether the weights are multiplied as stored (False: dequantised to float32 at load)."""
    longrope: tuple[int, bool] | None = None
    """LongRoPE (Phi-3's 128k models): ``(original context, long factors chosen)``; the
    factor set is picked for the session length at load, as llama.cpp picks it per context."""


def _type_name(ggml_type: int) -> str:
    known = ggml_type_info(ggml_type)
    return known[0] if known is not None else f"#{ggml_type}"


def _decodable(ggml_type: int) -> bool:
    """Whether ``gguf.quants`` can dequantise this type."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits

    try:
        qt = GGMLQuantizationType(ggml_type)
    except ValueError:
        return False
    return qt in _type_traits or qt in (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.F64,
    )


def _supported_names(kernels: frozenset[int]) -> str:
    return ", ".join(_type_name(t) for t in sorted(kernels))


def _shards(path: Path) -> list[Path]:
    m = _SHARD.search(path.stem)
    if m is None:
        return [path]
    if int(m.group(1)) != 1:
        raise WeightFormatError(
            f"{path}: a split GGUF loads from its first shard "
            f"({path.stem[: m.start()]}-00001-of-{m.group(2)}.gguf)"
        )
    stem, count = path.stem[: m.start()], int(m.group(2))
    files = [path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise WeightFormatError(f"{path}: shards of this split GGUF are missing: {missing}")
    return files


def gguf_plan(
    path: Path,
) -> tuple[list[Path], list[GgufHeader], dict[str, tuple[int, int, int, list[int]]]]:
    """Headers of every shard and the tensor table ``name -> (file, offset, type, shape)``.

    Shapes are row-major (``[rows, cols]``, GGUF lists them innermost first).
    """
    files = _shards(path)
    headers = [read_gguf_header(f) for f in files]
    table: dict[str, tuple[int, int, int, list[int]]] = {}
    for i, h in enumerate(headers):
        for t in h.tensors:
            if t.name in table:
                raise WeightFormatError(f"{files[i]}: tensor {t.name} appears in two shards")
            shape = [int(d) for d in reversed(t.shape)]
            table[t.name] = (i, h.data_offset + t.offset, t.ggml_type, shape)
    return files, headers, table


def _gguf_config(path: Path, header: GgufHeader, table: Mapping[str, Any]) -> LlamaConfig:
    meta = header.metadata
    emb = table.get("token_embd.weight")
    vocab_fallback = int(emb[3][0]) if emb is not None and len(emb[3]) == 2 else 0
    if not vocab_fallback:
        vocab_fallback = header.array_lengths.get("tokenizer.ggml.tokens", 0)
    cfg = LlamaConfig.from_gguf_fields(meta.get, where=str(path), vocab_fallback=vocab_fallback)
    if "output.weight" not in table:
        cfg = replace(cfg, tie_word_embeddings=True)
    return cfg


def _read_f32(path: Path, offset: int, count: int) -> npt.NDArray[np.float32]:
    out = np.fromfile(path, dtype="<f4", count=count, offset=offset)
    if out.size != count:
        raise WeightFormatError(f"{path}: truncated tensor data at offset {offset}")
    return out.astype(np.float32)


def _dequantise(path: Path, offset: int, ggml_type: int, shape: list[int], name: str) -> Any:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qt = GGMLQuantizationType(ggml_type)
    block, size = GGML_QUANT_SIZES[qt]
    count = int(np.prod(shape))
    raw = np.fromfile(path, dtype=np.uint8, count=count // block * size, offset=offset)
    try:
        values = raw.view("<f8") if qt == GGMLQuantizationType.F64 else dequantize(raw, qt)
    except Exception as exc:
        raise WeightFormatError(f"{path}: cannot decode tensor {name}: {exc}") from None
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))


Progress = Callable[[int, int], None] | None


def load_gguf_engine(
    path: Path,
    *,
    config: LlamaConfig | None = None,
    threads: int | None = None,
    on_progress: Progress = None,
    activations: str = "exact",
    packed: bool = True,
    context: int | None = None,
    use_mmap: bool | None = None,
) -> EngineLoad:
    """Check and map a GGUF file (or split GGUF from its first shard) into an engine.

    ``context`` is the session length the engine will serve (the runner's ``max_seq``); it
    picks LongRoPE's factor set (None: the model's trained context).

    ``packed=False`` dequantises every tensor not stored as F32 to float32 at load (more
    memory, and the float32 kernels), instead of multiplying the weights as stored.
    ``on_progress`` sees three steps: header checked, tensors with no kernel decoded,
    engine built.
    """
    report = on_progress or (lambda _done, _total: None)
    files, headers, table = gguf_plan(path)
    cfg = _gguf_config(path, headers[0], table)  # refuses an unknown architecture
    cfg = config or cfg
    kernels = frozenset(engine_kernel_types())
    plan: list[Tensor] = []
    lazy: list[tuple[str, int, int, int, list[int]]] = []
    dequantised: dict[str, str] = {}
    for name, (fi, offset, ggml_type, shape) in table.items():
        if ggml_type in kernels and (packed or ggml_type == _F32):
            plan.append((name, fi, offset, ggml_type, shape))
        elif _decodable(ggml_type):
            lazy.append((name, fi, offset, ggml_type, shape))
            dequantised[name] = _type_name(ggml_type)
        else:
            raise UnsupportedError(
                f"{path}: tensor {name} uses quant type {_type_name(ggml_type)}, which is not "
                f"supported (supported: {_supported_names(kernels)})"
            )
    if any(n.startswith("rope_factors_") for n in table) and config is None:
        cfg = _longrope(path, files, headers[0], table, cfg)
    cfg, longrope = cfg.for_context(context)
    freqs = table.get("rope_freqs.weight")
    if freqs is not None and config is None:
        fi, offset, ggml_type, shape = freqs
        if ggml_type != _F32:
            raise UnsupportedError(f"{path}: rope_freqs.weight must be F32")
        factors = tuple(float(x) for x in _read_f32(files[fi], offset, int(np.prod(shape))))
        cfg = replace(cfg, rope_scaling=RopeScaling("factors", freq_factors=factors))
    report(1, 3)
    owned: list[Owned] = [
        (name, shape, _dequantise(files[fi], offset, t, shape, name))
        for name, fi, offset, t, shape in lazy
    ]
    report(2, 3)
    style = "interleaved" if cfg.arch in (*_PERMUTED_ARCHS, *_INTERLEAVED_ARCHS) else "halves"
    engine = _build(cfg, style, files, plan, owned, threads, activations, use_mmap, where=str(path))
    report(3, 3)
    norm = table.get("output_norm.weight")
    sample = b""
    if norm is not None:
        with open(files[norm[0]], "rb") as fh:
            fh.seek(norm[1])
            sample = fh.read(256)
    return EngineLoad(cfg, engine, files, dequantised, sample, packed, longrope)


def _longrope(
    path: Path,
    files: list[Path],
    header: GgufHeader,
    table: Mapping[str, tuple[int, int, int, list[int]]],
    cfg: LlamaConfig,
) -> LlamaConfig:
    """``cfg`` with the LongRoPE of a GGUF (llama.cpp's converter: both factor sets as tensors,
    ``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor`` as keys), for
    :meth:`LlamaConfig.for_context` to choose from."""
    meta, arch = header.metadata, cfg.arch
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original is None:
        raise WeightFormatError(
            f"{path}: LongRoPE factors without {arch}.rope.scaling.original_context_length"
        )
    pairs = cfg.rotary_dims // 2
    sets = []
    for name in ("rope_factors_short.weight", "rope_factors_long.weight"):
        entry = table.get(name)
        if entry is None:
            raise WeightFormatError(f"{path}: LongRoPE needs {name}")
        fi, offset, ggml_type, shape = entry
        if ggml_type != _F32 or int(np.prod(shape)) != pairs:
            raise WeightFormatError(f"{path}: {name} must be {pairs} F32 values, got shape {shape}")
        sets.append(_read_f32(files[fi], offset, pairs))
    attn = meta.get(f"{arch}.rope.scaling.attn_factor", 1.0)
    scaling = longrope_scaling(sets[0], sets[1], original, attn, pairs, str(path))
    return replace(cfg, rope_scaling=scaling)


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # Phi-3: q, k and v in one matrix, gate and up in one (gate first).
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    # Mixtures of experts: the router (Qwen MoEs, Mixtral), Qwen2-MoE's shared expert.
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    # Granite MoE: the router, and every expert's matrices as one [n, rows, cols] tensor (gate
    # and up in one, gate first: cut apart in the engine).
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.input_linear.weight": "ffn_gate_up_exps.weight",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
}
# One matrix an expert, under llama.cpp's per-expert names (``ffn_gate.{e}.weight``): the Qwen
# MoEs' ``mlp.experts.{e}.gate_proj``, Mixtral's ``block_sparse_moe.experts.{e}.w1`` (gate),
# ``w3`` (up) and ``w2`` (down).
_EXPERT_RE = re.compile(
    r"^(?:mlp\.experts\.(\d+)\.(gate|up|down)_proj|block_sparse_moe\.experts\.(\d+)\.(w[123]))"
    r"\.weight$"
)
_MIXTRAL_PARTS = {"w1": "gate", "w3": "up", "w2": "down"}
# Gemma 2 and 3 norm the attention output with `post_attention_layernorm` and have a norm
# before and after the MLP (llama.cpp's names: post_attention_norm, ffn_norm, post_ffw_norm).
_POST_NORM_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _short_name(hf_name: str, cfg: LlamaConfig | None = None) -> str | None:
    names = _POST_NORM_NAMES if cfg is not None and cfg.post_norms else _LAYER_NAMES
    short = _TOP_NAMES.get(hf_name)
    m = _LAYER_RE.match(hf_name)
    if short is None and m and m.group(2) in names:
        short = f"blk.{m.group(1)}.{names[m.group(2)]}"
    elif short is None and m and (e := _EXPERT_RE.match(m.group(2))):
        expert, part = (e.group(1), e.group(2)) if e.group(1) else (e.group(3), e.group(4))
        short = f"blk.{m.group(1)}.ffn_{_MIXTRAL_PARTS.get(part, part)}.{expert}.weight"
    return short


def _norm_offset(cfg: LlamaConfig, short: str) -> bool:
    """Whether a Hugging Face tensor is a Gemma norm weight, stored as ``w - 1`` (Gemma's
    RMSNorm multiplies by ``1 + w``; llama.cpp's converter adds the 1 when it writes GGUF)."""
    return cfg.arch in GEMMA_ARCHITECTURES and short.endswith("norm.weight")


def load_safetensors_engine(
    files: list[Path],
    cfg: LlamaConfig,
    *,
    threads: int | None = None,
    on_progress: Progress = None,
    activations: str = "exact",
    packed: bool = True,
    context: int | None = None,
    use_mmap: bool | None = None,
) -> EngineLoad:
    """Map safetensors files (F32/F16/BF16 used in place; F64 converted once) into an engine.

    ``packed=False`` converts F16 and BF16 tensors to float32 at load as well.
    ``on_progress`` sees one step per file and one for building the engine. ``context`` (the
    runner's ``max_seq``) picks LongRoPE's factor set, as for GGUF.
    """
    cfg, longrope = cfg.for_context(context)
    plan: list[Tensor] = []
    owned: list[Owned] = []
    dequantised: dict[str, str] = {}
    sample = b""
    for fi, f in enumerate(files):
        header = read_safetensors_header(f)
        if any(n.endswith((".scales", ".biases")) for n in header.tensors):
            raise UnsupportedError(
                f"{f}: MLX-quantised weights (.scales/.biases) are not supported; "
                "use an unquantized checkpoint or a GGUF file"
            )
        for hf_name, (dtype, shape) in header.tensors.items():
            short = _short_name(hf_name, cfg)
            if short is None:
                continue
            begin = header.data_offset + header.offsets[hf_name][0]
            dims = [int(d) for d in shape]
            if _norm_offset(cfg, short) and dtype in ("F32", "F16", "BF16"):
                count = int(np.prod(dims))
                if dtype == "F32":
                    values = _read_f32(f, begin, count)
                else:
                    values = _widen(f, begin, dtype, count)
                owned.append((short, dims, np.ascontiguousarray(values + np.float32(1.0))))
            elif dtype in _ST_TYPES and (packed or dtype == "F32"):
                plan.append((short, fi, begin, _ST_TYPES[dtype], dims))
            elif dtype in ("F16", "BF16"):
                owned.append((short, dims, _widen(f, begin, dtype, int(np.prod(dims)))))
                dequantised[short] = dtype
            elif dtype == "F64":
                count = int(np.prod(dims))
                raw = np.fromfile(f, dtype="<f8", count=count, offset=begin)
                if _norm_offset(cfg, short):
                    raw = raw + 1.0
                owned.append((short, dims, np.ascontiguousarray(raw, dtype=np.float32)))
                dequantised[short] = "F64"
            else:
                raise UnsupportedError(
                    f"{f}: tensor {hf_name} has dtype {dtype}, supported: F32, F16, BF16, F64"
                )
            if short == "output_norm.weight":
                with open(f, "rb") as fh:
                    fh.seek(begin)
                    sample = fh.read(256)
        if on_progress is not None:
            on_progress(fi + 1, len(files) + 1)
    style = "interleaved" if cfg.arch in _INTERLEAVED_ARCHS else "halves"
    engine = _build(
        cfg, style, files, plan, owned, threads, activations, use_mmap, where=str(files[0])
    )
    if on_progress is not None:
        on_progress(len(files) + 1, len(files) + 1)
    return EngineLoad(cfg, engine, files, dequantised, sample, packed, longrope)


def _widen(path: Path, offset: int, dtype: str, count: int) -> npt.NDArray[np.float32]:
    """An F16 or BF16 tensor of a safetensors file as float32."""
    raw = np.fromfile(path, dtype="<u2", count=count, offset=offset)
    if raw.size != count:
        raise WeightFormatError(f"{path}: truncated tensor data at offset {offset}")
    if dtype == "F16":
        return np.ascontiguousarray(raw.view("<f2").astype(np.float32))
    return np.ascontiguousarray((raw.astype(np.uint32) << 16).view(np.float32))


def _build(
    cfg: LlamaConfig,
    style: str,
    files: list[Path],
    plan: list[Tensor],
    owned: list[Owned],
    threads: int | None,
    activations: str,
    use_mmap: bool | None,
    *,
    where: str,
) -> Engine:
    try:
        return Engine(
            config=engine_config(cfg, style),
            files=[str(f) for f in files],
            tensors=plan,
            owned=owned,
            threads=threads or default_threads(),
            activations=activations,
            use_mmap=use_mmap,
        )
    except WeightFormatError as exc:
        raise WeightFormatError(f"{where}: {exc}") from None
