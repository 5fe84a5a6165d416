"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, Granite MoE, OLMoE): their fields from
GGUF headers (llama.cpp's keys) and Hugging Face configs, both formats of one model against
the float64 reference (every position, prefill and decode, quantised experts) and the
refusals (batched decode: tests/test_engine.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf_edit import set_u32
from llama_fixtures import check_both_formats
from llama_reference import reference_logits
from model_factory import (
    config_from_gguf_fields,
    make_tiny,
    quantize_model,
    write_gguf,
    write_safetensors_dir,
)

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]
MOE = ["qwen3moe", "qwen2moe", "mixtral", "granitemoe", "olmoe"]


def _gguf(arch: str, **fields: Any) -> LlamaConfig:
    cfg: LlamaConfig = config_from_gguf_fields(arch, block_count=4, **fields)
    return cfg


def test_gguf_expert_keys_and_llama_cpps_weight_normalisation() -> None:
    q3 = _gguf("qwen3moe", expert_count=128, expert_used_count=8, expert_feed_forward_length=768)
    assert (q3.n_experts, q3.n_experts_used, q3.expert_ff, q3.experts_norm) == (128, 8, 768, True)
    assert q3.qk_norm
    assert q3.shared_expert_ff == 0
    q2 = _gguf(
        "qwen2moe",
        expert_count=60,
        expert_used_count=4,
        expert_feed_forward_length=1408,
        expert_shared_feed_forward_length=5632,
    )
    assert (q2.n_experts, q2.expert_ff, q2.shared_expert_ff) == (60, 1408, 5632)
    assert q2.attention_bias
    assert not q2.experts_norm
    # Mixtral: llama with experts as wide as feed_forward_length, weights renormalised.
    # Granite MoE: Granite's multipliers, experts feed_forward_length wide, renormalised.
    gm = _gguf("granitemoe", expert_count=32, expert_used_count=8, residual_scale=0.22)
    assert (gm.n_experts, gm.expert_ff, gm.experts_norm, gm.residual_scale) == (32, 128, True, 0.22)
    # OLMoE: experts feed_forward_length wide, not renormalised, q/k normed whole.
    om = _gguf("olmoe", expert_count=64, expert_used_count=8)
    assert (om.n_experts, om.expert_ff, om.experts_norm, om.qk_norm_full) == (64, 128, False, True)
    mx = _gguf("llama", expert_count=8, expert_used_count=2)
    assert (mx.arch, mx.n_experts, mx.expert_ff, mx.experts_norm) == ("llama", 8, 128, True)
    assert _gguf("llama").n_experts == 0


@pytest.mark.parametrize(
    ("arch", "fields", "error", "match"),
    [
        ("qwen3moe", {}, WeightFormatError, "lacks qwen3moe.expert_count"),
        ("qwen3moe", {"expert_count": 4}, WeightFormatError, "expert_used_count"),
        (
            "qwen3moe",
            {"expert_count": 4, "expert_used_count": 5, "expert_feed_forward_length": 8},
            WeightFormatError,
            "n_experts_used must be 1 to n_experts=4",
        ),
        (
            "qwen3moe",
            {"expert_count": 513, "expert_used_count": 2, "expert_feed_forward_length": 8},
            WeightFormatError,
            "n_experts must be 1 to 512",
        ),
        ("gemma2", {"expert_count": 4}, UnsupportedError, "mixture of experts is not supported"),
        (
            "granitemoe",
            {"expert_count": 4, "expert_used_count": 2, "expert_shared_feed_forward_length": 64},
            UnsupportedError,
            "shared expert",
        ),
    ],
)
def test_bad_expert_fields_are_refused_by_name(
    arch: str, fields: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _gguf(arch, **fields)


def test_hf_expert_fields() -> None:
    q3 = LlamaConfig.from_hf(make_tiny("qwen3moe", experts=6, used=3).config)
    assert (q3.arch, q3.n_experts, q3.n_experts_used, q3.expert_ff) == ("qwen3moe", 6, 3, 64)
    assert q3.experts_norm
    assert q3.qk_norm
    q2 = LlamaConfig.from_hf(make_tiny("qwen2moe", inter=96).config)
    assert (q2.arch, q2.shared_expert_ff, q2.experts_norm) == ("qwen2moe", 96, False)
    om = LlamaConfig.from_hf(make_tiny("olmoe").config)
    assert (om.arch, om.n_experts, om.expert_ff, om.experts_norm) == ("olmoe", 4, 64, False)
    gm = LlamaConfig.from_hf(make_tiny("granitemoe").config)
    assert (gm.arch, gm.n_experts, gm.expert_ff, gm.experts_norm) == ("granitemoe", 4, 64, True)
    assert gm.residual_scale == 0.4  # Granite's multipliers too
    mx = LlamaConfig.from_hf(make_tiny("mixtral").config)
    assert (mx.arch, mx.n_experts, mx.expert_ff, mx.experts_norm) == ("mistral", 4, 64, True)
    # Dense layers among the experts are another design: refused, not run wrong.
    cfg = make_tiny("qwen3moe").config
    with pytest.raises(UnsupportedError, match="decoder_sparse_step=2"):
        LlamaConfig.from_hf(cfg | {"decoder_sparse_step": 2})
    with pytest.raises(UnsupportedError, match="mlp_only_layers"):
        LlamaConfig.from_hf(cfg | {"mlp_only_layers": [0]})


def _picks(m: Any) -> set[tuple[int, ...]]:
    """The experts layer 0 picks at each position of IDS (from the float64 reference's
    router), to show the test model routes tokens differently."""
    c = m.config
    router = {
        "mixtral": "block_sparse_moe.gate",
        "granitemoe": "block_sparse_moe.router.layer",
    }.get(c["model_type"], "mlp.gate")
    x = m.tensors["model.embed_tokens.weight"][IDS].astype(np.float64)
    w = m.tensors["model.layers.0.post_attention_layernorm.weight"]
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + c["rms_norm_eps"]) * w
    z = h @ m.tensors[f"model.layers.0.{router}.weight"].T
    return {tuple(sorted(np.argsort(-row)[: c["num_experts_per_tok"]])) for row in z}


@pytest.mark.parametrize("arch", MOE)
def test_both_formats_of_one_model_give_the_reference(tmp_path: Path, arch: str) -> None:
    m = make_tiny(arch, seed=9, hidden=64, inter=96, layers=3)
    assert len(_picks(m)) >= 3, "the tokens should not all pick the same experts"
    assert LlamaConfig.from_hf(m.config).n_experts == 4
    check_both_formats(m, tmp_path, IDS)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "F16"])
