"""Tiny random-weight Llama-family models written to disk in every format the runner reads.

A `TinyModel` holds a Hugging Face style config and float32 tensors under HF names. It can be
written as a safetensors directory (single or sharded, + config.json, + tokenizer.json) or as a
GGUF file with matrices in any supported GGML type. For quantised types the model's own tensors
are replaced by the dequantised values first, so every format of one TinyModel holds exactly the
same numbers and their logits can be compared tightly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

QT = gguf.GGMLQuantizationType

# Bytes per block / values per block of the K-quants, whose writers the gguf package lacks.
_KQUANT = {"Q4_K": (144, 256), "Q6_K": (210, 256)}


@dataclass
class TinyModel:
    """A random model: HF config dict and HF-named float32 tensors."""

    config: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    tokenizer_json: str | None = None

    @property
    def arch(self) -> str:
        return str(self.config["model_type"])


def make_tiny(
    arch: str = "llama",
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    inter: int = 64,
    vocab: int = 128,
    head_dim: int | None = None,
    tie: bool = False,
    theta: float = 10000.0,
    scale: float = 0.3,
    experts: int = 4,
    used: int = 2,
    expert_inter: int = 64,
) -> TinyModel:
    """Random weights with the given geometry (norm weights near 1 so activations stay sane).

    Gemma models (``gemma``, ``gemma2``, ``gemma3``) follow Hugging Face's layout: norms
    stored as ``w - 1``, Gemma 2/3's four norms a block, and config fields chosen so each
    feature matters at this size (a window of 3, soft caps of 4 and 6, every other layer
    windowed, a local RoPE base of 10000 against a global 1e6 with linear scaling). Granite gets
    multipliers far from 1; SmolLM3 at least 4 layers, so its fourth has no RoPE. The mixtures
    of experts (``qwen3moe``, ``qwen2moe``, ``mixtral``) get ``experts`` experts of which each
    token runs ``used``, ``expert_inter`` wide (Qwen2-MoE: a shared expert ``inter`` wide), and a
    router scaled up so that tokens pick different experts.
    """
    rng = np.random.default_rng(seed)
    if arch == "smollm3":
        layers = max(layers, 4)  # so that its NoPE layer (every fourth) exists
    hd = head_dim or hidden // heads
    gemma = arch in ("gemma", "gemma2", "gemma3")
    moe = arch in ("qwen2moe", "qwen3moe", "mixtral", "granitemoe", "olmoe", "gpt-oss")
    oss = arch == "gpt-oss"
    model_type = {
        "gemma3": "gemma3_text",
        "qwen2moe": "qwen2_moe",
        "qwen3moe": "qwen3_moe",
        "gpt-oss": "gpt_oss",
    }
    cfg: dict[str, Any] = {
        "model_type": model_type.get(arch, arch),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hd,
        "rms_norm_eps": 1e-5,
        "rope_theta": theta,
        "max_position_embeddings": 512,
        "tie_word_embeddings": tie,
    }
    if gemma:
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["query_pre_attn_scalar"] = hd
    if arch == "gemma2":
        cfg.update(sliding_window=3, attn_logit_softcapping=4.0, final_logit_softcapping=6.0)
    if arch in ("granite", "granitemoe"):
        # Multipliers far from 1 so each one shows (Granite 3's are 12, 0.22, 1/128, 8).
        cfg.update(
            embedding_multiplier=6.0,
            residual_multiplier=0.4,
            attention_multiplier=0.2,
            logits_scaling=3.0,
        )
    if arch == "smollm3":
        # Hugging Face's default pattern: every fourth layer without RoPE (one a model of 4).
        cfg["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(layers)]
    if oss:
        # gpt-oss: experts intermediate_size wide, every other layer windowed (the even ones),
        # YaRN over a short original context so that it matters at this length, and llama.cpp's
        # rounding of YaRN's band (its checkpoints say truncate: false; GGUF has no such key).
        cfg.update(
            num_local_experts=experts,
            num_experts_per_tok=used,
            intermediate_size=expert_inter,
            sliding_window=3,
            layer_types=[
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
            ],
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": True,
            },
        )
    elif arch in ("mixtral", "granitemoe"):
        # Mixtral's and Granite MoE's experts are intermediate_size wide.
        cfg.update(num_local_experts=experts, num_experts_per_tok=used)
        cfg["intermediate_size"] = expert_inter
    elif moe:
        cfg.update(
            num_experts=experts, num_experts_per_tok=used, moe_intermediate_size=expert_inter
        )
        # Qwen3-MoE's checkpoints renormalise the picked weights, Qwen2-MoE's do not.
        cfg["norm_topk_prob"] = arch == "qwen3moe"
        if arch == "olmoe":  # its experts are intermediate_size wide
            cfg["intermediate_size"] = cfg.pop("moe_intermediate_size")
        if arch == "qwen2moe":
            cfg["shared_expert_intermediate_size"] = inter
    if arch == "gemma3":
        cfg.update(
            sliding_window=3,
            sliding_window_pattern=2,
            rope_local_base_freq=10000.0,
            rope_theta=1e6,
            rope_scaling={"rope_type": "linear", "factor": 4.0},
        )

    def mat(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * scale / np.sqrt(inp) * 3).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Gemma's checkpoints store w - 1 (its RMSNorm multiplies by 1 + w).
        return ((0.0 if gemma else 1.0) + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype(np.float32),
        "model.norm.weight": norm(hidden),
    }
    if not tie:
        t["lm_head.weight"] = mat(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        if arch not in ("olmo2", "exaone4"):  # these norm after attention and the MLP only
            t[p + "input_layernorm.weight"] = norm(hidden)
        t[p + "post_attention_layernorm.weight"] = norm(hidden)
        t[p + "self_attn.q_proj.weight"] = mat(heads * hd, hidden)
        t[p + "self_attn.k_proj.weight"] = mat(kv_heads * hd, hidden)
        t[p + "self_attn.v_proj.weight"] = mat(kv_heads * hd, hidden)
        t[p + "self_attn.o_proj.weight"] = mat(hidden, heads * hd)
        if not moe:
            t[p + "mlp.gate_proj.weight"] = mat(inter, hidden)
            t[p + "mlp.up_proj.weight"] = mat(inter, hidden)
            t[p + "mlp.down_proj.weight"] = mat(hidden, inter)
        elif arch == "granitemoe":
            # Hugging Face's GraniteMoe: the router, and every expert's gate and up (gate
            # first) as one [n, 2 * inter, hidden] tensor, its down as [n, hidden, inter].
            pre = p + "block_sparse_moe."
            t[pre + "router.layer.weight"] = mat(experts, hidden) * 4
            t[pre + "input_linear.weight"] = np.stack(
                [mat(2 * expert_inter, hidden) for _ in range(experts)]
            )
            t[pre + "output_linear.weight"] = np.stack(
                [mat(hidden, expert_inter) for _ in range(experts)]
            )
        elif oss:
            # Our own names (gpt-oss runs from GGUF only): llama.cpp's tensors, one expert at
            # a time, every one with its bias.
            t[p + "mlp.router.weight"] = mat(experts, hidden) * 4
            t[p + "mlp.router.bias"] = rng.standard_normal(experts).astype(np.float32)
            for e in range(experts):
                for part, (rows, cols) in (
                    ("gate_proj", (expert_inter, hidden)),
                    ("up_proj", (expert_inter, hidden)),
                    ("down_proj", (hidden, expert_inter)),
                ):
                    t[p + f"mlp.experts.{e}.{part}.weight"] = mat(rows, cols) * 2
                    t[p + f"mlp.experts.{e}.{part}.bias"] = (
                        0.5 * rng.standard_normal(rows)
                    ).astype(np.float32)
            t[p + "self_attn.o_proj.bias"] = (0.2 * rng.standard_normal(hidden)).astype(np.float32)
            # Sinks near the scores, so that each takes a visible share of the softmax.
            t[p + "self_attn.sinks"] = rng.standard_normal(heads).astype(np.float32)
        else:
            names = (
                ("block_sparse_moe.", "w1", "w3", "w2")
                if arch == "mixtral"
                else ("mlp.", "gate_proj", "up_proj", "down_proj")
            )
            pre = p + names[0]
            t[pre + "gate.weight"] = mat(experts, hidden) * 4
            for e in range(experts):
                t[pre + f"experts.{e}.{names[1]}.weight"] = mat(expert_inter, hidden)
                t[pre + f"experts.{e}.{names[2]}.weight"] = mat(expert_inter, hidden)
                t[pre + f"experts.{e}.{names[3]}.weight"] = mat(hidden, expert_inter)
            if arch == "qwen2moe":
                t[p + "mlp.shared_expert.gate_proj.weight"] = mat(inter, hidden)
                t[p + "mlp.shared_expert.up_proj.weight"] = mat(inter, hidden)
                t[p + "mlp.shared_expert.down_proj.weight"] = mat(hidden, inter)
                t[p + "mlp.shared_expert_gate.weight"] = mat(1, hidden)
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            for name, n in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                t[p + f"self_attn.{name}_proj.bias"] = (0.2 * rng.standard_normal(n)).astype(
                    np.float32
                )
        if arch in ("qwen3", "qwen3moe", "gemma3", "exaone4"):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        if arch in ("olmo2", "olmoe"):  # over the whole projection
            t[p + "self_attn.q_norm.weight"] = norm(heads * hd)
            t[p + "self_attn.k_norm.weight"] = norm(kv_heads * hd)
        if arch in ("olmo2", "exaone4"):
            t[p + "post_feedforward_layernorm.weight"] = norm(hidden)
        if arch in ("gemma2", "gemma3"):
            t[p + "pre_feedforward_layernorm.weight"] = norm(hidden)
            t[p + "post_feedforward_layernorm.weight"] = norm(hidden)
        if arch == "phi3":
            # Phi-3's checkpoints hold q, k, v as one matrix and gate, up as one (gate first).
            t[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
            )
            t[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [t.pop(p + f"mlp.{x}_proj.weight") for x in ("gate", "up")]
            )
    return TinyModel(cfg, t)


def with_longrope(model: TinyModel, original: int, *, seed: int = 0) -> TinyModel:
    """``model`` (a Phi-3) with LongRoPE: originally ``original`` positions, a short and a long
    factor set far apart, and a cos/sin factor of 1.3 (exaggerated so that it shows)."""
    rng = np.random.default_rng(seed)
    c = model.config
    half = int(c["head_dim"] * c.get("partial_rotary_factor", 1.0)) // 2
    model.config["original_max_position_embeddings"] = original
    model.config["rope_scaling"] = {
        "rope_type": "longrope",
        "short_factor": (1 + 2 * rng.random(half)).tolist(),
        "long_factor": (1 + 20 * rng.random(half)).tolist(),
        "attention_factor": 1.3,
    }
    return model


# ----------------------------------------------------------------- safetensors


def write_safetensors_dir(
    model: TinyModel, directory: Path, *, shards: int = 1, bf16: bool = False
) -> Path:
    """Write config.json + model.safetensors (or N shards with an index), and tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.config))
    if model.tokenizer_json is not None:
        (directory / "tokenizer.json").write_text(model.tokenizer_json)
    names = sorted(model.tensors)
    if bf16:
        # Stored as raw uint16 and patched to BF16 in the header below.
        tensors = {n: (model.tensors[n].view(np.uint32) >> 16).astype(np.uint16) for n in names}
    else:
        tensors = dict(model.tensors)
    if shards == 1:
        _save(tensors, directory / "model.safetensors", bf16)
        return directory
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        _save(part, directory / fname, bf16)
        weight_map.update({n: fname for n in part})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return directory


