"""Optional: the same GGUF gives the same logits in llama.cpp and in this runner.

Skipped unless ``llama-cpp-python`` is installed (it builds llama.cpp from source). This is
the end-to-end check of the GGUF conventions (q/k permutation, NORM vs NEOX RoPE, biases,
q/k norms, tied heads; Gemma's scaled embeddings, GeGLU, post norms, soft-capping, windowed
layers and local RoPE; the mixtures of experts' routing, stacked experts and shared expert)
against the engine that defines them, at every position of the prompt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from model_factory import make_tiny, with_longrope, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

from rlx_lm.runners.llama import load_llama
from rlx_lm.runners.llama_config import LLAMA_ARCHITECTURES

llama_cpp = pytest.importorskip("llama_cpp")

TOKENS, _, _ = spm_vocab()
PROMPT = [1, 17, 42, 8, 99, 5, 61, 300, 12, 7]


# Mixtral: llama with experts, as llama.cpp's converter writes it.
@pytest.mark.parametrize("arch", [*LLAMA_ARCHITECTURES, "mixtral"])
@pytest.mark.parametrize(
    ("qtype", "tol"),
    [
        # llama.cpp keeps its KV cache in float16 (2^-11 relative rounding per element) and
        # sums in other orders; observed <= 2e-4 of the logit range.
        ("F32", 2e-3),
        # F16 weights: it also rounds the activations to float16 for the matmul.
        ("F16", 3e-3),
        # Q8_0: it quantises the activations to 8-bit blocks too (vec_dot q8_0 x q8_0), an
        # error of ~0.4% per block; observed <= 8e-3 (gemma2, whose logits are capped at 6 so
        # the range is small: <= 3.1e-2).
        ("Q8_0", 5e-2),
    ],
)
def test_llama_cpp_and_this_runner_agree_on_logits(
    tmp_path: Path, arch: str, qtype: str, tol: float
) -> None:
    # Gemma 3: seven blocks, so llama.cpp's fixed pattern (five windowed, one global) has both.
    layers = 7 if arch == "gemma3" else 2
    m = make_tiny(
        arch,
        seed=31,
        vocab=len(TOKENS),
        tie=arch in ("qwen3", "qwen3moe", "gemma", "gemma2", "gemma3"),
        hidden=64,
        inter=128,
        layers=layers,
        # llama.cpp 0.3.36 sizes OLMoE's k norm by the hidden width: no GQA there.
        kv_heads=4 if arch == "olmoe" else 2,
    )
    if arch == "gemma3":
        m.config["sliding_window_pattern"] = 6  # llama.cpp's, so no key is written
    path = write_gguf(m, tmp_path / f"{arch}.gguf", qtype=qtype, tokenizer=spm_gguf_fields())
    _agree_at_every_position(path, PROMPT, tol)


def _agree_at_every_position(path: Path, prompt: list[int], tol: float) -> None:
    """llama.cpp's logits and ours at every position of ``prompt`` within ``tol`` of their
    range, and their greedy token ours too, up to a near-tie inside the tolerance (Granite's
    logits, divided by its logit scale, span little; Q8_0 activations move them)."""
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=64, n_threads=1, logits_all=True, verbose=False
    )
    llm.eval(prompt)
    runner = load_llama(path)
    for n in range(1, len(prompt) + 1):
        theirs = np.asarray(llm.scores[n - 1], dtype=np.float64)
        ours = runner.predict_logits(prompt[:n]).astype(np.float64)
        atol = tol * np.abs(theirs).max()
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=atol)
        assert ours[int(np.argmax(theirs))] >= ours.max() - atol


def test_llama_cpp_and_this_runner_agree_on_yarn(tmp_path: Path) -> None:
    # YaRN in a dense model (a Qwen3 conversion's keys): factor 4 over 8 original positions,
    # so every position past the eighth is beyond it.
    m = make_tiny("qwen3", seed=31, vocab=len(TOKENS), tie=True, hidden=64, theta=500.0)
    m.config["rope_scaling"] = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8,
    }
    path = write_gguf(m, tmp_path / "yarn.gguf", tokenizer=spm_gguf_fields())
    _agree_at_every_position(path, [*PROMPT, 20, 33, 44, 55], 2e-3)


@pytest.mark.parametrize("n_ctx", [256, 512])
def test_llama_cpp_and_this_runner_agree_on_longrope(tmp_path: Path, n_ctx: int) -> None:
    # Phi-3's LongRoPE: llama.cpp takes the long factor set when its context (a multiple of
    # 256) is longer than the original context (256 here), and scales cos/sin by attn_factor.
    m = make_tiny("phi3", seed=31, vocab=len(TOKENS), tie=True, hidden=64, inter=128)
    m = with_longrope(m, 256)
    path = write_gguf(m, tmp_path / "phi3.gguf", tokenizer=spm_gguf_fields())
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_threads=1, logits_all=True, verbose=False
    )
    llm.eval(PROMPT)
    theirs = np.asarray(llm.scores[len(PROMPT) - 1], dtype=np.float64)
    ours = load_llama(path, max_seq=n_ctx).predict_logits(PROMPT).astype(np.float64)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-3 * np.abs(theirs).max())


@pytest.mark.parametrize(
    ("arch", "n_ctx"), [("phi3", 256), ("phi3", 512), ("gemma2", 256), ("gemma3", 256)]
)
def test_llama_cpp_and_this_runner_agree_on_partial_rope(
    tmp_path: Path, arch: str, n_ctx: int
) -> None:
    # rope.dimension_count below the head size (Phi-4-mini: 96 of 128): llama.cpp rotates the
    # first n_rot elements of each head; with LongRoPE (Phi-4-mini again) a factor per pair.
    layers = 7 if arch == "gemma3" else 2  # both of Gemma 3's layer kinds, as above
    m = make_tiny(arch, seed=31, vocab=len(TOKENS), tie=True, hidden=64, inter=128, layers=layers)
    m.config["partial_rotary_factor"] = 0.75
    if arch == "gemma3":
        m.config["sliding_window_pattern"] = 6
    if arch == "phi3":
        m = with_longrope(m, 256)
    path = write_gguf(m, tmp_path / f"{arch}.gguf", tokenizer=spm_gguf_fields())
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_threads=1, logits_all=True, verbose=False
    )
    llm.eval(PROMPT)
    runner = load_llama(path, max_seq=n_ctx)
    assert runner.cfg.rotary_dims == 12
    for n in range(1, len(PROMPT) + 1):
        theirs = np.asarray(llm.scores[n - 1], dtype=np.float64)
        ours = runner.predict_logits(PROMPT[:n]).astype(np.float64)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-3 * np.abs(theirs).max())
