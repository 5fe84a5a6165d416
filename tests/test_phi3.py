"""Phi-3: q, k and v in one matrix and gate and up in one (gate first), split as stored; what
LongRoPE (the 128k models) runs as llama.cpp runs it (partial RoPE, Phi-4-mini's other piece:
test_partial_rope.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_reference import reference_logits
from model_factory import (
    TinyModel,
    make_tiny,
    quantize_model,
    with_longrope,
    write_gguf,
    write_safetensors_dir,
)

from rlx_lm.errors import InvalidOptionError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def test_fused_checkpoints_hold_no_separate_projections() -> None:
    m = make_tiny("phi3")
    names = set(m.tensors)
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in names)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_K"])
def test_phi3_loads_from_safetensors_and_gguf_to_the_reference(tmp_path: Path, qtype: str) -> None:
    wide = qtype == "Q4_K"
    m = make_tiny("phi3", seed=6, hidden=256 if wide else 64, inter=256 if wide else 96)
    qm, raw = quantize_model(m, qtype)
    want = reference_logits(qm.config, qm.tensors, IDS)
    paths = [write_gguf(qm, tmp_path / "m.gguf", qtype=qtype, raw=raw)]
    if qtype == "F32":
        paths.append(write_safetensors_dir(qm, tmp_path / "st"))
    for path in paths:
        runner = load_llama(path, max_seq=32)
        assert runner.cfg.arch == "phi3"
        got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)
        runner.prefill_logits(IDS[:4])
        step = [runner.decode_logits(t) for t in IDS[4:]]
        np.testing.assert_allclose(np.stack(step), want[4:], rtol=0, atol=2e-5 * np.abs(want).max())


def _longrope() -> TinyModel:
    """A tiny Phi-3 with LongRoPE: trained for 512 positions, originally 64."""
    return with_longrope(make_tiny("phi3", seed=6, hidden=64, inter=96), 64)


@pytest.mark.parametrize("max_seq", [32, 64, 65, 512])
def test_longrope_picks_its_factor_set_by_the_session_length(tmp_path: Path, max_seq: int) -> None:
    # As llama.cpp: the long set past the original context, and cos/sin times attn_factor.
    m = _longrope()
    path = write_gguf(m, tmp_path / "m.gguf")
    runner = load_llama(path, max_seq=max_seq)
    assert runner.loaded.longrope == (64, max_seq > 64)
    want = reference_logits(m.config, m.tensors, IDS, context=max_seq)
    other = reference_logits(m.config, m.tensors, IDS, context=600 if max_seq <= 64 else 8)
    got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
    tol = 2e-5 * np.abs(want).max() + 1e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)
    assert np.abs(got - other).max() > 100 * tol, "the two factor sets must differ here"


def test_a_clone_across_the_original_context_is_refused(tmp_path: Path) -> None:
    runner = load_llama(write_gguf(_longrope(), tmp_path / "m.gguf"), max_seq=32)
    assert runner.clone(max_seq=64).max_seq == 64
    with pytest.raises(InvalidOptionError, match="LongRoPE factors were chosen at load"):
        runner.clone(max_seq=65)


def test_longrope_without_its_original_context_is_refused(tmp_path: Path) -> None:
    m = _longrope()
    path = write_gguf(m, tmp_path / "m.gguf")
    raw = path.read_bytes().replace(
        b"rope.scaling.original_context_length", b"rope.scaling.original_context_lengtX"
    )
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(raw)
    with pytest.raises(WeightFormatError, match="original_context_length"):
        load_llama(bad)


@pytest.mark.parametrize("max_seq", [32, 65])
def test_hugging_face_longrope_is_chosen_as_for_gguf(tmp_path: Path, max_seq: int) -> None:
    # A safetensors checkpoint's LongRoPE: the set picked by the session length at load (as
    # llama.cpp; Hugging Face re-picks per forward pass, which a KV cache cannot follow).
    m = _longrope()
    runner = load_llama(write_safetensors_dir(m, tmp_path / "st"), max_seq=max_seq)
    assert runner.loaded.longrope == (64, max_seq > 64)
    want = reference_logits(m.config, m.tensors, IDS, context=max_seq)
    got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)
    with pytest.raises(InvalidOptionError, match="LongRoPE factors were chosen at load"):
        runner.clone(max_seq=8 if max_seq > 64 else 128)


def test_hugging_face_longrope_fields() -> None:
    m = _longrope()
    rs = m.config["rope_scaling"]
    cfg = LlamaConfig.from_hf(m.config)
    assert cfg.rope_scaling is not None
    assert cfg.rope_scaling.kind == "longrope"
    with pytest.raises(InvalidOptionError, match="for_context"):
        cfg.inv_freq()  # the set is not chosen yet
    short, choice = cfg.for_context(64)
    long, _ = cfg.for_context(65)
    assert choice == (64, False)
    assert short.rope_mscale == long.rope_mscale == 1.3
    np.testing.assert_allclose(
        short.inv_freq() * rs["short_factor"], long.inv_freq() * rs["long_factor"]
    )
    # Without attention_factor: Hugging Face's default from the context ratio (512 / 64).
    del rs["attention_factor"]
    default = LlamaConfig.from_hf(m.config).for_context(None)[0].rope_mscale
    assert default == pytest.approx(np.sqrt(1 + np.log(512 / 64) / np.log(64)))
    with pytest.raises(
        WeightFormatError, match="long_factor has 3 factors, the rotated pairs are 8"
    ):
        LlamaConfig.from_hf(m.config | {"rope_scaling": rs | {"long_factor": [1.0, 2.0, 3.0]}})
    with pytest.raises(WeightFormatError, match="short_factor holds a factor that is not positive"):
        LlamaConfig.from_hf(m.config | {"rope_scaling": rs | {"short_factor": [0.0] * 8}})
    no_original = {k: v for k, v in m.config.items() if k != "original_max_position_embeddings"}
    with pytest.raises(WeightFormatError, match="original context length"):
        LlamaConfig.from_hf(no_original)
