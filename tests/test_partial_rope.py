"""Partial RoPE: only the first ``rope.dimension_count`` (GGUF) or ``partial_rotary_factor``
(Hugging Face) elements of each q/k head rotate, the rest pass through (Phi-4-mini: 96 of 128,
with LongRoPE factors one per rotated pair). As llama.cpp: run for phi3 and Gemma, refused
where llama.cpp does not run it."""

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

from rlx_lm.errors import UnsupportedError, WeightFormatError
from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def _partial(arch: str = "phi3", seed: int = 6) -> TinyModel:
    """A tiny Phi-4-mini (or Gemma): 3/4 of each 16-wide head rotates (12 elements, 6 pairs)."""
    m = make_tiny(arch, seed=seed, hidden=64, inter=96)
    m.config["partial_rotary_factor"] = 0.75
    return m


@pytest.mark.parametrize(
    ("arch", "qtype"), [("phi3", "F32"), ("phi3", "Q8_0"), ("gemma2", "F32"), ("gemma3", "Q8_0")]
)
def test_partial_rope_rotates_the_leading_elements_only(
    tmp_path: Path, arch: str, qtype: str
) -> None:
    # Gemma: GGUF only (llama.cpp runs its n_rot; Hugging Face's Gemma has no partial RoPE).
    qm, raw = quantize_model(_partial(arch), qtype)
    want = reference_logits(qm.config, qm.tensors, IDS)
    whole = reference_logits(qm.config | {"partial_rotary_factor": 1.0}, qm.tensors, IDS)
    tol = 2e-5 * np.abs(want).max() + 1e-5
    assert np.abs(want - whole).max() > 100 * tol, "partial and whole-head RoPE must differ here"
    paths = [write_gguf(qm, tmp_path / "m.gguf", qtype=qtype, raw=raw)]
    if qtype == "F32" and arch == "phi3":
        paths.append(write_safetensors_dir(qm, tmp_path / "st"))
    for path in paths:
        runner = load_llama(path, max_seq=32)
        assert runner.cfg.rotary_dims == 12
        assert runner.cfg.inv_freq().shape == (6,)
        got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
        np.testing.assert_allclose(got, want, rtol=0, atol=tol)
        runner.prefill_logits(IDS[:5])
        step = [runner.decode_logits(t) for t in IDS[5:]]
        np.testing.assert_allclose(np.stack(step), want[5:], rtol=0, atol=tol)


@pytest.mark.parametrize("max_seq", [32, 200])
def test_partial_rope_with_longrope_as_phi4_mini(tmp_path: Path, max_seq: int) -> None:
    # Phi-4-mini's combination: LongRoPE's factor sets have one factor per rotated pair, and
    # its cos/sin factor scales the rotated elements only. GGUF and Hugging Face checkpoints.
    m = with_longrope(_partial(), 64)
    assert len(m.config["rope_scaling"]["long_factor"]) == 6
    want = reference_logits(m.config, m.tensors, IDS, context=max_seq)
    for path in (write_gguf(m, tmp_path / "m.gguf"), write_safetensors_dir(m, tmp_path / "st")):
        runner = load_llama(path, max_seq=max_seq)
        assert runner.loaded.longrope == (64, max_seq > 64)
        got = np.stack([runner.predict_logits(IDS[: n + 1]) for n in range(len(IDS))])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-5)


def test_partial_rope_where_the_model_has_none_is_refused() -> None:
    # Hugging Face applies partial_rotary_factor in Phi-3's model only; llama.cpp refuses a
    # partial n_rot for llama and asserts on it for qwen2/qwen3.
    cfg = make_tiny("llama").config
    with pytest.raises(UnsupportedError, match=r"partial_rotary_factor=0\.5 .* llama"):
        LlamaConfig.from_hf(cfg | {"partial_rotary_factor": 0.5})
    phi = make_tiny("phi3").config
    for bad in (0.0, 1.5, -0.25):
        with pytest.raises(WeightFormatError, match="partial_rotary_factor"):
            LlamaConfig.from_hf(phi | {"partial_rotary_factor": bad})
    fields = {
        "general.architecture": "llama",
        "llama.embedding_length": 64,
        "llama.attention.head_count": 4,
        "llama.feed_forward_length": 96,
        "llama.block_count": 2,
        "llama.rope.dimension_count": 12,
    }
    with pytest.raises(UnsupportedError, match="dimension_count=12 rotates part of each 16"):
        LlamaConfig.from_gguf_fields(fields.get, where="t.gguf", vocab_fallback=50)
    phi_fields = {k.replace("llama", "phi3"): v for k, v in fields.items()} | {
        "general.architecture": "phi3"
    }
    got = LlamaConfig.from_gguf_fields(phi_fields.get, where="t.gguf", vocab_fallback=50)
    assert (got.head_dim, got.rope_dims, got.inv_freq().size) == (16, 12, 6)
    for bad in (0, 13, 18):
        phi_fields["phi3.rope.dimension_count"] = bad
        with pytest.raises(WeightFormatError, match=f"rope_dims must be .* got {bad}"):
            LlamaConfig.from_gguf_fields(phi_fields.get, where="t.gguf", vocab_fallback=50)
