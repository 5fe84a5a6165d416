"""The four builder settings that used to be write-only: each is used, or refused by name.

``max_memory_gb`` caps weights + KV cache; ``packed_weights`` picks packed or dequantised
weights; ``sample`` is what the runner's own ``generate`` samples with; ``stream(False)``
is refused (every runner streams). A family whose runner does not report honouring
``sample`` or ``packed_weights`` gets them refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from model_factory import make_tiny, write_safetensors_dir
from weight_files import write_gguf

import rlx_lm
from rlx_lm import (
    InvalidOptionError,
    LmRunnerBuilder,
    SampleOpts,
    UnsupportedError,
    match_architectures,
    register_model,
)
from rlx_lm import registry as reg_module
from rlx_lm.default_model import default_model_path

PROMPT = [1, 17, 300, 42, 7]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> reg_module._Registry:
    fresh = reg_module._Registry(builtins=(), group="rlx_lm.tests.no_such_group")
    monkeypatch.setattr(reg_module, "_registry", fresh)
    return fresh


class Plain:
    """A family runner that takes neither sampling options nor a packing choice."""

    family = "plain"
    vocab_size = 4

    def __init__(self, builder: LmRunnerBuilder) -> None:
        self.builder = builder

    def predict_logits(self, prompt_ids: list[int]) -> list[float]:
        return [0.0, 1.0, 0.0, 0.0]


def _bundled() -> LmRunnerBuilder:
    return LmRunnerBuilder(weights=default_model_path(), max_seq=64)


# -- stream -------------------------------------------------------------------------------


def test_stream_false_is_refused_by_name() -> None:
    assert LmRunnerBuilder().stream(True).stream() is True
    with pytest.raises(UnsupportedError, match=r"stream: False is not supported"):
        LmRunnerBuilder().stream(False)
    with pytest.raises(UnsupportedError, match="stream"):
        LmRunnerBuilder(stream=False)


# -- sample ---------------------------------------------------------------------------------


def test_sample_is_what_the_runners_own_generate_draws_with() -> None:
    opts = SampleOpts(temperature=1.5, top_k=50, presence_penalty=0.3, seed=11)
    runner = _bundled().sample(opts).build()
    assert runner.sample_opts == opts  # type: ignore[attr-defined]
    got = runner.generate(PROMPT, 12)  # type: ignore[attr-defined]
    # the same draw, written out: prefill, then the chain over prompt + output
    ref = _bundled().build()
    chain = opts.into_chain()
    history = list(PROMPT)
    logits = ref.prefill_logits(PROMPT)  # type: ignore[attr-defined]
    want = []
    for _ in range(12):
        tok = int(chain.sample(logits, np.array(history), prompt_len=len(PROMPT)))
        want.append(tok)
        history.append(tok)
        logits = ref.decode_logits(tok)  # type: ignore[attr-defined]
    assert got == want
    greedy = _bundled().build()
    assert greedy.sample_opts.is_greedy()  # type: ignore[attr-defined]
    assert greedy.generate(PROMPT, 12) != got, "the options change the tokens"  # type: ignore[attr-defined]
    assert runner.clone().sample_opts == opts  # type: ignore[attr-defined]


def test_sample_is_refused_for_a_family_that_does_not_take_it(
    tmp_path: Path, registry: object
) -> None:
    register_model("plain", "", matches=match_architectures("plain"))(Plain)
    path = write_gguf(tmp_path / "p.gguf", arch="plain")
    assert isinstance(LmRunnerBuilder(weights=path).build(), Plain)  # greedy: nothing to take
    with pytest.raises(UnsupportedError, match=r"sample: the 'plain' runner"):
        LmRunnerBuilder(weights=path, sample=SampleOpts(temperature=0.7)).build()


# -- packed_weights ---------------------------------------------------------------------------


def test_packed_weights_false_dequantises_every_quantised_tensor() -> None:
    packed = _bundled().build()
    auto_kinds = set(packed.dequantised_tensors.values())  # type: ignore[attr-defined]
    assert packed.packed is True  # type: ignore[attr-defined]
    assert _bundled().packed_weights(True).build().packed is True  # type: ignore[attr-defined]
    plain = _bundled().packed_weights(False).build()
    assert plain.packed is False  # type: ignore[attr-defined]
    kinds = plain.dequantised_tensors  # type: ignore[attr-defined]
    assert "Q8_0" in set(kinds.values()) - auto_kinds
    from rlx_lm._headers import read_gguf_header

    stored = {t.name for t in read_gguf_header(default_model_path()).tensors if t.ggml_type}
    assert set(kinds) == stored, "every tensor not stored as F32 is dequantised"
    a = np.asarray(packed.prefill_logits(PROMPT))  # type: ignore[attr-defined]
    b = np.asarray(plain.prefill_logits(PROMPT))  # type: ignore[attr-defined]
    np.testing.assert_allclose(a, b, atol=2e-3 * float(np.abs(a).max()))
    assert int(a.argmax()) == int(b.argmax())


def test_packed_weights_false_widens_half_precision_safetensors(tmp_path: Path) -> None:
    d = write_safetensors_dir(make_tiny(), tmp_path / "m", bf16=True)
    packed = LmRunnerBuilder(weights=d).build()
    plain = LmRunnerBuilder(weights=d, packed_weights=False).build()
    assert packed.dequantised_tensors == {}  # type: ignore[attr-defined]
    assert set(plain.dequantised_tensors.values()) == {"BF16"}  # type: ignore[attr-defined]
    assert plain.packed is False  # type: ignore[attr-defined]
    a = np.asarray(packed.prefill_logits([1, 2, 3]))  # type: ignore[attr-defined]
    b = np.asarray(plain.prefill_logits([1, 2, 3]))  # type: ignore[attr-defined]
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)  # BF16 widens exactly


def test_packed_weights_is_refused_for_a_family_that_does_not_report_it(
    tmp_path: Path, registry: object
) -> None:
    register_model("plain", "", matches=match_architectures("plain"))(Plain)
    path = write_gguf(tmp_path / "p.gguf", arch="plain")
    for on in (True, False):
        with pytest.raises(UnsupportedError, match=r"packed_weights: the 'plain' runner"):
            LmRunnerBuilder(weights=path, packed_weights=on).build()


# -- max_memory_gb ------------------------------------------------------------------------------


def _per_token() -> int:
    runner, _ = rlx_lm.load_default(max_seq=8)
    cfg = runner.cfg  # type: ignore[attr-defined]
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4


def test_max_memory_gb_caps_weights_plus_kv_cache() -> None:
    size = default_model_path().stat().st_size
    per_token = _per_token()
    cap = (size + 40 * per_token + 100) / 1e9  # room for 40 tokens of KV cache
    b = _bundled().max_memory_gb(cap)
    assert b.weights_bytes() == size
    assert b.fitting_max_seq() == 40
    assert b.max_seq(40).build().max_seq == 40  # type: ignore[attr-defined]
    with pytest.raises(InvalidOptionError, match=r"max_memory_gb: .* at most 40 tokens.*is 41"):
        b.max_seq(41).build()
    # load_model without max_seq picks the longest context that fits
    runner, _ = rlx_lm.load_model(default_model_path(), max_memory_gb=cap)
    assert runner.max_seq == 40  # type: ignore[attr-defined]
    # float16 KV halves a token's cost; dequantised weights take 4 bytes a weight
    assert b.kv_dtype("float16").fitting_max_seq() == 80
    assert b.packed_weights(False).weights_bytes() > 3 * size
    with pytest.raises(InvalidOptionError, match=r"max_memory_gb: the weights take"):
        b.packed_weights(False).build()
    with pytest.raises(InvalidOptionError, match=r"max_memory_gb: the weights take"):
        _bundled().max_memory_gb(size / 2e9).build()
    assert _bundled().fitting_max_seq() is None  # no cap, no bound


def test_max_memory_gb_needs_the_kv_geometry(tmp_path: Path, registry: object) -> None:
    register_model("plain", "", matches=match_architectures("plain"))(Plain)
    path = write_gguf(tmp_path / "p.gguf", arch="plain")
    with pytest.raises(UnsupportedError, match=r"max_memory_gb: .* geometry"):
        LmRunnerBuilder(weights=path, max_memory_gb=1.0).build()


def test_max_memory_gb_counts_safetensors_shards(tmp_path: Path) -> None:
    d = write_safetensors_dir(make_tiny(), tmp_path / "m", shards=2)
    files = sorted(d.glob("*.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * 4
    per_token *= cfg["hidden_size"] // cfg["num_attention_heads"]
    weights = sum(f.stat().st_size for f in files)
    b = LmRunnerBuilder(weights=d, max_memory_gb=(weights + 10 * per_token) / 1e9)
    assert b.weights_bytes() == weights
    assert b.fitting_max_seq() == 10
