"""YaRN RoPE scaling in a dense architecture (Qwen3 with Hugging Face's ``rope_scaling`` of
type yarn, and llama.cpp's GGUF keys for it): both formats of one model against the float64
reference (which follows Hugging Face's ``_compute_yarn_parameters``); against llama.cpp in
tests/test_llama_cpp_parity.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_fixtures import check_both_formats
from llama_reference import reference_logits
from model_factory import make_tiny

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17, 30, 31, 90, 6]
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}


def test_both_formats_give_the_reference_and_yarn_matters(tmp_path: Path) -> None:
    m = make_tiny("qwen3", seed=12, hidden=64, layers=2, theta=500.0)
    plain = reference_logits(m.config, m.tensors, IDS)
    m.config["rope_scaling"] = dict(YARN)
    want = reference_logits(m.config, m.tensors, IDS)
    assert np.abs(want - plain).max() > 1e-2 * np.abs(want).max(), "YaRN moves the logits"
    check_both_formats(m, tmp_path, IDS)


def test_the_hugging_face_fields_and_their_defaults() -> None:
    cfg = make_tiny("qwen3").config | {"rope_scaling": dict(YARN)}
    got = LlamaConfig.from_hf(cfg)
    assert got.rope_scaling is not None
    assert got.rope_scaling.kind == "yarn"
    assert got.rope_scaling.original_max_position == 8
    assert got.rope_mscale == pytest.approx(0.1 * np.log(4.0) + 1)
    given = LlamaConfig.from_hf(cfg | {"rope_scaling": YARN | {"attention_factor": 1.5}})
    assert given.rope_mscale == 1.5
    untruncated = LlamaConfig.from_hf(cfg | {"rope_scaling": YARN | {"truncate": False}})
    assert not np.array_equal(untruncated.inv_freq(), got.inv_freq())
    deepseek = YARN | {"mscale": 1.0, "mscale_all_dim": 0.707}
    with pytest.raises(UnsupportedError, match="mscale_all_dim"):
        LlamaConfig.from_hf(cfg | {"rope_scaling": deepseek})
    with pytest.raises(WeightFormatError, match="YaRN"):
        LlamaConfig.from_hf(cfg | {"rope_scaling": {"rope_type": "yarn", "factor": 0.5}})
