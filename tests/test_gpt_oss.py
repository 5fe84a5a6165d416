"""gpt-oss (GGUF ``gpt-oss``, llama.cpp's conversion of OpenAI's open-weight MoE): the Llama
block with biases on q, k, v and the output, a sink logit a head in the softmax, every other
layer windowed, YaRN, and a mixture whose router and experts have biases, whose weights are the
softmax of the picked logits and whose gate is clamped; the engine against the float64
reference, cached decode included, on float and quantised files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from llama_reference import reference_logits
from model_factory import (
    TinyModel,
    config_from_gguf_fields,
    make_tiny,
    quantize_model,
    write_gguf,
)

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17, 30, 31, 90, 6, 6, 8, 11, 120]


def _tiny(seed: int = 4) -> TinyModel:
    return make_tiny("gpt-oss", seed=seed, hidden=64, heads=4, kv_heads=2, layers=3)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0"])
def test_engine_matches_the_reference_at_every_position_and_by_decode(
    tmp_path: Path, qtype: str
) -> None:
    m = _tiny()
    qm, raw = quantize_model(m, qtype) if qtype != "F32" else (m, {})
    path = write_gguf(qm, tmp_path / f"oss-{qtype}.gguf", qtype=qtype, raw=raw)
    want = reference_logits(qm.config, qm.tensors, IDS)
    runner = load_llama(path, max_seq=32)
    assert runner.cfg.arch == "gpt-oss"
    assert runner.dequantised_tensors == {}
    tol = 3e-5 * np.abs(want).max() + 1e-5
    got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    runner.prefill_logits(IDS[:3])
    steps = np.stack([runner.decode_logits(t) for t in IDS[3:]])
    np.testing.assert_allclose(steps, want[3:], rtol=0, atol=tol)


def test_each_piece_changes_the_logits(tmp_path: Path) -> None:
    """The reference without each of gpt-oss's pieces differs from it by far more than the
    engine's tolerance: the test above would catch the engine leaving any one out."""
    m = _tiny()
    want = reference_logits(m.config, m.tensors, IDS)
    far = 1e-2 * np.abs(want).max()
    t = m.tensors
    variants = {
        "sinks": {k: v for k, v in t.items() if not k.endswith("self_attn.sinks")},
        "output bias": {k: v for k, v in t.items() if not k.endswith("o_proj.bias")},
        "router bias": {
            k: (np.zeros_like(v) if k.endswith("router.bias") else v) for k, v in t.items()
        },
    }
    for what, tensors in variants.items():
        other = reference_logits(m.config, tensors, IDS)
        assert np.abs(other - want).max() > far, what
    no_window = m.config | {"layer_types": ["full_attention"] * 3}
    assert np.abs(reference_logits(no_window, t, IDS) - want).max() > far, "window"
    plain_rope = m.config | {"rope_scaling": None}
    assert np.abs(reference_logits(plain_rope, t, IDS) - want).max() > far, "yarn"


def test_the_gguf_header_maps_to_the_config() -> None:
    cfg = config_from_gguf_fields(
        "gpt-oss",
        expert_count=32,
        expert_used_count=4,
        expert_feed_forward_length=2880,
        **{
            "attention.sliding_window": 128,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 32.0,
            "rope.scaling.original_context_length": 4096,
        },
    )
    assert cfg.arch == "gpt-oss"
    assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_ff) == (32, 4, 2880)
    assert cfg.expert_gating == "softmax_picked"
    assert cfg.expert_biases
    assert not cfg.experts_norm
    assert cfg.o_bias
    assert cfg.attn_sinks
    assert cfg.oai_glu
    assert cfg.attention_bias
    assert cfg.sliding_window == 128
    assert cfg.window_layers == tuple(i % 2 == 0 for i in range(cfg.n_layers))
    assert cfg.rope_mscale == pytest.approx(1 + 0.1 * math.log(32))
    inv = cfg.inv_freq()
    plain = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    # High frequencies kept, low ones divided by the factor, a blend between.
    assert inv[0] == plain[0]
    assert inv[-1] == pytest.approx(plain[-1] / 32)
    assert np.all(inv <= plain)
    assert np.all(inv >= plain / 32 * (1 - 1e-12))
    with pytest.raises(WeightFormatError, match="sliding_window"):
        config_from_gguf_fields("gpt-oss", expert_count=4, expert_used_count=2)
    # llama.cpp's routing keys: the one each architecture routes by, or none, is accepted.
    oss = {"attention.sliding_window": 128}
    keys = {"expert_count": 4, "expert_used_count": 2}
    assert config_from_gguf_fields("gpt-oss", expert_gating_func=3, **keys, **oss).n_experts == 4
    assert config_from_gguf_fields("qwen3moe", expert_gating_func=1, **keys).n_experts == 4
    with pytest.raises(UnsupportedError, match="expert_gating_func=2"):
        config_from_gguf_fields("qwen3moe", expert_gating_func=2, **keys)
    with pytest.raises(UnsupportedError, match="expert_weights_scale"):
        config_from_gguf_fields("qwen3moe", expert_weights_scale=2.5, **keys)


def test_yarn_in_another_architecture_is_applied_not_ignored() -> None:
    """A Qwen GGUF with YaRN in its header (as llama.cpp's converter writes long-context
    Qwen models) gets YaRN's frequencies and cos/sin factor; before, they were ignored."""
    keys = {
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 32768,
    }
    cfg = config_from_gguf_fields("qwen2", **keys)
    assert cfg.rope_scaling is not None
    assert cfg.rope_scaling.kind == "yarn"
    assert cfg.rope_mscale == pytest.approx(1 + 0.1 * math.log(4))
    with pytest.raises(WeightFormatError, match="YaRN"):
        config_from_gguf_fields("qwen2", **{"rope.scaling.type": "yarn"})
    with pytest.raises(UnsupportedError, match=r"rope\.scaling\.type"):
        config_from_gguf_fields("qwen2", **{"rope.scaling.type": "mystery"})


def test_hugging_face_checkpoints_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedError, match="gpt-oss runs from GGUF"):
        LlamaConfig.from_hf({"model_type": "gpt_oss"})


@pytest.mark.parametrize(
    ("dropped", "named"),
    [
        ("model.layers.1.self_attn.sinks", "blk.1.attn_sinks.weight"),
        ("model.layers.0.self_attn.o_proj.bias", "blk.0.attn_output.bias"),
        ("model.layers.2.mlp.router.bias", "blk.2.ffn_gate_inp.bias"),
    ],
)
def test_a_file_without_one_of_its_pieces_is_refused_naming_it(
    tmp_path: Path, dropped: str, named: str
) -> None:
    m = _tiny()
    del m.tensors[dropped]
    path = write_gguf(m, tmp_path / "short.gguf")
    with pytest.raises(WeightFormatError, match=named.replace(".", r"\.")):
        load_llama(path, max_seq=16)
