"""LmRunnerBuilder, ConfigSource and Device: defaults, setters, resolution and build()."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from third_party import needs_toy
from weight_files import write_gguf, write_safetensors

import rlx_lm
from rlx_lm import (
    ConfigSource,
    Device,
    HostDriven,
    InvalidOptionError,
    LmRunnerBuilder,
    ModelRegistration,
    SampleOpts,
    UnknownArchitectureError,
    UnsupportedError,
    WeightFormat,
    WeightFormatError,
    match_architectures,
    register_model,
    with_defaults,
)
from rlx_lm import registry as reg_module
from rlx_lm.builder import PACKED_GGUF_AUTO_THRESHOLD_BYTES, _Fields


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> reg_module._Registry:
    fresh = reg_module._Registry(builtins=(), group="rlx_lm.tests.no_such_group")
    monkeypatch.setattr(reg_module, "_registry", fresh)
    return fresh


# -- ConfigSource and Device -------------------------------------------------------------


def test_config_sources() -> None:
    assert ConfigSource.Embedded() == ConfigSource.Embedded()
    src = ConfigSource.JsonFile("cfg/config.json")
    assert src.path == Path("cfg/config.json")
    assert ConfigSource.Explicit({"n_layer": 2}).value == {"n_layer": 2}
    for s in (ConfigSource.Embedded(), src, ConfigSource.Explicit(1)):
        assert isinstance(s, ConfigSource)
    with pytest.raises(TypeError, match="Embedded"):
        ConfigSource()


def test_device_parse() -> None:
    assert Device.parse(" CPU ") is Device.CPU
    assert str(Device.CPU) == "cpu"
    with pytest.raises(InvalidOptionError, match="device: expected cpu, got 'tpu'"):
        Device.parse("tpu")


# -- defaults and setters -----------------------------------------------------------------


def test_defaults_match_the_seed() -> None:
    b = LmRunnerBuilder()
    assert b.weights() is None
    assert b.config() == ConfigSource.Embedded()
    assert b.device() is Device.CPU
    assert b.max_seq() == 128
    assert b.max_memory_gb() is None
    assert b.stream() is True
    assert b.format() is None
    assert b.packed_weights() is None
    assert b.prefer_gguf() is None
    assert b.kv_dtype() == "float32"


def test_sampling_defaults_to_greedy_and_takes_sample_opts() -> None:
    b = LmRunnerBuilder()
    assert b.sample() == SampleOpts.greedy()
    assert b.sample().is_greedy()
    hot = SampleOpts(temperature=0.8, top_p=0.9)
    assert b.sample(hot).sample() is hot
    assert b.sample().is_greedy(), "the original keeps greedy"
    with pytest.raises(TypeError, match="sample: expected SampleOpts, got dict"):
        b.sample({"temperature": 0.8})  # type: ignore[call-overload]


def test_setters_return_a_changed_copy_and_getters_read(tmp_path: Path) -> None:
    base = LmRunnerBuilder()
    b = (
        base.weights(tmp_path / "m.gguf")
        .config(ConfigSource.JsonFile(tmp_path / "config.json"))
        .device("cpu")
        .max_seq(512)
        .max_memory_gb(3)
        .stream(True)
        .sample(SampleOpts(temperature=0.5))
        .format("gguf")
        .packed_weights(True)
        .prefer_gguf("Q8_0")
        .kv_dtype("float16")
    )
    assert b.weights() == tmp_path / "m.gguf"
    assert b.config() == ConfigSource.JsonFile(tmp_path / "config.json")
    assert b.device() is Device.CPU
    assert b.max_seq() == 512
    assert b.max_memory_gb() == 3.0
    assert b.stream() is True  # False is refused: tests/test_builder_settings.py
    assert b.sample() == SampleOpts(temperature=0.5)
    assert b.format() is WeightFormat.GGUF
    assert b.packed_weights() is True
    assert b.prefer_gguf() == "Q8_0"
    assert b.kv_dtype() == "float16"
    assert base == LmRunnerBuilder(), "the original builder is untouched"
    assert b != base
    assert "max_seq=512" in repr(b)
    assert b.config_value({"dim": 8}).config() == ConfigSource.Explicit({"dim": 8})
    cleared = (
        b.weights(None).format(None).packed_weights(None).prefer_gguf(None).max_memory_gb(None)
    )
    assert (cleared.weights(), cleared.format(), cleared.packed_weights()) == (None, None, None)
    assert (cleared.prefer_gguf(), cleared.max_memory_gb()) == (None, None)


@pytest.mark.parametrize(
    ("setter", "value", "pattern"),
    [
        ("max_seq", 0, "max_seq must be a positive integer"),
        ("max_seq", 2.5, "max_seq"),
        ("max_seq", True, "max_seq"),
        ("max_memory_gb", -1.0, "max_memory_gb"),
        ("max_memory_gb", float("nan"), "max_memory_gb"),
        ("stream", 1, "stream must be True or False"),
        ("packed_weights", "yes", "packed_weights"),
        ("prefer_gguf", "  ", "prefer_gguf"),
        ("format", "onnx", "format: expected"),
        ("device", "gpu", "device: expected"),
        ("kv_dtype", "bfloat16", "kv_dtype must be"),
    ],
)
def test_bad_settings_are_refused(setter: str, value: object, pattern: str) -> None:
    with pytest.raises(InvalidOptionError, match=pattern):
        getattr(LmRunnerBuilder(), setter)(value)


def test_config_wants_a_source() -> None:
    with pytest.raises(TypeError, match="config_value"):
        LmRunnerBuilder().config({"dim": 8})  # type: ignore[call-overload]


# -- resolution ----------------------------------------------------------------------------


def test_resolved_format_needs_weights_or_an_explicit_format(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="weights"):
        LmRunnerBuilder().resolved_format()
    assert LmRunnerBuilder().format("mlx").resolved_format() is WeightFormat.MLX
    gguf_named_bin = write_gguf(tmp_path / "model.bin")
    assert LmRunnerBuilder().weights(gguf_named_bin).resolved_format() is WeightFormat.GGUF


def test_packed_auto_size_threshold(tmp_path: Path) -> None:
    b = LmRunnerBuilder().weights("/nonexistent/file.gguf")
    assert not b.resolved_packed(WeightFormat.GGUF), "missing file: no size, no packing"
    assert b.packed_weights(True).resolved_packed(WeightFormat.GGUF), "explicit wins"
    assert not b.resolved_packed(WeightFormat.SAFETENSORS)

    small = write_gguf(tmp_path / "small.gguf")
    assert not LmRunnerBuilder().weights(small).resolved_packed()
    big = tmp_path / "big.gguf"
    big.write_bytes(small.read_bytes())
    with open(big, "r+b") as f:
        f.truncate(PACKED_GGUF_AUTO_THRESHOLD_BYTES)  # sparse: no disk used
    assert LmRunnerBuilder().weights(big).resolved_packed()
    assert not LmRunnerBuilder().weights(big).packed_weights(False).resolved_packed()
    with open(big, "r+b") as f:
        f.truncate(PACKED_GGUF_AUTO_THRESHOLD_BYTES - 1)
    assert not LmRunnerBuilder().weights(big).resolved_packed()


def test_picking_one_gguf_from_a_directory(tmp_path: Path) -> None:
    for name in ("m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf"):
        write_gguf(tmp_path / name)
    b = LmRunnerBuilder().weights(tmp_path)
    assert b.resolved_format() is WeightFormat.GGUF
    assert b.resolved_weights() == tmp_path / "m-Q4_K_M.gguf", "Q4_K_M by default"
    assert b.prefer_gguf("q8_0").resolved_weights() == tmp_path / "m-Q8_0.gguf"
    with pytest.raises(WeightFormatError, match=r"2 GGUF files match 'q4_k'.*m-Q4_K_M"):
        b.prefer_gguf("Q4_K").resolved_weights()
    with pytest.raises(WeightFormatError, match=r"none matches 'iq2'; pick one"):
        b.prefer_gguf("IQ2").resolved_weights()


def test_a_split_gguf_is_picked_by_its_first_part(tmp_path: Path) -> None:
    for i in (1, 2):
        write_gguf(tmp_path / f"big-0000{i}-of-00002.gguf")
    assert LmRunnerBuilder().weights(tmp_path).resolved_weights().name == "big-00001-of-00002.gguf"


# -- build through the registry ----------------------------------------------------------------


class Tiny:
    """A runner built from a builder: records what the loader received."""

    family = "tiny"
    vocab_size = 4

    def __init__(self, builder: LmRunnerBuilder) -> None:
        self.builder = builder

    def predict_logits(self, prompt_ids: list[int]) -> list[float]:
        return [0.0, 1.0, 0.0, 0.0]


def test_build_dispatches_on_the_gguf_architecture(tmp_path: Path, registry: object) -> None:
    register_model("tiny", "tiny test family", matches=match_architectures("tiny"))(Tiny)
    write_gguf(tmp_path / "a-Q8_0.gguf", arch="Tiny")
    write_gguf(tmp_path / "a-Q4_K_M.gguf", arch="Tiny")
    runner = LmRunnerBuilder().weights(tmp_path).max_seq(64).build()
    assert isinstance(runner, Tiny)
    # The loader sees the concrete file and format, and every other setting.
    assert runner.builder.weights() == tmp_path / "a-Q4_K_M.gguf"
    assert runner.builder.format() is WeightFormat.GGUF
    assert runner.builder.max_seq() == 64
    assert with_defaults(runner).generate([0], 3) == [1, 1, 1]


def test_build_dispatches_on_config_model_type(tmp_path: Path, registry: object) -> None:
    register_model("tiny", "", matches=match_architectures("llama"))(Tiny)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "LLAMA"}))
    write_safetensors(tmp_path / "model.safetensors")
    runner = LmRunnerBuilder().weights(tmp_path).build()
    assert isinstance(runner, Tiny)
    assert runner.builder.format() is WeightFormat.MLX


def test_build_errors(tmp_path: Path, registry: object) -> None:
    path = write_gguf(tmp_path / "g.gguf", arch="gemma3")
    register_model(ModelRegistration("llama", "", match_architectures("llama")))
    with pytest.raises(UnknownArchitectureError, match=r"'gemma3'.*families: llama"):
        LmRunnerBuilder().weights(path).build()
    register_model(ModelRegistration("nolo", "", match_architectures("gemma3")))
    with pytest.raises(UnsupportedError, match="without a loader"):
        LmRunnerBuilder().weights(path).build()
    register_model(
        ModelRegistration("nolo", "", match_architectures("gemma3"), load=lambda b: object()),
        replace=True,
    )
    with pytest.raises(TypeError, match="lacks family"):
        LmRunnerBuilder().weights(path).build()
    with pytest.raises(WeightFormatError, match="no such file"):
        LmRunnerBuilder().weights(tmp_path / "absent").format("mlx").build()


@needs_toy
def test_build_the_third_party_runner_from_its_entry_point(tmp_path: Path) -> None:
    from rlx_toy_runner import ToyRunner, write_toy_gguf

    path = tmp_path / "toy.gguf"
    write_toy_gguf(path, vocab=12, seed=3)
    runner = LmRunnerBuilder().weights(path).max_seq(40).build()
    assert isinstance(runner, ToyRunner)
    assert runner.max_seq == 40
    assert rlx_lm.auto_runner_name("rlxtoy", path) == "rlxtoy"
    # Its own cached pair and the generic greedy loop agree.
    want = with_defaults(runner).generate([1, 2], 8)
    wrapped = HostDriven(runner)
    logits = wrapped.prefill_logits([1, 2])
    got = []
    for _ in range(8):
        got.append(int(np.argmax(logits)))
        logits = wrapped.decode_logits(got[-1])
    assert got == want
    assert not wrapped.fell_back()


# -- keyword construction and the dropped-copy guard (issue 14) ---------------------------


def test_every_setting_is_a_constructor_keyword_validated_by_its_setter(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    kw = {
        "weights": path,
        "config": ConfigSource.JsonFile("c.json"),
        "device": "cpu",
        "max_seq": 512,
        "max_memory_gb": 2,
        "stream": True,
        "sample": SampleOpts(temperature=0.7, seed=1),
        "format": "gguf",
        "packed_weights": False,
        "prefer_gguf": "Q8_0",
        "kv_dtype": "float16",
        "threads": 2,
        "activations": "q8",
        "use_mmap": False,
    }
    built = LmRunnerBuilder(**kw)  # type: ignore[arg-type]
    chained = LmRunnerBuilder()
    for name, value in kw.items():
        chained = getattr(chained, name)(value)
    assert built == chained
    assert built.max_seq() == 512
    assert built.device() is Device.CPU
    assert built.threads() == 2
    # Every setting the builder has is a keyword (the test above covers them all).
    assert set(kw) == {f.name for f in fields(_Fields)}
    with pytest.raises(InvalidOptionError, match="max_seq"):
        LmRunnerBuilder(max_seq=0)
    with pytest.raises(InvalidOptionError, match="kv_dtype"):
        LmRunnerBuilder(kv_dtype="int8")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LmRunnerBuilder(max_sequence=512)  # type: ignore[call-arg]
    # None keeps its meaning for the settings where None is a value.
    assert LmRunnerBuilder(threads=None, max_memory_gb=None) == LmRunnerBuilder()


SETTERS = [
    ("weights", "m.gguf"),
    ("config", ConfigSource.Embedded()),
    ("config_value", {"n_layer": 2}),
    ("device", "cpu"),
    ("max_seq", 512),
    ("max_memory_gb", 1.5),
    ("stream", True),
    ("sample", SampleOpts.greedy()),
    ("format", "gguf"),
    ("packed_weights", True),
    ("prefer_gguf", "Q8_0"),
    ("kv_dtype", "float16"),
    ("threads", 2),
]


@pytest.mark.parametrize(("name", "value"), SETTERS)
def test_a_setter_whose_copy_is_discarded_is_refused_where_it_is_written(
    name: str, value: object
) -> None:
    b = LmRunnerBuilder()
    # `b.max_seq(512)` as a statement changed nothing and the build got 128.
    with pytest.raises(InvalidOptionError, match=rf"{name}\(\.\.\.\).*discarded"):
        getattr(b, name)(value)
    assert b == LmRunnerBuilder()
    # The same call kept is fine: assigned, chained, passed on, returned, or evaluated.
    kept = getattr(b, name)(value)
    assert getattr(b, name)(value) == kept
    both = [getattr(b, name)(value)]
    assert both == [kept]
    assert eval(f"b.{name}(value)", {"b": b, "value": value}) == kept


def test_the_guard_reads_the_statement_not_the_chain() -> None:
    b = LmRunnerBuilder()
    with pytest.raises(InvalidOptionError, match=r"threads\(\.\.\.\)"):
        b.max_seq(512).threads(2)  # the last copy is the one thrown away
    code = "b = b.max_seq(512)\nc = b.threads(2)\n"
    scope: dict[str, object] = {"b": b}
    exec(compile(code, "<user>", "exec"), scope)
    assert scope["c"] == LmRunnerBuilder(max_seq=512, threads=2)
    with pytest.raises(InvalidOptionError, match="discarded"):
        exec(compile("b.max_seq(64)\n", "<user>", "exec"), {"b": b})
    # Reading a setting is never refused, statement or not.
    b.max_seq()
    b.weights()
