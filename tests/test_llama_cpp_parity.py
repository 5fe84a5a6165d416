"""Optional: the same GGUF gives the same logits in llama.cpp and in this runner.

Skipped unless ``llama-cpp-python`` is installed (it builds llama.cpp from source). This is
the end-to-end check of the GGUF conventions (q/k permutation, NORM vs NEOX RoPE, biases,
q/k norms, tied heads) against the engine that defines them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from model_factory import make_tiny, write_gguf
from tokenizer_factory import spm_gguf_fields, spm_vocab

from rlx_lm.runners.llama import load_llama

llama_cpp = pytest.importorskip("llama_cpp")

TOKENS, _, _ = spm_vocab()
PROMPT = [1, 17, 42, 8, 99, 5, 61, 300, 12, 7]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_llama_cpp_and_this_runner_agree_on_logits(tmp_path: Path, arch: str) -> None:
    m = make_tiny(arch, seed=31, vocab=len(TOKENS), tie=arch == "qwen3")
    path = write_gguf(m, tmp_path / f"{arch}.gguf", tokenizer=spm_gguf_fields())
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=1, verbose=False)
    llm.eval(PROMPT)
    theirs = np.asarray(llm.scores[len(PROMPT) - 1], dtype=np.float64)
    ours = load_llama(path).predict_logits(PROMPT).astype(np.float64)
    # both float32; llama.cpp sums in other orders and uses its own exp/rsqrt
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-3 * np.abs(theirs).max())
    assert int(np.argmax(ours)) == int(np.argmax(theirs))
