"""ERNIE 4.5 (GGUF ``ernie4_5``, ``Ernie4_5ForCausalLM``): the Llama block whose checkpoints
already pair q/k elements as (2i, 2i + 1) for RoPE, so both formats use the interleaved
pairing on the rows as stored; both formats of one model against the float64 reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_fixtures import check_both_formats
from llama_reference import reference_logits
from model_factory import make_tiny

from rlx_lm.errors import UnsupportedError
from rlx_lm.runners.llama_config import LlamaConfig

IDS = [1, 5, 7, 3, 9, 100, 2, 50, 4, 4, 4, 17]


def test_both_formats_of_one_model_give_the_reference_with_interleaved_pairs(
    tmp_path: Path,
) -> None:
    m = make_tiny("ernie4_5", seed=9, hidden=64, inter=96, layers=3, tie=True)
    want = reference_logits(m.config, m.tensors, IDS)
    # The pairing matters: the same tensors rotated half against half differ.
    halves = reference_logits(m.config | {"model_type": "llama"}, m.tensors, IDS)
    assert np.abs(halves - want).max() > 1e-2 * np.abs(want).max()
    check_both_formats(m, tmp_path, IDS)


def test_use_bias_is_refused() -> None:
    cfg = make_tiny("ernie4_5").config
    assert LlamaConfig.from_hf(cfg).arch == "ernie4_5"
    with pytest.raises(UnsupportedError, match="use_bias"):
        LlamaConfig.from_hf(cfg | {"use_bias": True})