@pytest.mark.parametrize("arch", ["qwen3moe", "mixtral", "granitemoe"])
def test_quantised_experts_match_the_reference_on_their_dequantised_weights(
    tmp_path: Path, arch: str, qtype: str
) -> None:
    # Stacked [n, rows, cols] expert tensors, multiplied as stored (no dequantised copy).
    m = make_tiny(arch, seed=4, hidden=64, inter=96, layers=2)
    q, raw = quantize_model(m, qtype)
    path = write_gguf(q, tmp_path / "m.gguf", qtype=qtype, raw=raw)
    runner = load_llama(path, max_seq=32)
    assert runner.cfg.n_experts == 4
    want = reference_logits(q.config, q.tensors, IDS)
    got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_a_missing_expert_is_named(tmp_path: Path) -> None:
    m = make_tiny("mixtral", seed=1, hidden=64, layers=2)
    d = tmp_path / "st"
    del m.tensors["model.layers.1.block_sparse_moe.experts.2.w2.weight"]
    write_safetensors_dir(m, d)
    with pytest.raises(WeightFormatError, match=r"blk\.1\.ffn_down\.2\.weight"):
        load_llama(d)


def test_a_header_that_miscounts_the_experts_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    m = make_tiny("qwen3moe", seed=1, hidden=64, layers=2, experts=4)
    path = write_gguf(m, tmp_path / "m.gguf")
    set_u32(path, "qwen3moe.expert_count", 3)  # the stacks hold 4
    with pytest.raises(WeightFormatError, match=r"blk\.0\.ffn_gate_inp\.weight.*\(3, 64\)"):
        load_llama(path)
    set_u32(path, "qwen3moe.expert_count", 4)
    set_u32(path, "qwen3moe.expert_feed_forward_length", 32)  # the experts are 64 wide
    with pytest.raises(WeightFormatError, match=r"blk\.0\.ffn_gate_exps\.weight.*\[4, 32, 64\]"):
        load_llama(path)
