"""SampleOpts: defaults, constructors, validation naming the field, into_chain."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rlx_lm import InvalidOptionError, MirostatMode, SampleOpts, SamplerChain


def test_defaults_are_greedy_and_classic() -> None:
    opts = SampleOpts()
    assert opts == SampleOpts.greedy()
    assert opts.is_greedy()
    assert opts.is_classic()
    assert opts.min_keep == 1
    assert opts.mirostat is MirostatMode.OFF
    assert opts.into_chain().is_greedy


def test_nucleus_sets_temperature_and_top_p() -> None:
    opts = SampleOpts.nucleus(0.7, 0.9)
    assert (opts.temperature, opts.top_p) == (0.7, 0.9)
    assert not opts.is_greedy()
    assert opts.is_classic()


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("top_p", {"top_p": 0.0}),
        ("top_p", {"top_p": 1.5}),
        ("top_p", {"top_p": math.nan}),
        ("top_k", {"top_k": -1}),
        ("min_keep", {"min_keep": 0}),
        ("dynamic_temp", {"dynamic_temp": (1.5, 0.5)}),
        ("dynamic_temp", {"dynamic_temp": (-0.1, 0.5)}),
        ("temperature", {"temperature": -0.1}),
        ("temperature", {"temperature": math.inf}),
        ("temperature", {"temperature": 0.5, "dynamic_temp": (0.2, 0.8)}),
        ("min_p", {"min_p": 1.2}),
        ("typical_p", {"typical_p": 0.0}),
        ("top_n_sigma", {"top_n_sigma": -1.0}),
        ("repetition_penalty", {"repetition_penalty": 0.0}),
        ("repetition_window", {"repetition_window": 0}),
        ("xtc_threshold", {"xtc_prob": 0.5, "xtc_threshold": 0.0}),
        ("xtc_prob", {"xtc_prob": 1.5}),
        ("dry_base", {"dry_base": 0.5}),
        ("dry_allowed_length", {"dry_allowed_length": 0}),
        ("dry_sequence_breakers", {"dry_sequence_breakers": (-1,)}),
        ("mirostat", {"mirostat": 3}),
        ("mirostat_m", {"mirostat_m": 1}),
        ("seed", {"seed": -5}),
        ("logit_bias", {"logit_bias": {1: math.nan}}),
        ("logit_bias", {"logit_bias": {1: math.inf}}),
        ("logit_bias", {"logit_bias": {-3: 1.0}}),
        ("frequency_penalty", {"frequency_penalty": math.nan}),
    ],
)
def test_invalid_values_raise_naming_the_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidOptionError, match=rf"^{field}:"):
        SampleOpts(**kwargs)  # type: ignore[arg-type]


def test_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SampleOpts(top_p=2.0)


def test_frozen_and_hashable_with_a_bias() -> None:
    a = SampleOpts(temperature=0.5, logit_bias={3: -1.0, 7: -math.inf}, seed=1)
    b = SampleOpts(temperature=0.5, logit_bias={7: -math.inf, 3: -1.0}, seed=1)
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.temperature = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.logit_bias[3] = 2.0  # type: ignore[index]


def test_is_classic_turns_off_for_any_advanced_knob() -> None:
    for kwargs in [
        {"min_p": 0.1},
        {"typical_p": 0.9},
        {"top_n_sigma": 1.0},
        {"xtc_prob": 0.5, "xtc_threshold": 0.1},
        {"dry_multiplier": 0.8},
        {"mirostat": MirostatMode.V2},
        {"frequency_penalty": 0.1},
        {"presence_penalty": 0.1},
        {"repetition_penalty": 1.1},
        {"dynamic_temp": (0.5, 1.5)},
        {"logit_bias": {1: 2.0}},
    ]:
        assert not SampleOpts(**kwargs).is_classic(), kwargs  # type: ignore[arg-type]


def test_into_chain_lists_the_stages_in_order() -> None:
    opts = SampleOpts(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=3)
    chain = opts.into_chain()
    assert isinstance(chain, SamplerChain)
    assert chain.stages == ["temperature", "top_k", "top_p", "min_p", "dist"]
    assert chain.seed == 3
    assert chain.order == "default"
    lc = opts.into_chain(order="llama.cpp")
    assert lc.stages == ["top_k", "top_p", "min_p", "temperature", "dist"]
    vllm = opts.into_chain(order="vllm")
    assert vllm.stages == ["temperature", "min_p", "top_k", "top_p", "dist"]


def test_a_missing_seed_is_drawn_and_reported() -> None:
    a = SampleOpts(temperature=1.0).into_chain()
    b = SampleOpts(temperature=1.0).into_chain()
    assert a.seed != b.seed


def test_sequence_id_is_checked() -> None:
    with pytest.raises(InvalidOptionError, match="sequence_id"):
        SampleOpts().into_chain(sequence_id=-1)
    assert SampleOpts().into_chain(sequence_id=2**64 - 1).sequence_id == 2**64 - 1


def test_unknown_order_and_stage_names_are_refused() -> None:
    opts = SampleOpts(temperature=1.0, top_k=5)
    with pytest.raises(InvalidOptionError, match="order: unknown preset"):
        opts.into_chain(order="transformers")
    with pytest.raises(InvalidOptionError, match="order: unknown stage"):
        opts.into_chain(order=["temperature", "topk"])
    with pytest.raises(InvalidOptionError, match="listed twice"):
        opts.into_chain(order=["temperature", "top_k", "top_k"])


def test_a_custom_order_must_include_every_knob_that_is_set() -> None:
    opts = SampleOpts(temperature=1.0, top_k=5, min_p=0.1)
    with pytest.raises(InvalidOptionError, match='"min_p" is set'):
        opts.into_chain(order=["temperature", "top_k"])
    chain = opts.into_chain(order=["min_p", "top_k", "temperature"])
    assert chain.stages == ["min_p", "top_k", "temperature", "dist"]
    assert chain.order == "custom"


def test_llama_cpp_mirostat_refuses_knobs_it_would_drop() -> None:
    opts = SampleOpts(mirostat=MirostatMode.V2, temperature=0.9, top_k=40)
    with pytest.raises(InvalidOptionError, match="top_k"):
        opts.into_chain(order="llama.cpp")
    chain = SampleOpts(mirostat=MirostatMode.V2, temperature=0.9).into_chain(order="llama.cpp")
    assert chain.stages == ["temperature", "mirostat_v2"]


def test_the_runner_contract() -> None:
    """A decode loop: peek (pure) then accept gives what sample (which accepts) gives."""
    rng = np.random.default_rng(0)
    opts = SampleOpts(temperature=0.9, top_k=50, top_p=0.9, seed=11)
    chain, twin = opts.into_chain(), opts.into_chain()
    history: list[int] = [1, 2, 3]
    for _ in range(20):
        logits = rng.standard_normal(500).astype(np.float32) * 3
        tok = chain.peek(logits, history)
        assert chain.peek(logits, np.asarray(history)) == tok
        chain.accept(tok)
        assert twin.sample(logits, history) == tok
        history.append(tok)
    assert chain.step == twin.step == 20


# The dataclass declares each knob's type and default for readers and type checkers; the
# core's table (rust/sampling/knobs.rs) is the one owner. This pins the two together.
_FIELD_TYPE_OF_KIND = {
    "float": "float",
    "int": "int",
    "int | None": "int | None",
    "pair | None": "tuple[float, float] | None",
    "tokens": "tuple[int, ...]",
    "mode": "MirostatMode",
    "seed": "int | None",
    "bias": "Mapping[int, float]",
}


def test_the_fields_are_the_core_knob_table() -> None:
    from rlx_lm import _core

    table = _core.SAMPLER_KNOBS
    fields = dataclasses.fields(SampleOpts)
    assert [f.name for f in fields] == [k["name"] for k in table]
    defaults = SampleOpts()
    for f, k in zip(fields, table, strict=True):
        assert f.type == _FIELD_TYPE_OF_KIND[k["kind"]], f.name
        value = getattr(defaults, f.name)
        if k["kind"] == "float":
            # The core holds float32; the field's default rounds to it.
            assert float(np.float32(value)) == k["default"], f.name
        else:
            assert value == k["default"], f.name


def test_stage_names_and_presets_come_from_the_core() -> None:
    from rlx_lm import _core
    from rlx_lm.sample_opts import ORDER_PRESETS, STAGE_NAMES

    assert tuple(s["name"] for s in _core.SAMPLER_STAGES) == STAGE_NAMES
    assert ORDER_PRESETS == ("default", "llama.cpp", "hf", "vllm")
    assert _core.SAMPLER_PRESETS["default"] == STAGE_NAMES
    for name, order in _core.SAMPLER_PRESETS.items():
        assert sorted(order) == sorted(STAGE_NAMES), name


class _Duck:
    """Options that skip SampleOpts' constructor: the chain's own check must refuse them."""

    def __init__(self, **kw: object) -> None:
        for f in dataclasses.fields(SampleOpts):
            setattr(self, f.name, kw.get(f.name, getattr(SampleOpts(), f.name)))


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("temperature", {"temperature": 0.5, "dynamic_temp": (0.2, 0.8)}),
        ("min_keep", {"temperature": 1.0, "min_keep": 2}),
        ("top_p", {"top_p": 0.0}),
        ("dry_max_ngram", {"dry_max_ngram": -1}),
    ],
)
def test_sample_opts_and_the_chain_refuse_alike(field: str, kwargs: dict[str, object]) -> None:
    # One validator: the same message whether SampleOpts or a chain sees the value.
    with pytest.raises(InvalidOptionError, match=rf"^{field}:") as by_opts:
        SampleOpts(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=rf"^{field}:") as by_chain:
        SamplerChain(_Duck(**kwargs))
    assert str(by_opts.value) == str(by_chain.value)


def test_type_errors_name_the_field_and_the_type() -> None:
    with pytest.raises(InvalidOptionError, match=r"^top_p: must be a number, got str"):
        SampleOpts(top_p="0.5")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=r"^dry_allowed_length: must be an integer"):
        SampleOpts(dry_allowed_length=2.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=r"^temperature: must be a number, got bool"):
        SampleOpts(temperature=True)
