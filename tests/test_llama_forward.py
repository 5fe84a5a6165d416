"""The numpy reference forward (tests/numpy_llama) against the independent float64 reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from llama_fixtures import ListKv, all_logits, forward_from_dir, forward_from_gguf
from llama_reference import reference_logits
from model_factory import (
    make_tiny,
    quantize_model,
    round_to_bf16,
    write_gguf,
    write_safetensors_dir,
)
from numpy_llama.weights import unpermute_rope_rows

from rlx_lm.runners.llama_config import LLAMA_ARCHITECTURES

# gpt-oss (GGUF only, pieces the numpy forward does not have) is checked against the float64
# reference on its own: tests/test_gpt_oss.py.
ARCHS = [a for a in LLAMA_ARCHITECTURES if a != "gpt-oss"]
IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def _tiny(arch: str) -> object:
    # GQA everywhere (4 query heads over 2 kv heads); qwen3 ties its head to the embedding.
    return make_tiny(
        arch, seed=11, tie=arch == "qwen3", theta=500.0 if arch == "qwen2" else 10000.0
    )


def _close(got: np.ndarray, want: np.ndarray, rel: float = 2e-6) -> None:
    # float32 compute vs a float64 reference: errors of a few ulps of the largest logit.
    tol = rel * float(np.abs(want).max()) + 1e-6
    np.testing.assert_allclose(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_safetensors_logits_match_the_reference_at_every_position(
    tmp_path: Path, arch: str, chunk: int
) -> None:
    m = _tiny(arch)
    fw = forward_from_dir(write_safetensors_dir(m, tmp_path / "m"), chunk=chunk)
    _close(all_logits(fw, IDS), reference_logits(m.config, m.tensors, IDS))


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_and_safetensors_of_one_model_give_the_same_logits(tmp_path: Path, arch: str) -> None:
    # The GGUF copy has llama/mistral q/k rows permuted by the converter's rule; equal logits
    # prove the loader undoes it (and leaves qwen2/qwen3, which llama.cpp does not permute, alone).
    m = _tiny(arch)
    st_logits = all_logits(forward_from_dir(write_safetensors_dir(m, tmp_path / "m")), IDS)
    gg_logits = all_logits(forward_from_gguf(write_gguf(m, tmp_path / "m.gguf")), IDS)
    np.testing.assert_allclose(gg_logits, st_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("packed", [False, True])
def test_quantised_gguf_matches_the_reference_on_its_dequantised_weights(
    tmp_path: Path, qtype: str, packed: bool
) -> None:
    # K-quants need rows of 256 values, hence the wider model for them.
    wide = qtype.endswith("_K")
    m = make_tiny(
        "llama",
        seed=4,
        hidden=256 if wide else 64,
        inter=256 if wide else 128,
        heads=4,
        kv_heads=2,
        vocab=128,
    )
    qm, raw = quantize_model(m, qtype)
    path = write_gguf(qm, tmp_path / f"m-{qtype}.gguf", qtype=qtype, raw=raw)
    fw = forward_from_gguf(path, packed=packed, chunk=4)
    _close(all_logits(fw, IDS[:8]), reference_logits(qm.config, qm.tensors, IDS[:8]), rel=1e-5)
    if packed:
        dense = forward_from_gguf(path, packed=False)
        assert fw.w.nbytes < dense.w.nbytes, "packed weights should stay smaller than float32"


@pytest.mark.parametrize(
    ("qtype", "bound"),
    [
        # F16 keeps 11 significant bits: each weight is off by <= 2^-11 relative (4.9e-4). Logits
        # are sums of many such products whose errors mostly cancel; 5e-3 of the logit range leaves
        # a 10x margin over one rounding step while still catching a wrong scale or layout.
        ("F16", 5e-3),
        # Q8_0 stores 32-value blocks as int8 times one f16 scale (amax / 127): a per-weight error
        # up to 0.4% of the block's largest value, ~0.5% RMS relative to a Gaussian weight. Through
        # two layers that is ~1-2% of the logit range; 5e-2 is the bound, a wrong dequantisation
        # is off by O(1).
        ("Q8_0", 5e-2),
    ],
)
def test_f16_and_q8_0_stay_within_their_rounding_error_of_f32(
    tmp_path: Path, qtype: str, bound: float
) -> None:
    m = make_tiny("llama", seed=9, hidden=64, inter=128)
    ref = reference_logits(m.config, m.tensors, IDS)
    fw = forward_from_gguf(write_gguf(m, tmp_path / "m.gguf", qtype=qtype))
    err = np.abs(all_logits(fw, IDS) - ref).max() / np.abs(ref).max()
    assert err < bound


def test_bf16_and_sharded_safetensors_load_the_same_numbers(tmp_path: Path) -> None:
    m = round_to_bf16(_tiny("qwen2"))
    want = reference_logits(m.config, m.tensors, IDS)
    sharded = forward_from_dir(write_safetensors_dir(m, tmp_path / "s", shards=3))
    bf16 = forward_from_dir(write_safetensors_dir(m, tmp_path / "b", bf16=True))
    _close(all_logits(sharded, IDS), want)
    _close(all_logits(bf16, IDS), want)


@given(
    heads=st.integers(1, 4),
    half=st.integers(1, 4),
    cols=st.integers(1, 3),
)
def test_unpermute_inverts_the_converter_permutation(heads: int, half: int, cols: int) -> None:
    w = np.arange(heads * 2 * half * cols, dtype=np.float32).reshape(heads * 2 * half, cols)
    permuted = w.reshape(heads, 2, half, cols).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_rope_rows(permuted, heads), w)


def test_chunked_prefill_never_holds_all_scores_at_once(tmp_path: Path) -> None:
    import tracemalloc

    m = make_tiny("llama", seed=2, heads=8, kv_heads=2, hidden=64, vocab=128)
    ids = list(range(128)) * 2  # 256 tokens
    peaks = {}
    for chunk in (16, 256):
        fw = forward_from_dir(write_safetensors_dir(m, tmp_path / f"c{chunk}"), chunk=chunk)
        tracemalloc.start()
        fw.prefill(np.asarray(ids), ListKv(fw.cfg.n_layers), 0)
        peaks[chunk] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    full_scores = 8 * 256 * 256 * 4  # heads x seq x seq float32: 2 MiB
    assert peaks[256] > full_scores
    assert peaks[16] < full_scores / 2


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_mistral_sliding_window_matches_the_reference(tmp_path: Path, chunk: int) -> None:
    m = make_tiny("mistral", seed=12)
    m.config["sliding_window"] = 3
    want = reference_logits(m.config, m.tensors, IDS)
    fw = forward_from_dir(write_safetensors_dir(m, tmp_path / "m"), chunk=chunk)
    _close(all_logits(fw, IDS), want)
    # the window matters: without it the later positions differ
    unwindowed = reference_logits(m.config | {"sliding_window": None}, m.tensors, IDS)
    assert not np.allclose(want[-1], unwindowed[-1], atol=1e-3)