def _save(tensors: dict[str, np.ndarray], path: Path, bf16: bool) -> None:
    save_file(tensors, str(path))
    if not bf16:
        return
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].decode().replace('"U16"', '"BF16"').encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n :])


def round_to_bf16(model: TinyModel) -> TinyModel:
    """The same model with every tensor truncated to bfloat16 precision."""
    t = {n: ((a.view(np.uint32) >> 16) << 16).view(np.float32) for n, a in model.tensors.items()}
    return TinyModel(dict(model.config), t, model.tokenizer_json)


# ------------------------------------------------------------------------ GGUF


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k permutation (rotate-half rows -> interleaved pairs)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _random_kquant(rows: int, cols: int, qname: str, rng: np.random.Generator) -> np.ndarray:
    nbytes, per = _KQUANT[qname]
    assert cols % per == 0, f"{qname} needs a row length divisible by {per}"
    blocks = rng.integers(0, 256, size=(rows, cols // per, nbytes), dtype=np.uint8)
    d = np.array([0.02], dtype=np.float16).view(np.uint8)
    if qname == "Q4_K":
        blocks[..., 0:2] = d
        blocks[..., 2:4] = np.array([0.01], dtype=np.float16).view(np.uint8)
    else:
        blocks[..., 208:210] = d
        blocks[..., 192:208] = (
            rng.integers(-8, 8, size=(rows, cols // per, 16)).astype(np.int8).view(np.uint8)
        )
    return blocks.reshape(rows, -1)


def quantize_model(
    model: TinyModel, qtype: str, *, seed: int = 1
) -> tuple[TinyModel, dict[str, np.ndarray]]:
    """Replace every matrix (and every matrix of an expert stack) by its ``qtype`` round trip;
    return the model and the raw blocks."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    raw: dict[str, np.ndarray] = {}
    qt = QT[qtype]

    def one(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if qtype in _KQUANT:
            blocks = _random_kquant(a.shape[0], a.shape[1], qtype, rng)
        elif qtype == "F16":
            blocks = a.astype(np.float16)
        else:
            blocks = quantize(a, qt)
        return blocks, np.asarray(dequantize(blocks, qt), dtype=np.float32).reshape(a.shape)

    for name, a in model.tensors.items():
        if a.ndim not in (2, 3) or qtype == "F32":
            out[name] = a
            continue
        pairs = [one(x) for x in a] if a.ndim == 3 else [one(a)]
        raw[name] = np.stack([b for b, _ in pairs]) if a.ndim == 3 else pairs[0][0]
        out[name] = np.stack([d for _, d in pairs]) if a.ndim == 3 else pairs[0][1]
    return TinyModel(dict(model.config), out, model.tokenizer_json), raw


_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_GGUF_EXPERT = re.compile(
    r"^(?:mlp\.experts\.(\d+)\.(gate|up|down)_proj|block_sparse_moe\.experts\.(\d+)\.(w[123]))"
    r"\.(weight|bias)$"
)
_MIXTRAL_PARTS = {"w1": "gate", "w3": "up", "w2": "down"}


def expert_of(rest: str) -> tuple[int, str] | None:
    """``(expert, "gate" | "up" | "down")`` of a Hugging Face expert matrix (its name after
    ``model.layers.N.``: the Qwen MoEs' ``mlp.experts.E.gate_proj.weight``, Mixtral's
    ``block_sparse_moe.experts.E.w1.weight``), else None."""
    m = _GGUF_EXPERT.match(rest)
    if m is None or m.group(5) != "weight":
        return None
    expert, part = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return int(expert), _MIXTRAL_PARTS.get(part, part)


# Gemma 2/3 name their norms differently (llama.cpp's tensor map for those architectures).
_GGUF_POST_NORMS = {
    **_GGUF_LAYER,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
# gpt-oss (llama.cpp's names): its norm before the MLP is post_attention_norm, and it has
# an output bias, sinks and a router bias.
_GGUF_GPT_OSS = {
    **_GGUF_LAYER,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
}
_GGUF_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_gguf(
    model: TinyModel,
    path: Path,
    *,
    qtype: str = "F32",
    raw: dict[str, np.ndarray] | None = None,
    tokenizer: dict[str, Any] | None = None,
    arch_override: str | None = None,
    split_max_tensors: int = 0,
) -> Path:
    """Write ``model`` as GGUF (matrices as ``qtype``, from ``raw`` blocks when given).

    ``tokenizer`` holds ``tokenizer.ggml.*`` fields (see tokenizer_factory). Mistral is written with
    architecture ``llama``, as llama.cpp's converter does.
    """
    c = model.config
    own = {
        "mistral": "llama",
        "mixtral": "llama",
        "gemma3_text": "gemma3",
        "qwen2_moe": "qwen2moe",
        "qwen3_moe": "qwen3moe",
        "gpt_oss": "gpt-oss",
    }.get(model.arch, model.arch)
    arch = arch_override or own
    gemma = own in ("gemma", "gemma2", "gemma3")
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    if c.get("partial_rotary_factor", 1.0) != 1.0:
        w.add_rope_dimension_count(int(c["head_dim"] * c["partial_rotary_factor"]))
    w.add_vocab_size(c["vocab_size"])
    n_experts = c.get("num_local_experts") or c.get("num_experts") or 0
    if n_experts:
        # Plain keys: the oldest gguf we allow (0.11) lacks some of these writer methods.
        w.add_uint32(f"{arch}.expert_count", n_experts)
        w.add_uint32(f"{arch}.expert_used_count", c["num_experts_per_tok"])
        if "moe_intermediate_size" in c:
            w.add_uint32(f"{arch}.expert_feed_forward_length", c["moe_intermediate_size"])
        if own == "gpt-oss":
            w.add_uint32(f"{arch}.expert_feed_forward_length", c["intermediate_size"])
        if "shared_expert_intermediate_size" in c:
            w.add_uint32(
                f"{arch}.expert_shared_feed_forward_length", c["shared_expert_intermediate_size"]
            )
    if c.get("sliding_window") and own in ("gemma2", "gemma3"):
        w.add_sliding_window(c["sliding_window"])
        if c.get("sliding_window_pattern", 6 if own == "gemma3" else 2) != (
            6 if own == "gemma3" else 2
        ):
            # A plain key: the oldest gguf we allow (0.11) has no writer method for it.
            w.add_uint32(f"{arch}.attention.sliding_window_pattern", c["sliding_window_pattern"])
    if own == "gpt-oss":
        w.add_uint32(f"{arch}.attention.sliding_window", c["sliding_window"])
    if c.get("attn_logit_softcapping"):
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
    if c.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if own in ("granite", "granitemoe"):
        # llama.cpp's keys (its converter writes them from the Hugging Face multipliers).
        for key, hf in (
            ("embedding_scale", "embedding_multiplier"),
            ("residual_scale", "residual_multiplier"),
            ("attention.scale", "attention_multiplier"),
            ("logit_scale", "logits_scaling"),
        ):
            w.add_float32(f"{arch}.{key}", c[hf])
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])
    if rs and rs.get("rope_type") == "yarn":
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", rs["factor"])
        w.add_uint32(
            f"{arch}.rope.scaling.original_context_length", rs["original_max_position_embeddings"]
        )
    if rs and rs.get("rope_type") == "longrope":
        # llama.cpp's converter: both factor sets as tensors, the original context and the
        # cos/sin factor as keys.
        w.add_uint32(
            f"{arch}.rope.scaling.original_context_length", c["original_max_position_embeddings"]
        )
        w.add_float32(f"{arch}.rope.scaling.attn_factor", rs["attention_factor"])
        for which in ("long", "short"):
            w.add_tensor(
                f"rope_factors_{which}.weight", np.asarray(rs[f"{which}_factor"], dtype=np.float32)
            )
    for key, val in (tokenizer or {}).items():
        if isinstance(val, list):
            w.add_array(key, val)
        elif isinstance(val, bool):
            w.add_bool(key, val)
        elif isinstance(val, int):
            w.add_uint32(key, val)
        else:
            w.add_string(key, val)
    permute = arch in ("llama", "mistral", "granite", "granitemoe", "smollm3")
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    qt = QT[qtype]
    names = _GGUF_POST_NORMS if own in ("gemma2", "gemma3", "olmo2", "exaone4") else _GGUF_LAYER
    if own == "gpt-oss":
        names = _GGUF_GPT_OSS
    tensors, raw = _stack_experts(model.tensors, raw, n_experts)
    for name in sorted(tensors):
        a = tensors[name]
        if name.startswith("stacked."):
            # An expert stack [n, rows, cols], quantised expert by expert.
            gname = name.removeprefix("stacked.")
            blocks = (raw or {}).get(name)
            if gname.endswith(".bias"):  # [n, rows] of biases, float32 as llama.cpp keeps them
                w.add_tensor(gname, np.ascontiguousarray(a))
                continue
            if qtype == "F32":
                w.add_tensor(gname, np.ascontiguousarray(a))
            elif blocks is None:
                blocks = np.stack(
                    [x.astype(np.float16) if qtype == "F16" else quantize(x, qt) for x in a]
                )
            if qtype == "F16":
                w.add_tensor(gname, np.ascontiguousarray(blocks))
            elif qtype != "F32":
                w.add_tensor(gname, np.ascontiguousarray(blocks), raw_dtype=qt)
            continue
        if name in _GGUF_TOP:
            gname = _GGUF_TOP[name]
        else:
            _, _, idx, rest = name.split(".", 3)
            gname = f"blk.{idx}.{names[rest]}"
        if gname.endswith("ffn_gate_inp_shexp.weight"):
            a = a.reshape(-1)  # a vector in llama.cpp ([1, hidden] in Hugging Face's)
        if gemma and name.endswith("norm.weight"):
            a = a + np.float32(1.0)  # llama.cpp's converter stores Gemma's 1 + w
        n_perm = 0
        if permute and ("q_proj" in name or "k_proj" in name):
            n_perm = heads if "q_proj" in name else kv_heads
        # llama.cpp's quantizer keeps the router in F32.
        if a.ndim == 2 and qtype != "F32" and not gname.endswith("ffn_gate_inp.weight"):
            blocks = (raw or {}).get(name)
            if blocks is None:
                blocks = a.astype(np.float16) if qtype == "F16" else quantize(a, qt)
            if n_perm:
                blocks = _permute(blocks, n_perm)
            if qtype == "F16":
                w.add_tensor(gname, np.ascontiguousarray(blocks))
            else:
                w.add_tensor(gname, np.ascontiguousarray(blocks), raw_dtype=qt)
        else:
            w.add_tensor(gname, np.ascontiguousarray(_permute(a, n_perm) if n_perm else a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _stack_experts(
    tensors: dict[str, np.ndarray], raw: dict[str, np.ndarray] | None, n: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """The experts' matrices as llama.cpp's stacks, ``stacked.blk.N.ffn_{part}_exps.weight``
    (``[n, rows, cols]``, their raw blocks stacked too); every other tensor as it was."""
    if not n:
        return tensors, raw
    out: dict[str, np.ndarray] = {}
    groups: dict[str, list[tuple[int, str]]] = {}
    for name, a in tensors.items():
        parts = name.split(".", 3)
        found = expert_of(parts[3]) if len(parts) == 4 and parts[0] == "model" else None
        kind = "weight"
        if found is None and len(parts) == 4 and parts[3].endswith(".bias"):
            # gpt-oss's expert biases: stacked as [n, rows] (never quantised).
            found = expert_of(parts[3].removesuffix(".bias") + ".weight")
            kind = "bias"
        if found is None:
            out[name] = a
            continue
        key = f"stacked.blk.{parts[2]}.ffn_{found[1]}_exps.{kind}"
        groups.setdefault(key, []).append((found[0], name))
    new_raw = dict(raw or {})
    for name in [n for n in out if n.endswith(("input_linear.weight", "output_linear.weight"))]:
        # Granite MoE's stacks: gate and up split apart (llama.cpp's converter), down as is.
        a, blocks = out.pop(name), new_raw.pop(name, None)
        layer = name.split(".")[2]
        if name.endswith("output_linear.weight"):
            out[f"stacked.blk.{layer}.ffn_down_exps.weight"] = a
            if blocks is not None:
                new_raw[f"stacked.blk.{layer}.ffn_down_exps.weight"] = blocks
            continue
        half = a.shape[1] // 2
        for part, sl in (("gate", slice(0, half)), ("up", slice(half, None))):
            out[f"stacked.blk.{layer}.ffn_{part}_exps.weight"] = np.ascontiguousarray(a[:, sl])
            if blocks is not None:
                new_raw[f"stacked.blk.{layer}.ffn_{part}_exps.weight"] = np.ascontiguousarray(
                    blocks[:, sl]
                )
    for key, members in groups.items():
        members.sort()
        assert [e for e, _ in members] == list(range(n)), key
        out[key] = np.stack([tensors[name] for _, name in members])
        if raw is not None and all(name in raw for _, name in members):
            new_raw[key] = np.stack([raw[name] for _, name in members])
    return out, new_raw if raw is not None else None


def config_from_gguf_fields(arch: str, **fields: Any) -> Any:
    """A ``LlamaConfig`` read from GGUF header fields: a small geometry (64 wide, 4 heads over
    2 KV heads of 32, 12 blocks) plus ``fields``, given without the ``{arch}.`` prefix
    (``block_count=8``; dotted keys through ``**{"attention.scale": x}``)."""
    from rlx_lm.runners.llama_config import LlamaConfig

    base: dict[str, Any] = {
        "general.architecture": arch,
        f"{arch}.embedding_length": 64,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.key_length": 32,
        f"{arch}.feed_forward_length": 128,
        f"{arch}.block_count": 12,
    }
    base.update({f"{arch}.{k}": v for k, v in fields.items()})
    return LlamaConfig.from_gguf_fields(base.get, where="t.gguf", vocab_fallback=100)
