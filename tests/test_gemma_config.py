"""Gemma's hyper-parameters from GGUF headers and Hugging Face configs: llama.cpp's defaults
where a header leaves a key out, its window patterns, the 27B score scale, Gemma 3's local
RoPE, and Hugging Face's spellings (``gemma3_text``, ``layer_types``, ``w - 1`` norms)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_reference import reference_logits
from model_factory import config_from_gguf_fields, make_tiny, write_gguf, write_safetensors_dir

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def _gguf(arch: str, **fields: Any) -> LlamaConfig:
    """A config read from GGUF fields (model_factory's small geometry) plus ``fields``."""
    cfg: LlamaConfig = config_from_gguf_fields(arch, **fields)
    return cfg


def test_gemma2_gguf_takes_llama_cpps_defaults() -> None:
    cfg = _gguf("gemma2")
    assert cfg.sliding_window == 4096
    assert cfg.attn_softcap == 50.0
    assert cfg.final_softcap == 30.0
    assert cfg.window_layers == tuple(i % 2 == 0 for i in range(12))
    assert cfg.embed_scale == pytest.approx(8.0)
    assert cfg.score_scale() == pytest.approx(1 / math.sqrt(32))  # the head size, not 64/4
    assert cfg.gelu
    assert cfg.post_norms
    assert not cfg.qk_norm
    cfg = _gguf(
        "gemma2",
        **{
            "attention.sliding_window": 16,
            "attn_logit_softcapping": 20.0,
            "final_logit_softcapping": 10.0,
        },
    )
    assert (cfg.sliding_window, cfg.attn_softcap, cfg.final_softcap) == (16, 20.0, 10.0)


def test_the_27b_models_scale_scores_by_hidden_over_heads() -> None:
    # llama.cpp tells the 27B models by their block count (46 for Gemma 2, 62 for Gemma 3).
    cfg = _gguf("gemma2", block_count=46)
    assert cfg.score_scale() == pytest.approx(1 / math.sqrt(64 / 4))
    cfg = _gguf("gemma3", block_count=62, **{"attention.sliding_window": 1024})
    assert cfg.score_scale() == pytest.approx(1 / math.sqrt(64 / 4))


def test_gemma3_gguf_windows_five_layers_of_six_with_their_own_rope() -> None:
    with pytest.raises(WeightFormatError, match="sliding_window"):
        _gguf("gemma3")
    cfg = _gguf(
        "gemma3",
        **{
            "attention.sliding_window": 512,
            "rope.freq_base": 1e6,
            "rope.scaling.type": "linear",
            "rope.scaling.factor": 8.0,
        },
    )
    assert [i for i in range(12) if cfg.window_of(i) is None] == [5, 11]
    assert cfg.qk_norm
    assert cfg.post_norms
    assert cfg.attn_softcap is None
    local = cfg.local_inv_freq()
    assert local is not None
    np.testing.assert_allclose(local, 1.0 / 10000.0 ** (np.arange(0, 32, 2) / 32))
    assert cfg.position_scale() == 8.0  # the global layers' linear scaling
    assert (
        _gguf(
            "gemma3", **{"attention.sliding_window": 8, "rope.freq_base_swa": 500.0}
        ).rope_local_theta
        == 500.0
    )


def test_a_window_pattern_key_overrides_the_fixed_one() -> None:
    cfg = _gguf("gemma3", **{"attention.sliding_window": 8, "attention.sliding_window_pattern": 3})
    assert cfg.window_layers == tuple(i % 3 < 2 for i in range(12))
    flags = [True, False] * 6
    cfg = _gguf(
        "gemma3",
        **{"attention.sliding_window": 8, "attention.sliding_window_pattern": np.array(flags)},
    )
    assert cfg.window_layers == tuple(flags)
    with pytest.raises(WeightFormatError, match="11 flags for 12 layers"):
        _gguf(
            "gemma3",
            **{"attention.sliding_window": 8, "attention.sliding_window_pattern": flags[:11]},
        )
    with pytest.raises(WeightFormatError, match="must be positive"):
        _gguf("gemma2", **{"attention.sliding_window_pattern": 0})


def test_hugging_face_gemma_configs() -> None:
    base = make_tiny("gemma3", layers=6).config
    assert base["model_type"] == "gemma3_text"
    cfg = LlamaConfig.from_hf(base)
    assert cfg.arch == "gemma3"
    assert cfg.tie_word_embeddings is False
    assert cfg.window_layers == (True, False) * 3  # sliding_window_pattern 2
    types = ["sliding_attention"] * 5 + ["full_attention"]
    cfg = LlamaConfig.from_hf(
        {k: v for k, v in base.items() if k != "sliding_window_pattern"} | {"layer_types": types}
    )
    assert cfg.window_layers == (True,) * 5 + (False,)
    cfg = LlamaConfig.from_hf(base | {"query_pre_attn_scalar": 144})
    assert cfg.score_scale() == pytest.approx(144**-0.5)
    with pytest.raises(WeightFormatError, match="layer_types has 2 entries"):
        LlamaConfig.from_hf(base | {"layer_types": types[:2]})
    with pytest.raises(UnsupportedError, match="hidden_activation 'relu'"):
        LlamaConfig.from_hf(base | {"hidden_activation": "relu"})
    gemma2 = make_tiny("gemma2").config
    cfg = LlamaConfig.from_hf(
        {k: v for k, v in gemma2.items() if k != "model_type"}
        | {"architectures": ["Gemma2ForCausalLM"]}
    )
    assert cfg.arch == "gemma2"
    assert cfg.attn_softcap == 4.0
    assert cfg.final_softcap == 6.0
    with pytest.raises(WeightFormatError, match="needs 'sliding_window'"):
        LlamaConfig.from_hf({k: v for k, v in gemma2.items() if k != "sliding_window"})
    gemma = make_tiny("gemma").config
    del gemma["tie_word_embeddings"]
    assert LlamaConfig.from_hf(gemma).tie_word_embeddings  # Gemma always ties by default


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3"])
def test_a_gemma_checkpoint_loads_from_safetensors_and_gguf_alike(
    tmp_path: Path, arch: str
) -> None:
    # Hugging Face stores Gemma's norms as w - 1, the GGUF converter as w: both loaders must
    # end with the same numbers, which the float64 reference (HF conventions) defines.
    m = make_tiny(arch, seed=2, hidden=64, inter=128, tie=True, layers=4)
    want = reference_logits(m.config, m.tensors, IDS)
    for path in (write_safetensors_dir(m, tmp_path / "st"), write_gguf(m, tmp_path / "m.gguf")):
        runner = load_llama(path, max_seq=32)
        got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)


def test_every_gemma_feature_moves_the_logits() -> None:
    # The reference and the engine agree above; here each feature is shown to matter on these
    # models, so that agreement is not agreement on a no-op.
    m = make_tiny("gemma3", seed=2, hidden=64, inter=128, tie=True, layers=4)
    want = reference_logits(m.config, m.tensors, IDS)
    for change in (
        {"sliding_window": 100},  # the window never bites
        {"rope_local_base_freq": 1e6},
        {"rope_scaling": None},
        {"query_pre_attn_scalar": 64},
        {"attn_logit_softcapping": 1.0},
    ):
        moved = reference_logits(m.config | change, m.tensors, IDS)
        assert np.abs(moved - want).max() > 1e-3, change
