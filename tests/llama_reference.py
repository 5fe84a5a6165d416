"""A plain, obvious numpy Llama/Mistral/Qwen2/Qwen3/Gemma 1-3/Phi-3/Granite/SmolLM3, and the
mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE, written from the Hugging Face definition.

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


def _apply_rope_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """ERNIE 4.5's rotation: element pairs ``(2i, 2i + 1)`` turned by angle ``i``."""
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = b * c + a * s
    return out


def _apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Hugging Face's rotation of the first ``cos.shape[-1]`` elements; the rest pass (Phi-3's
    ``partial_rotary_factor``)."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return np.concatenate([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], axis=-1)


def _silu_mlp(w: dict[str, np.ndarray], gate: str, up: str, down: str, h: np.ndarray) -> np.ndarray:
    g = h @ w[gate].T
    return (g / (1 + np.exp(-g)) * (h @ w[up].T)) @ w[down].T


def _moe(config: dict[str, Any], w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    """Hugging Face's sparse MoE block: softmax over the router's logits, the top
    ``num_experts_per_tok`` experts (renormalised: Mixtral always, the Qwen MoEs with
    ``norm_topk_prob``), their SwiGLU MLPs summed by weight; Qwen2-MoE adds its shared expert
    times ``sigmoid(h . shared_expert_gate)``."""
    mixtral = config["model_type"] == "mixtral"
    granite = config["model_type"] == "granitemoe"
    pre = p + ("block_sparse_moe." if mixtral or granite else "mlp.")
    k = config["num_experts_per_tok"]
    # Granite MoE takes the softmax of the top k logits: the renormalised weights again.
    norm = mixtral or granite or config.get("norm_topk_prob", False)
    logits = h @ w[pre + ("router.layer.weight" if granite else "gate.weight")].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for r in range(h.shape[0]):
        top = np.argsort(-probs[r], kind="stable")[:k]
        weights = probs[r, top] / (probs[r, top].sum() if norm else 1.0)
        for e, wt in zip(top, weights, strict=True):
            if granite:
                gate, up = np.split(h[r] @ w[pre + "input_linear.weight"][e].T, 2)
                act = gate / (1 + np.exp(-gate)) * up
                out[r] += wt * (act @ w[pre + "output_linear.weight"][e].T)
                continue
            x = pre + f"experts.{e}."
            parts = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            names = [x + f"{q}.weight" for q in parts]
            out[r] += wt * _silu_mlp(w, *names, h[r : r + 1])[0]
    if pre + "shared_expert_gate.weight" in w:
        s = pre + "shared_expert."
        shared = _silu_mlp(
            w, s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight", h
        )
        gate = 1 / (1 + np.exp(-(h @ w[pre + "shared_expert_gate.weight"].T)))
        out += gate * shared
    return out


def _oss_moe(config: dict[str, Any], w: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    """gpt-oss's MoE block (Hugging Face's GptOssMLP): router logits with a bias, the top
    ``num_experts_per_tok`` of them, the softmax of those as weights; each expert's gate and up
    with biases, the gate clamped above at 7 and the up value to [-7, 7],
    ``gate * sigmoid(1.702 gate) * (up + 1)``, then down with its bias."""
    k = config["num_experts_per_tok"]
    logits = h @ w[p + "mlp.router.weight"].T + w[p + "mlp.router.bias"]
    out = np.zeros_like(h)
    for r in range(h.shape[0]):
        top = np.argsort(-logits[r], kind="stable")[:k]
        z = np.exp(logits[r, top] - logits[r, top].max())
        for e, wt in zip(top, z / z.sum(), strict=True):
            x = p + f"mlp.experts.{e}."
            gate = np.minimum(h[r] @ w[x + "gate_proj.weight"].T + w[x + "gate_proj.bias"], 7.0)
            up = np.clip(h[r] @ w[x + "up_proj.weight"].T + w[x + "up_proj.bias"], -7.0, 7.0)
            act = gate / (1 + np.exp(-1.702 * gate)) * (up + 1)
            out[r] += wt * (act @ w[x + "down_proj.weight"].T + w[x + "down_proj.bias"])
    return out


def _yarn(config: dict[str, Any], rd: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Hugging Face's YaRN (``_compute_yarn_parameters``): frequencies kept above the band of
    dimensions where the original context turns ``beta_fast`` to ``beta_slow`` times, divided
    by ``factor`` below it, a linear ramp across; cos and sin times ``0.1 ln(factor) + 1``."""
    rs = config["rope_scaling"]
    base, factor = config["rope_theta"], rs["factor"]
    orig = rs["original_max_position_embeddings"]

    def dim(rot: float) -> float:
        return rd * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(base))

    low, high = dim(rs.get("beta_fast", 32)), dim(rs.get("beta_slow", 1))
    if rs.get("truncate", True):
        low, high = max(np.floor(low), 0), min(np.ceil(high), rd - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (np.arange(0, rd, 2) / rd)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = np.clip((np.arange(rd // 2) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv_freq = interpolation * (1 - extra) + extrapolation * extra
    mscale = rs.get("attention_factor") or 0.1 * np.log(factor) + 1.0
    freqs = np.outer(np.arange(seq), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb) * mscale, np.sin(emb) * mscale


def reference_logits(
    config: dict[str, Any], t: dict[str, np.ndarray], ids: list[int], *, context: int | None = None
) -> np.ndarray:
    """Logits ``[len(ids), vocab]`` of every position. ``context`` (default: the trained one)
    picks LongRoPE's factor set: the long one past ``original_max_position_embeddings``."""
    arch = config["model_type"]
    gemma = arch in ("gemma", "gemma2", "gemma3_text")
    post_norms = arch in ("gemma2", "gemma3_text", "olmo2", "exaone4")
    no_pre = arch in ("olmo2", "exaone4")
    # OLMo 2, OLMoE: q and k normed over the whole projection; OLMo 2: no norm before
    # attention or the MLP, only after them.
    full_qk = arch in ("olmo2", "olmoe")
    # Gemma's RMSNorm multiplies by 1 + w.
    w = {
        k: v.astype(np.float64) + (1.0 if gemma and k.endswith("norm.weight") else 0.0)
        for k, v in t.items()
    }
    n_layers = config["num_hidden_layers"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config["head_dim"]
    eps = config["rms_norm_eps"]
    seq = len(ids)

    rd = int(hd * config.get("partial_rotary_factor", 1.0))  # rotated elements of a head

    def rope_tables(theta: float, factor: float) -> tuple[np.ndarray, np.ndarray]:
        inv_freq = 1.0 / theta ** (np.arange(0, rd, 2) / rd) / factor
        freqs = np.outer(np.arange(seq), inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb), np.sin(emb)

    rs = config.get("rope_scaling") or {}
    factor = rs["factor"] if rs.get("rope_type") == "linear" else 1.0
    global_rope = rope_tables(config["rope_theta"], factor)
    if rs.get("rope_type") == "longrope":
        # Frequencies divided by the chosen factor set; cos and sin times attention_factor.
        trained = config["max_position_embeddings"]
        use_long = (context or trained) > config["original_max_position_embeddings"]
        ext = np.asarray(rs["long_factor" if use_long else "short_factor"], dtype=np.float64)
        inv_freq = 1.0 / (ext * config["rope_theta"] ** (np.arange(0, rd, 2) / rd))
        freqs = np.outer(np.arange(seq), inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        a = rs["attention_factor"]
        global_rope = (np.cos(emb) * a, np.sin(emb) * a)
    if rs.get("rope_type") == "yarn":
        global_rope = _yarn(config, rd, seq)
    local_rope = rope_tables(config.get("rope_local_base_freq", config["rope_theta"]), 1.0)

    x = w["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * np.sqrt(config["hidden_size"])
    # Granite's multipliers (1 elsewhere).
    x = x * config.get("embedding_multiplier", 1.0)
    rm = config.get("residual_multiplier", 1.0)
    # SmolLM3: no_rope_layers[i] is 1 where layer i uses RoPE.
    nope = config.get("no_rope_layers") or [1] * n_layers
    causal = np.triu(np.full((seq, seq), -np.inf), k=1)
    window = (
        config.get("sliding_window")
        if arch in ("mistral", "gemma2", "gemma3_text", "exaone4", "gpt_oss")
        else None
    )
    # EXAONE 4 and gpt-oss: layer_types picks the windowed layers (in EXAONE 4, only they
    # apply RoPE).
    types = config.get("layer_types") if arch in ("exaone4", "gpt_oss") else None
    period = {"gemma2": 2, "gemma3_text": config.get("sliding_window_pattern", 6)}.get(arch, 1)
    scaling = config.get("attention_multiplier", config.get("query_pre_attn_scalar", hd) ** -0.5)
    cap = config.get("attn_logit_softcapping")
    for i in range(n_layers):
        p = f"model.layers.{i}."
        # Gemma 2/3: the layers with i % period < period - 1 are windowed (and in Gemma 3
        # use the local RoPE base); the others see everything.
        windowed = window is not None and (period == 1 or i % period < period - 1)
        if types is not None:
            windowed = types[i] == "sliding_attention"
        mask = causal
        if windowed:
            # query i attends to keys i-window+1 .. i
            mask = causal + np.tril(np.full((seq, seq), -np.inf), k=-window)
        cos, sin = local_rope if windowed and arch == "gemma3_text" else global_rope
        h = x if no_pre else _rms(x, w[p + "input_layernorm.weight"], eps)
        if p + "self_attn.qkv_proj.weight" in w:  # Phi-3: one matrix, rows q | k | v
            q, k, v = np.split(
                h @ w[p + "self_attn.qkv_proj.weight"].T, [nh * hd, (nh + nkv) * hd], axis=-1
            )
        else:
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        if full_qk:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q.reshape(seq, nh, hd).transpose(1, 0, 2)
        k = k.reshape(seq, nkv, hd).transpose(1, 0, 2)
        v = v.reshape(seq, nkv, hd).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in w and not full_qk:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        if nope[i] and (arch != "exaone4" or types is None or windowed):
            rot = _apply_rope_pairs if arch == "ernie4_5" else _apply_rope
            q = rot(q, cos, sin)
            k = rot(k, cos, sin)
        k = np.repeat(k, nh // nkv, axis=0)
        v = np.repeat(v, nh // nkv, axis=0)
        scores = q @ k.transpose(0, 2, 1) * scaling
        if cap:
            scores = np.tanh(scores / cap) * cap
        scores = scores + mask
        if p + "self_attn.sinks" in w:
            # gpt-oss: one more logit a head in the softmax, dropped after it.
            sink = np.broadcast_to(w[p + "self_attn.sinks"][:, None, None], (nh, seq, 1))
            scores = np.concatenate([scores, sink], axis=-1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        probs = probs[..., :seq]
        attn = (probs @ v).transpose(1, 0, 2).reshape(seq, nh * hd)
        o = attn @ w[p + "self_attn.o_proj.weight"].T * rm
        if p + "self_attn.o_proj.bias" in w:
            o = o + w[p + "self_attn.o_proj.bias"]
        if post_norms:
            o = _rms(o, w[p + "post_attention_layernorm.weight"], eps)
            h = x + o
            if not no_pre:
                h = _rms(h, w[p + "pre_feedforward_layernorm.weight"], eps)
        else:
            h = _rms(x + o, w[p + "post_attention_layernorm.weight"], eps)
        x = x + o
        if p + "mlp.router.weight" in w:
            x = x + _oss_moe(config, w, p, h)
            continue
        if any(
            p + n in w
            for n in (
                "mlp.gate.weight",
                "block_sparse_moe.gate.weight",
                "block_sparse_moe.router.layer.weight",
            )
        ):
            x = x + _moe(config, w, p, h) * rm
            continue
        if p + "mlp.gate_up_proj.weight" in w:  # Phi-3: one matrix, rows gate | up
            gate, up = np.split(h @ w[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
        else:
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
        if gemma:
            # GELU, tanh form (gelu_pytorch_tanh)
            inner = np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)
            act = 0.5 * gate * (1 + np.tanh(inner))
        else:
            act = gate / (1 + np.exp(-gate))
        mlp = (act * up) @ w[p + "mlp.down_proj.weight"].T * rm
        if post_norms:
            mlp = _rms(mlp, w[p + "post_feedforward_layernorm.weight"], eps)
        x = x + mlp
    x = _rms(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = x @ head.T / config.get("logits_scaling", 1.0)
    final_cap = config.get("final_logit_softcapping")
    if final_cap:
        logits = np.tanh(logits / final_cap) * final_cap
    return logits
