"""Phi-3: q, k and v in one matrix and gate and up in one (gate first), split as stored; what
it has that the engine does not do yet (LongRoPE, partial RoPE) is refused by name."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from llama_reference import reference_logits
from model_factory import make_tiny, quantize_model, write_gguf, write_safetensors_dir

from rlx_lm.errors import UnsupportedError
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


def test_longrope_files_are_refused_by_name(tmp_path: Path) -> None:
    m = make_tiny("phi3", hidden=64)
    path = write_gguf(m, tmp_path / "m.gguf")
    # The same file with LongRoPE's two factor sets (Phi-3's 128k models).
    w = gguf.GGUFWriter(str(tmp_path / "long.gguf"), "phi3")
    reader = gguf.GGUFReader(path)
    for field in reader.fields.values():
        if field.name.startswith("phi3.") and field.types == [gguf.GGUFValueType.UINT32]:
            w.add_uint32(field.name, int(field.parts[field.data[0]][0]))
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)]))
    half = 8
    w.add_tensor("rope_factors_long.weight", np.ones(half, np.float32))
    w.add_tensor("rope_factors_short.weight", np.ones(half, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match=r"LongRoPE \(rope_factors_long\.weight"):
        load_llama(tmp_path / "long.gguf")


def test_partial_rope_is_refused() -> None:
    cfg = make_tiny("phi3").config
    with pytest.raises(UnsupportedError, match="partial_rotary_factor"):
        LlamaConfig.from_hf(cfg | {"partial_rotary_factor": 0.75})
    fields = {
        "general.architecture": "phi3",
        "phi3.embedding_length": 64,
        "phi3.attention.head_count": 4,
        "phi3.feed_forward_length": 96,
        "phi3.block_count": 2,
        "phi3.rope.dimension_count": 12,
    }
    with pytest.raises(UnsupportedError, match="dimension_count=12 rotates part of each 16"):
        LlamaConfig.from_gguf_fields(fields.get, where="t.gguf", vocab_fallback=50)
    fields["phi3.rope.dimension_count"] = 16
    assert (
        LlamaConfig.from_gguf_fields(fields.get, where="t.gguf", vocab_fallback=50).head_dim == 16
    )
