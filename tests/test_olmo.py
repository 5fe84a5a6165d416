"""OLMo 2 (norms after attention and the MLP only; q and k normed over the whole projection)
and EXAONE 4 (norms after only, q/k normed head by head, windowed layers with RoPE and global
ones without): their fields from GGUF headers and Hugging Face configs, both formats of one
model against the float64 reference, and what is refused (OLMo's q/k/v clamp, a pre norm in an
OLMo 2 file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_fixtures import check_both_formats
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


def test_exaone4_fields_and_llama_cpps_window_rule() -> None:
    # llama.cpp windows EXAONE 4's 64-block model only: three layers of four, the fourth
    # global and without RoPE; other block counts have neither.
    small = config_from_gguf_fields("exaone4", block_count=30)
    assert (small.no_pre_norms, small.post_norms, small.qk_norm, small.qk_norm_full) == (
        True,
        True,
        True,
        False,
    )
    assert small.sliding_window is None
    assert small.nope_layers == ()
    big = config_from_gguf_fields("exaone4", block_count=64)
    assert big.sliding_window == 4096
    assert [i for i in range(8) if big.window_of(i) is None] == [3, 7]
    assert [i for i in range(8) if not big.rotates(i)] == [3, 7]
    hf = make_tiny("exaone4", layers=4).config | {
        "sliding_window": 3,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    }
    cfg = LlamaConfig.from_hf(hf)
    assert (cfg.sliding_window, cfg.window_layers) == (3, (True, True, True, False))
    assert cfg.nope_layers == (False, False, False, True)
    del hf["layer_types"]
    assert LlamaConfig.from_hf(hf | {"sliding_window_pattern": "LLLG"}).window_layers == (
        True,
        True,
        True,
        False,
    )


def test_exaone4_windowed_layers_rotate_and_global_ones_do_not(tmp_path: Path) -> None:
    m = make_tiny("exaone4", seed=5, hidden=64, inter=96, layers=4)
    m.config |= {
        "sliding_window": 3,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    }
    want = reference_logits(m.config, m.tensors, IDS)
    runner = load_llama(write_safetensors_dir(m, tmp_path / "st"), max_seq=32)
    got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)
    # Without the window (and the global layer's NoPE) the logits differ.
    plain = reference_logits(
        {k: v for k, v in m.config.items() if k not in ("sliding_window", "layer_types")},
        m.tensors,
        IDS,
    )
    assert np.abs(plain - want).max() > 1e-2 * np.abs(want).max()


@pytest.mark.parametrize("arch", ["olmo2", "exaone4"])
def test_both_formats_of_one_model_give_the_reference(tmp_path: Path, arch: str) -> None:
    m = make_tiny(arch, seed=9, hidden=64, inter=96, layers=3)
    assert LlamaConfig.from_hf(m.config).no_pre_norms
    check_both_formats(m, tmp_path, IDS)


def test_a_pre_norm_in_an_olmo2_file_is_refused_by_name(tmp_path: Path) -> None:
    # A file that says olmo2 but holds a norm before attention is not what it says: refused,
    # rather than run without the norm.
    m = make_tiny("olmo2", seed=2, hidden=64, layers=2)
    m.tensors["model.layers.1.input_layernorm.weight"] = np.ones(64, dtype=np.float32)
    with pytest.raises(WeightFormatError, match=r"blk\.1\.attn_norm\.weight"):
        load_llama(write_gguf(m, tmp_path / "m.gguf"))
