"""Loader edge cases on the engine path: MLX quantisation, hostile headers, missing tensors,
RoPE scaling configs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from model_factory import make_tiny, write_safetensors_dir

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig


def test_mlx_quantised_directories_are_refused_by_name(tmp_path: Path) -> None:
    m = make_tiny("qwen2")
    d = write_safetensors_dir(m, tmp_path / "mlx")
    (d / "config.json").write_text(json.dumps(m.config | {"quantization": {"bits": 4}}))
    with pytest.raises(UnsupportedError, match="quantized"):
        load_llama(d)


def test_plain_mlx_directory_with_any_shard_names_loads(tmp_path: Path) -> None:
    m = make_tiny("qwen3")
    d = write_safetensors_dir(m, tmp_path / "mlx")
    (d / "model.safetensors").rename(d / "weights.00.safetensors")
    runner = load_llama(d)
    assert runner.cfg.arch == "qwen3"
    assert runner.cfg.qk_norm


def test_a_hostile_safetensors_header_is_refused_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes((2**63).to_bytes(8, "little") + b"{}")
    (tmp_path / "config.json").write_text(json.dumps(make_tiny("llama").config))
    with pytest.raises(WeightFormatError, match="exceeds the format's limit"):
        load_llama(f)
    f.write_bytes((4).to_bytes(8, "little") + b"{]]]")
    with pytest.raises(WeightFormatError, match="not valid JSON"):
        load_llama(f)


def test_missing_and_misshapen_tensors_are_named(tmp_path: Path) -> None:
    m = make_tiny("llama")
    del m.tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(WeightFormatError, match=r"blk\.1\.ffn_up"):
        load_llama(write_safetensors_dir(m, tmp_path / "a"))
    m = make_tiny("llama")
    m.tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, 32), np.float32)
    with pytest.raises(WeightFormatError, match=r"attn_k.*\(3, 32\)"):
        load_llama(write_safetensors_dir(m, tmp_path / "b"))


def test_bad_geometry_in_config_is_refused() -> None:
    base = make_tiny("llama").config
    with pytest.raises(WeightFormatError, match="multiple of n_kv_heads"):
        LlamaConfig.from_hf(base | {"num_key_value_heads": 3})
    with pytest.raises(WeightFormatError, match="hidden_size"):
        LlamaConfig.from_hf({k: v for k, v in base.items() if k != "hidden_size"})
    qwen = make_tiny("qwen2").config | {"use_sliding_window": True, "sliding_window": 8}
    with pytest.raises(UnsupportedError, match="use_sliding_window"):
        LlamaConfig.from_hf(qwen)
    # (YaRN is supported: tests/test_yarn.py.) Dynamic NTK is not.
    with pytest.raises(UnsupportedError, match="dynamic"):
        LlamaConfig.from_hf(base | {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})


def test_llama3_rope_scaling_follows_its_three_bands() -> None:
    cfg = LlamaConfig.from_hf(
        make_tiny("llama", hidden=128, heads=2, kv_heads=2).config
        | {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }
    )
    plain = 1.0 / 500000.0 ** (np.arange(0, 64, 2) / 64)
    scaled = cfg.inv_freq()
    wavelen = 2 * math.pi / plain
    short = wavelen < 8192 / 4
    long = wavelen > 8192 / 1
    np.testing.assert_allclose(scaled[short], plain[short])
    np.testing.assert_allclose(scaled[long], plain[long] / 8.0)
    middle = ~short & ~long
    assert np.all(scaled[middle] <= plain[middle])
    assert np.all(scaled[middle] >= plain[middle] / 8.0)


def test_header_fields_decode_without_the_readers_contents_method(tmp_path: Path) -> None:
    # gguf releases before ReaderField.contents() go through the raw parts instead
    from model_factory import write_gguf
    from numpy_llama.gguf_file import _field_value, open_gguf
    from tokenizer_factory import spm_gguf_fields

    tiny = make_tiny("llama")
    fields = spm_gguf_fields()
    path = write_gguf(tiny, tmp_path / "m.gguf", tokenizer=fields)
    g = open_gguf(path)
    # what was written, not what this gguf release reads back: the oldest allowed gguf
    # has no contents() to compare with
    written = {
        "general.architecture": "llama",
        "llama.block_count": tiny.config["num_hidden_layers"],
        "llama.rope.freq_base": tiny.config["rope_theta"],
        "tokenizer.ggml.tokens": fields["tokenizer.ggml.tokens"],
        "tokenizer.ggml.scores": fields["tokenizer.ggml.scores"],
        "tokenizer.ggml.add_bos_token": True,
    }
    for key, want in written.items():
        got = _field_value(g.reader.get_field(key))
        if isinstance(want, float) or (isinstance(want, list) and isinstance(want[0], float)):
            assert got == pytest.approx(want, rel=1e-6), key
        else:
            assert got == want, key
