"""OLMo 2 (norms after attention and the MLP only; q and k normed over the whole projection):
its fields from GGUF headers and Hugging Face configs, both formats of one model against the
float64 reference, and what is refused (OLMo's q/k/v clamp, a pre norm in an OLMo 2 file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_reference import reference_logits
from model_factory import config_from_gguf_fields, make_tiny, write_gguf, write_safetensors_dir

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def test_olmo2_fields_from_gguf_and_hf() -> None:
    g = config_from_gguf_fields("olmo2", block_count=4)
    hf = LlamaConfig.from_hf(make_tiny("olmo2").config)
    for cfg in (g, hf):
        assert cfg.arch == "olmo2"
        assert (cfg.post_norms, cfg.no_pre_norms, cfg.qk_norm, cfg.qk_norm_full) == (
            True,
            True,
            True,
            True,
        )
    with pytest.raises(UnsupportedError, match="clip_qkv"):
        LlamaConfig.from_hf(make_tiny("olmo2").config | {"clip_qkv": 8.0})
    with pytest.raises(UnsupportedError, match="clamp_kqv"):
        config_from_gguf_fields("olmo2", **{"attention.clamp_kqv": 8.0})
    with pytest.raises(WeightFormatError, match="no_pre_norms needs post_norms"):
        LlamaConfig("llama", 10, 8, 8, 1, 2, 2, 4, no_pre_norms=True)


def test_both_formats_of_one_model_give_the_reference(tmp_path: Path) -> None:
    m = make_tiny("olmo2", seed=9, hidden=64, inter=96, layers=3)
    want = reference_logits(m.config, m.tensors, IDS)
    for path in (write_gguf(m, tmp_path / "m.gguf"), write_safetensors_dir(m, tmp_path / "st")):
        runner = load_llama(path, max_seq=32)
        assert runner.cfg.no_pre_norms
        got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)
        runner.prefill_logits(IDS[:3])
        steps = np.stack([runner.decode_logits(t) for t in IDS[3:]])
        np.testing.assert_allclose(steps, want[3:], rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)


def test_a_pre_norm_in_an_olmo2_file_is_refused_by_name(tmp_path: Path) -> None:
    # A file that says olmo2 but holds a norm before attention is not what it says: refused,
    # rather than run without the norm.
    m = make_tiny("olmo2", seed=2, hidden=64, layers=2)
    m.tensors["model.layers.1.input_layernorm.weight"] = np.ones(64, dtype=np.float32)
    with pytest.raises(WeightFormatError, match=r"blk\.1\.attn_norm\.weight"):
        load_llama(write_gguf(m, tmp_path / "m.gguf"))
