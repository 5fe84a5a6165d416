"""A plain, obvious numpy Llama/Mistral/Qwen2/Qwen3 written from the Hugging Face definition.

Float64, the whole sequence at once, no cache, weights under HF names: the thing the runner's
logits are checked against. Deliberately shares no code with ``rlx_lm.runners``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def reference_logits(
    config: dict[str, Any], t: dict[str, np.ndarray], ids: list[int]
) -> np.ndarray:
    """Logits ``[len(ids), vocab]`` of every position."""
    w = {k: v.astype(np.float64) for k, v in t.items()}
    n_layers = config["num_hidden_layers"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config["head_dim"]
    eps = config["rms_norm_eps"]
    seq = len(ids)

    inv_freq = 1.0 / config["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    freqs = np.outer(np.arange(seq), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)

    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((seq, seq), -np.inf), k=1)
    window = config.get("sliding_window") if config["model_type"] == "mistral" else None
    if window:
        # query i attends to keys i-window+1 .. i
        mask += np.tril(np.full((seq, seq), -np.inf), k=-window)
    for i in range(n_layers):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.reshape(seq, nh, hd).transpose(1, 0, 2)
        k = k.reshape(seq, nkv, hd).transpose(1, 0, 2)
        v = v.reshape(seq, nkv, hd).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in w:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = np.repeat(k, nh // nkv, axis=0)
        v = np.repeat(v, nh // nkv, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v).transpose(1, 0, 2).reshape(seq, nh * hd)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T
