"""The engine in the activation-quantised fast mode (``activations="q8"``).

Tiny random models of every architecture and the main block types against the numpy
reference whose every matrix first rounds its activations as ggml does (Q8_0 blocks of 32,
Q8_K blocks of 256 for the K-quants), within a stated tolerance; batch rows still equal the
sequence alone; the setting reaches the engine through the builder, ``load_model`` and
``load_llama``, and a bad value is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_fixtures import all_logits, forward_from_gguf
from model_factory import make_tiny, write_gguf
from test_engine import ARCHS, IDS, _engine_all, _model
from test_quant_q8 import quantize_q8_0, quantize_q8_k
from tokenizer_factory import spm_gguf_fields, spm_vocab

import rlx_lm
from rlx_lm.errors import InvalidOptionError
from rlx_lm.runners.llama import load_llama

TOKENS, _, _ = spm_vocab()
QTYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"]


class _Quantised:
    """A reference matrix that rounds its activations to 8 bits first."""

    def __init__(self, inner: Any, k_blocks: bool) -> None:
        self.inner, self.k_blocks, self.shape = inner, k_blocks, inner.shape

    def apply(self, x: np.ndarray) -> np.ndarray:
        xq = quantize_q8_k(x) if self.k_blocks else quantize_q8_0(x)
        out: np.ndarray = self.inner.apply(xq.astype(np.float32))
        return out


def _q8_reference(path: Path, qtype: str) -> Any:
    fw = forward_from_gguf(path)
    k_blocks = qtype.endswith("_K")
    for lw in fw.w.layers:
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            if getattr(lw, name) is not None:  # a mixture without a shared expert has none
                setattr(lw, name, _Quantised(getattr(lw, name), k_blocks))
        # A mixture's experts; its router is stored in F32 (as llama.cpp's quantizer keeps
        # it), whose products take the activations as they are in both modes.
        if lw.experts is not None:
            lw.experts = [
                (
                    _Quantised(g, k_blocks),
                    _Quantised(u, k_blocks),
                    _Quantised(d, k_blocks),
                )
                for g, u, d in lw.experts
            ]
    fw.w.output = _Quantised(fw.w.output, k_blocks)
    return fw


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", QTYPES)
def test_fast_mode_matches_the_reference_with_quantised_activations(
    tmp_path: Path, arch: str, qtype: str
) -> None:
    path = _model(arch, qtype, tmp_path)
    runner = load_llama(path, max_seq=32, activations="q8")
    assert runner.activations == "q8"
    got = _engine_all(runner, IDS)
    want = all_logits(_q8_reference(path, qtype), IDS)
    exact = all_logits(forward_from_gguf(path), IDS)
    scale = float(np.abs(exact).max())
    # An activation on a rounding boundary may round the other way in the engine's float32
    # than in the reference's order of operations; one code's step then moves that row and,
    # through its keys and values, later ones: rows agree to 1e-6 of the logit range or, after
    # such a flip, to about 1.4% (Q6_K qwen2, the worst here).
    assert float(np.abs(got - want).max()) <= 3e-2 * scale
    # Not the exact mode: the activations really are rounded.
    assert not np.array_equal(got, _engine_all(load_llama(path, max_seq=32), IDS))


def test_a_fast_batch_row_is_bit_identical_to_that_session_alone(tmp_path: Path) -> None:
    path = write_gguf(make_tiny("llama", seed=4), tmp_path / "m.gguf", qtype="Q4_0")
    runner = load_llama(path, max_seq=32, activations="q8")
    prompts = [IDS[:3], IDS[2:9], IDS[5:6]]
    sessions = []
    for p in prompts:
        runner.prefill_logits(p)
        sessions.append(runner.export_session())
    logits, _ = runner.decode_batch(sessions, [11, 12, 13])
    for i, (s, t) in enumerate(zip(sessions, [11, 12, 13], strict=True)):
        runner.restore_session(s)
        np.testing.assert_array_equal(logits[i], runner.decode_logits(t))


def test_the_setting_reaches_the_engine_and_bad_values_are_refused(tmp_path: Path) -> None:
    path = write_gguf(
        make_tiny("llama", seed=8, vocab=len(TOKENS)),
        tmp_path / "m.gguf",
        qtype="Q8_0",
        tokenizer=spm_gguf_fields(),
    )
    b = rlx_lm.LmRunnerBuilder().weights(path)
    assert b.activations() == "exact"
    assert b.activations("q8").activations() == "q8"
    assert b.build().activations == "exact"  # type: ignore[attr-defined]
    assert b.activations("q8").build().activations == "q8"  # type: ignore[attr-defined]
    runner, _ = rlx_lm.load_model(path, max_seq=16, activations="q8")
    assert runner.activations == "q8"  # type: ignore[attr-defined]
    with pytest.raises(InvalidOptionError, match="activations"):
        b.activations("int8")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="activations"):
        load_llama(path, activations="fast")  # type: ignore[arg-type]


def test_the_cli_flag_sets_the_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlx_lm.cli import main

    path = write_gguf(
        make_tiny("llama", seed=8, vocab=len(TOKENS)),
        tmp_path / "m.gguf",
        qtype="Q8_0",
        tokenizer=spm_gguf_fields(),
    )
    seen: list[str] = []
    real = rlx_lm.LmRunnerBuilder.build

    def spy(self: rlx_lm.LmRunnerBuilder) -> object:
        seen.append(self.activations())
        return real(self)

    monkeypatch.setattr(rlx_lm.LmRunnerBuilder, "build", spy)
    args = ["generate", str(path), "-p", "hello", "-n", "2"]
    assert main([*args, "--activations", "q8"]) == 0
    assert main(args) == 0
    assert seen == ["q8", "exact"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "--activations", "q4"])
    assert "invalid choice" in capsys.readouterr().err
