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

from rlx_lm.errors import InvalidOptionError, UnsupportedError, WeightFormatError
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
    with pytest.raises(UnsupportedError, match="longrope"):
        LlamaConfig.from_hf(m.config)  # Hugging Face LongRoPE checkpoints: not yet
