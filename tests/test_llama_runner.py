"""LlamaRunner: cached decode, sessions, prefix reuse, loading paths and error behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from llama_reference import reference_logits
from model_factory import TinyModel, make_tiny, write_gguf, write_safetensors_dir

from rlx_lm.errors import (
    CapacityError,
    SequenceStateError,
    SnapshotMismatchError,
    TokenOutOfRangeError,
    UnsupportedError,
    WeightFormatError,
)
from rlx_lm.runner import greedy_generate
from rlx_lm.runners.llama import LlamaRunner, load_llama
from rlx_lm.session import SessionSnapshot

PROMPT = [3, 17, 42, 8, 99, 5, 61]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def model(request: pytest.FixtureRequest) -> TinyModel:
    return make_tiny(request.param, seed=21, tie=request.param == "qwen3")


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory, model: TinyModel) -> Path:
    return write_gguf(model, tmp_path_factory.mktemp("g") / "m.gguf")


def _runner(path: Path, max_seq: int = 64, chunk: int = 3) -> LlamaRunner:
    return load_llama(path, max_seq=max_seq, chunk=chunk)


def test_cached_decode_equals_full_reprefill_at_every_step(
    model: TinyModel, gguf_path: Path
) -> None:
    runner = _runner(gguf_path)
    logits = runner.prefill_logits(PROMPT)
    context = list(PROMPT)
    for _ in range(10):
        np.testing.assert_allclose(logits, runner.predict_logits(context), rtol=0, atol=2e-5)
        tok = int(np.argmax(logits))
        context.append(tok)
        logits = runner.decode_logits(tok)
    assert runner.tokens == tuple(context)
    # and the whole sequence against the independent float64 reference
    ref = reference_logits(model.config, model.tensors, context)
    np.testing.assert_allclose(logits, ref[-1], rtol=0, atol=1e-4 * np.abs(ref).max())


def test_greedy_generate_matches_greedy_by_reprefill(gguf_path: Path) -> None:
    runner = _runner(gguf_path)
    seen: list[int] = []
    got = runner.generate(PROMPT, 8, lambda t: seen.append(t) is None)
    assert got == greedy_generate(_runner(gguf_path), PROMPT, 8)
    assert seen == got
    stopped = runner.generate(PROMPT, 8, lambda t: len(seen) < 0)
    assert stopped == got[:1], "on_token returning False keeps that token, then stops"


def test_snapshot_restore_decode_equals_a_fresh_run(gguf_path: Path) -> None:
    runner = _runner(gguf_path)
    runner.prefill_logits(PROMPT)
    snap = runner.export_session()
    a = [runner.decode_logits(t) for t in (1, 2, 3)]
    runner.restore_session(snap)
    b = [runner.decode_logits(t) for t in (7, 8)]  # a different continuation
    runner.restore_session(snap)
    c = [runner.decode_logits(t) for t in (1, 2, 3)]
    fresh = _runner(gguf_path)
    fresh.prefill_logits(PROMPT)
    want_a = [fresh.decode_logits(t) for t in (1, 2, 3)]
    fresh.prefill_logits(PROMPT)
    want_b = [fresh.decode_logits(t) for t in (7, 8)]
    for got, want in zip(a + b + c, want_a + want_b + want_a, strict=True):
        np.testing.assert_array_equal(got, want)
    assert snap.tokens == tuple(PROMPT)


@pytest.mark.parametrize("reuse", [0, 1, 4, 7])
def test_prefill_reusing_a_snapshot_equals_a_fresh_prefill(gguf_path: Path, reuse: int) -> None:
    runner = _runner(gguf_path)
    runner.prefill_logits(PROMPT)
    snap = runner.export_session()
    longer = [*PROMPT[:reuse], 11, 12, 13] if reuse < len(PROMPT) else list(PROMPT)
    got = runner.prefill_logits_reusing(longer, snap, reuse)
    want = _runner(gguf_path).prefill_logits(longer)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert runner.tokens == tuple(longer)
    np.testing.assert_allclose(
        runner.decode_logits(4), _runner(gguf_path).predict_logits([*longer, 4]), atol=2e-5
    )


def test_a_foreign_snapshot_is_refused_and_changes_nothing(gguf_path: Path, tmp_path: Path) -> None:
    other = _runner(write_gguf(make_tiny("llama", seed=99), tmp_path / "o.gguf"))
    other.prefill_logits(PROMPT)
    foreign = other.export_session()
    runner = _runner(gguf_path)
    runner.prefill_logits(PROMPT[:3])
    with pytest.raises(SnapshotMismatchError):
        runner.restore_session(foreign)
    with pytest.raises(SnapshotMismatchError):
        runner.prefill_logits_reusing(PROMPT, foreign, 3)
    anonymous = SessionSnapshot(foreign.kv, foreign.tokens, None)
    with pytest.raises(SnapshotMismatchError, match="no model fingerprint"):
        runner.restore_session(anonymous)
    assert runner.tokens == tuple(PROMPT[:3])
    np.testing.assert_allclose(
        runner.decode_logits(5), runner.predict_logits([*PROMPT[:3], 5]), atol=2e-5
    )


def test_bad_calls_raise_typed_errors_and_leave_the_session_as_it_was(gguf_path: Path) -> None:
    runner = _runner(gguf_path, max_seq=10)
    with pytest.raises(SequenceStateError, match="before prefill"):
        runner.decode_logits(1)
    runner.prefill_logits(PROMPT)
    with pytest.raises(TokenOutOfRangeError, match="outside the vocabulary"):
        runner.decode_logits(runner.vocab_size)
    with pytest.raises(TokenOutOfRangeError):
        runner.prefill_logits([1, -2])
    with pytest.raises(CapacityError, match="max_seq=10"):
        runner.prefill_logits(list(range(11)))
    assert runner.tokens == tuple(PROMPT)
    for t in (1, 2, 3):
        runner.decode_logits(t)
    with pytest.raises(CapacityError):
        runner.decode_logits(4)
    want = _runner(gguf_path).predict_logits([*PROMPT, 1, 2])
    runner.restore_session(runner.export_session())
    assert runner.tokens == (*PROMPT, 1, 2, 3)
    runner.prefill_logits([*PROMPT, 1, 2])
    np.testing.assert_allclose(
        runner.decode_logits(3), _runner(gguf_path).predict_logits([*PROMPT, 1, 2, 3]), atol=2e-5
    )
    assert want.shape == (runner.vocab_size,)
    assert runner.kv_store_stats() is None
    assert not runner.supports_multimodal()
    with pytest.raises(UnsupportedError):
        runner.generate_multimodal("x", b"", 0, 0, None, 1)


def test_every_path_kind_loads_the_same_model(tmp_path: Path) -> None:
    m = make_tiny("mistral", seed=5)
    d = write_safetensors_dir(m, tmp_path / "hf")
    want = reference_logits(m.config, m.tensors, PROMPT)[-1]
    paths = [d, d / "model.safetensors", write_gguf(m, tmp_path / "m.gguf")]
    for p in paths:
        got = load_llama(p).predict_logits(PROMPT)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    # a lone safetensors file with its config passed explicitly
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "w.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    with pytest.raises(WeightFormatError, match=r"no config\.json"):
        load_llama(lone / "w.safetensors")
    got = load_llama(lone / "w.safetensors", config=d / "config.json").predict_logits(PROMPT)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    got = load_llama(lone / "w.safetensors", config=m.config).predict_logits(PROMPT)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_unknown_architecture_unsupported_quant_and_bad_paths_say_what_is_wrong(
    tmp_path: Path,
) -> None:
    m = make_tiny("llama", seed=5)
    with pytest.raises(UnsupportedError, match="'gpt2'"):
        load_llama(write_gguf(m, tmp_path / "a.gguf", arch_override="gpt2"))
    d = write_safetensors_dir(m, tmp_path / "d")
    (d / "config.json").write_text(json.dumps(m.config | {"model_type": "falcon"}))
    with pytest.raises(UnsupportedError, match="falcon"):
        load_llama(d)
    with pytest.raises(WeightFormatError, match="no such file"):
        load_llama(tmp_path / "missing.gguf")
    # a Q8_1 tensor: valid GGUF, a type with no kernel that gguf.quants cannot decode either;
    # refused from the header, naming the tensor and its type, before anything is built.
    q81 = gguf.GGMLQuantizationType.Q8_1
    w = gguf.GGUFWriter(str(tmp_path / "q81.gguf"), "llama")
    w.add_tensor("token_embd.weight", np.zeros((128, 40), dtype=np.uint8), raw_dtype=q81)
    for key, val in (
        ("block_count", 1),
        ("embedding_length", 32),
        ("feed_forward_length", 64),
        ("attention.head_count", 4),
    ):
        w.add_uint32(f"llama.{key}", val)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match=r"token_embd\.weight uses quant type Q8_1.*Q8_0"):
        load_llama(tmp_path / "q81.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 40)
    with pytest.raises(WeightFormatError):
        load_llama(tmp_path / "junk.gguf")


def test_fingerprints_tell_models_apart(tmp_path: Path) -> None:
    a = load_llama(write_gguf(make_tiny("llama", seed=1), tmp_path / "a.gguf"))
    b = load_llama(write_gguf(make_tiny("llama", seed=2), tmp_path / "b.gguf"))
    a2 = load_llama(tmp_path / "a.gguf")
    assert a.fingerprint == a2.fingerprint
    assert a.fingerprint != b.fingerprint


def test_the_builder_picks_this_runner_for_every_layout(tmp_path: Path) -> None:
    from rlx_lm import ConfigSource, LmRunnerBuilder
    from rlx_lm.errors import UnknownArchitectureError

    m = make_tiny("qwen2", seed=6)
    want = reference_logits(m.config, m.tensors, PROMPT)[-1]
    d = write_safetensors_dir(m, tmp_path / "hf")
    g = (
        write_gguf(m, tmp_path / "ggufs" / "m-Q8_0.gguf")
        if (tmp_path / "ggufs").mkdir() is None
        else None
    )
    assert g is not None
    for path in (d, d / "model.safetensors", g, tmp_path / "ggufs"):
        runner = LmRunnerBuilder().weights(path).max_seq(32).build()
        assert isinstance(runner, LlamaRunner), path
        assert runner.max_seq == 32
        np.testing.assert_allclose(runner.predict_logits(PROMPT), want, rtol=0, atol=1e-4)
    half = LmRunnerBuilder().weights(g).max_seq(32).kv_dtype("float16").build()
    assert isinstance(half, LlamaRunner)
    assert half.kv_dtype == "float16"
    np.testing.assert_allclose(half.prefill_logits(PROMPT), want, rtol=0, atol=2e-2)
    assert half.export_session().kv.dtype == "float16"
    cfg_file = tmp_path / "elsewhere.json"
    cfg_file.write_text(json.dumps(m.config))
    (d / "config.json").write_text(json.dumps(m.config | {"rope_theta": 1.0}))
    from_json = LmRunnerBuilder().weights(d).config(ConfigSource.JsonFile(cfg_file)).build()
    np.testing.assert_allclose(from_json.predict_logits(PROMPT), want, rtol=0, atol=1e-4)
    explicit = LmRunnerBuilder().weights(d).config(ConfigSource.Explicit(m.config)).build()
    np.testing.assert_allclose(explicit.predict_logits(PROMPT), want, rtol=0, atol=1e-4)
    embedded = LmRunnerBuilder().weights(d).build()
    assert not np.allclose(embedded.predict_logits(PROMPT), want, atol=1e-4), "config.json used"
    q8 = write_gguf(m, tmp_path / "q8.gguf", qtype="Q8_0")
    packed = LmRunnerBuilder().weights(q8).packed_weights(True).build()
    dense = LmRunnerBuilder().weights(q8).packed_weights(False).build()
    assert isinstance(packed, LlamaRunner)
    assert isinstance(dense, LlamaRunner)
    # packed: used as stored; not packed: every quantised tensor dequantised to float32
    assert packed.dequantised_tensors == {}
    assert packed.packed
    assert not dense.packed
    assert dense.dequantised_tensors
    assert set(dense.dequantised_tensors.values()) == {"Q8_0"}
    a, b = packed.predict_logits(PROMPT), dense.predict_logits(PROMPT)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-3 * float(np.abs(a).max()))
    odd = write_gguf(m, tmp_path / "odd.gguf", arch_override="rwkv6")
    with pytest.raises(UnknownArchitectureError, match="llama"):
        LmRunnerBuilder().weights(odd).build()


def test_float16_kv_cache_stays_close_and_refuses_float32_snapshots(gguf_path: Path) -> None:
    f16 = load_llama(gguf_path, max_seq=32, kv_dtype="float16")
    f32 = _runner(gguf_path, max_seq=32)
    a, b = f16.prefill_logits(PROMPT), f32.prefill_logits(PROMPT)
    # keys/values rounded to 11 significant bits: logits move by ~1e-3 of their range
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-2 * np.abs(b).max())
    for t in (4, 9, 2):
        a, b = f16.decode_logits(t), f32.decode_logits(t)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-2 * np.abs(b).max())
    np.testing.assert_allclose(a, f16.predict_logits([*PROMPT, 4, 9, 2]), rtol=0, atol=1e-5)
    with pytest.raises(SnapshotMismatchError, match="float"):
        f32.restore_session(f16.export_session())
