"""Granite (scaled embeddings, residual adds, scores and logits) and SmolLM3 (every fourth
layer without RoPE): their fields from GGUF headers (llama.cpp's keys and defaults) and from
Hugging Face configs, and both formats of one model against the float64 reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llama_fixtures import check_both_formats
from model_factory import config_from_gguf_fields, make_tiny

from rlx_lm.errors import WeightFormatError
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def _gguf(arch: str, **fields: Any) -> LlamaConfig:
    cfg: LlamaConfig = config_from_gguf_fields(arch, block_count=8, **fields)
    return cfg


def test_granite_gguf_keys_and_llama_cpps_zero_means_unscaled() -> None:
    cfg = _gguf(
        "granite",
        embedding_scale=12.0,
        residual_scale=0.22,
        **{"attention.scale": 0.0078125},
        logit_scale=8.0,
    )
    assert (cfg.embed_scale, cfg.residual_scale, cfg.logit_scale) == (12.0, 0.22, 8.0)
    assert cfg.score_scale() == 0.0078125
    plain = _gguf("granite", residual_scale=0.0)  # absent or 0: not scaled, as llama.cpp
    assert (plain.embed_scale, plain.residual_scale, plain.logit_scale) == (1.0, 1.0, 1.0)
    assert plain.score_scale() == pytest.approx(32**-0.5)  # 1/sqrt(head_dim)


def test_granite_hf_multipliers() -> None:
    cfg = LlamaConfig.from_hf(make_tiny("granite").config)
    assert cfg.arch == "granite"
    assert (cfg.embed_scale, cfg.residual_scale, cfg.score_scale(), cfg.logit_scale) == (
        6.0,
        0.4,
        0.2,
        3.0,
    )
    with pytest.raises(WeightFormatError, match="logit_scale must be positive"):
        LlamaConfig.from_hf(make_tiny("granite").config | {"logits_scaling": 0.0})


def test_smollm3_nope_layers_from_gguf_and_hf() -> None:
    # GGUF: llama.cpp's fixed step of 4 (layers 3 and 7 of 8 have no RoPE).
    want = tuple(i in (3, 7) for i in range(8))
    assert _gguf("smollm3").nope_layers == want
    assert [i for i in range(8) if not _gguf("smollm3").rotates(i)] == [3, 7]
    hf = make_tiny("smollm3", layers=8).config
    assert LlamaConfig.from_hf(hf).nope_layers == want
    # An explicit list wins (1: RoPE); without one, no_rope_layer_interval.
    flags = [1, 0, 1, 1, 1, 1, 0, 1]
    got = LlamaConfig.from_hf(hf | {"no_rope_layers": flags}).nope_layers
    assert got == tuple(f == 0 for f in flags)
    del hf["no_rope_layers"]
    assert LlamaConfig.from_hf(hf | {"no_rope_layer_interval": 2}).nope_layers == tuple(
        i % 2 == 1 for i in range(8)
    )
    with pytest.raises(WeightFormatError, match="no_rope_layers has 3 entries for 8 layers"):
        LlamaConfig.from_hf(hf | {"no_rope_layers": [1, 1, 0]})


@pytest.mark.parametrize("arch", ["granite", "smollm3"])
def test_both_formats_of_one_model_give_the_reference(tmp_path: Path, arch: str) -> None:
    m = make_tiny(arch, seed=9, hidden=64, inter=96, layers=4)
    assert LlamaConfig.from_hf(m.config).arch == arch
    check_both_formats(m, tmp_path, IDS)
