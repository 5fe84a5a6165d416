"""SampleOpts and SamplerChain travel to other processes: pickle, copy, asdict, to_dict."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings

from rlx_lm import InvalidOptionError, MirostatMode, RlxError, SampleOpts, SamplerChain
from rlx_lm._core import _sampler_chain_from_state
from rlx_lm.testing.strategies import sample_opts

RICH = SampleOpts(
    temperature=0.8,
    top_k=40,
    top_p=0.9,
    min_p=0.05,
    dry_multiplier=0.8,
    dry_sequence_breakers=(1, 2),
    repetition_penalty=1.1,
    logit_bias={3: -1.5, 7: -math.inf},
    seed=42,
)


def test_sample_opts_pickles_copies_and_round_trips_asdict() -> None:
    for opts in (SampleOpts(), RICH, SampleOpts(mirostat=MirostatMode.V2, dynamic_temp=(0.5, 1.5))):
        assert pickle.loads(pickle.dumps(opts)) == opts
        assert copy.deepcopy(opts) == opts
        assert copy.copy(opts) == opts
        assert SampleOpts(**dataclasses.asdict(opts)) == opts
        assert SampleOpts.from_dict(opts.to_dict()) == opts
        assert SampleOpts.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
        assert hash(pickle.loads(pickle.dumps(opts))) == hash(opts)


def test_to_dict_is_plain_data() -> None:
    d = RICH.to_dict()
    assert type(d["logit_bias"]) is dict
    assert d["logit_bias"] == {3: -1.5, 7: -math.inf}
    assert d["dry_sequence_breakers"] == [1, 2]
    assert type(d["mirostat"]) is int
    assert set(d) == {f.name for f in dataclasses.fields(SampleOpts)}


def test_the_bias_stays_read_only_after_a_round_trip() -> None:
    back = pickle.loads(pickle.dumps(RICH))
    with pytest.raises(TypeError, match="read-only"):
        back.logit_bias[3] = 2.0
    with pytest.raises(TypeError, match="read-only"):
        back.logit_bias.update({1: 1.0})
    assert back.logit_bias == {3: -1.5, 7: -math.inf}


def test_from_dict_refuses_unknown_fields_and_validates() -> None:
    with pytest.raises(InvalidOptionError, match=r"^topp: is not a SampleOpts field"):
        SampleOpts.from_dict({"topp": 0.5})
    with pytest.raises(InvalidOptionError, match=r"^top_p:"):
        SampleOpts.from_dict({"top_p": 2.0})
    with pytest.raises(InvalidOptionError, match=r"^logit_bias: keys must be token ids"):
        SampleOpts.from_dict({"logit_bias": {"x": 1.0}})
    assert SampleOpts.from_dict({}) == SampleOpts()


def test_an_unpickled_options_value_is_validated() -> None:
    # A pickle is data from elsewhere: it goes through the same checks as new options.
    bad = pickle.dumps(SampleOpts()).replace(b"top_p", b"top_q")
    with pytest.raises(InvalidOptionError, match="top_q"):
        pickle.loads(bad)


@settings(max_examples=40, deadline=None)
@given(sample_opts(vocab_size=64))
def test_any_valid_options_round_trip(opts: SampleOpts) -> None:
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert SampleOpts.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    assert SampleOpts(**dataclasses.asdict(opts)) == opts


def _row(seed: int, vocab: int = 300) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * 3).astype(np.float32)


@pytest.mark.parametrize(
    ("opts", "order"),
    [
        (RICH, None),
        (RICH, "hf"),
        (SampleOpts(temperature=1.0, top_k=5, seed=9), ["top_k", "temperature"]),
        (SampleOpts(mirostat=MirostatMode.V2, temperature=1.0, seed=5), None),
        (SampleOpts(mirostat=MirostatMode.V1, temperature=1.0, seed=5), None),
    ],
)
def test_a_chain_pickles_with_its_state(opts: SampleOpts, order: str | list[str] | None) -> None:
    chain = opts.into_chain(order, sequence_id=3)
    history: list[int] = [1, 2, 3]
    for i in range(5):
        tok = chain.sample(_row(i), history)
        history.append(tok)
    for twin in (pickle.loads(pickle.dumps(chain)), copy.deepcopy(chain)):
        assert isinstance(twin, SamplerChain)
        assert (twin.step, twin.seed, twin.sequence_id, twin.mu) == (
            chain.step,
            chain.seed,
            chain.sequence_id,
            chain.mu,
        )
        assert (twin.stages, twin.order) == (chain.stages, chain.order)
    twin = pickle.loads(pickle.dumps(chain))
    # Both go on to draw the same tokens, mirostat's mu included.
    for i in range(5, 12):
        a, b = chain.sample(_row(i), history), twin.sample(_row(i), history)
        assert a == b
        history.append(a)
        assert chain.mu == twin.mu


def test_a_pickled_chain_keeps_what_the_last_sample_left_for_accept() -> None:
    chain = SampleOpts(mirostat=MirostatMode.V2, temperature=1.0, seed=5).into_chain()
    tok = chain.peek(_row(0))
    twin = pickle.loads(pickle.dumps(chain))
    chain.accept(tok)
    twin.accept(tok)
    assert twin.mu == chain.mu != 10.0
    # And the vocabulary seen, which bounds accept.
    with pytest.raises(RlxError):
        pickle.loads(pickle.dumps(SampleOpts().into_chain())).accept(-1)
    fresh = SampleOpts(temperature=1.0, seed=1).into_chain()
    fresh.sample(np.zeros(10, np.float32))
    with pytest.raises(RlxError, match="out of range"):
        pickle.loads(pickle.dumps(fresh)).accept(10)


def _state(chain: SamplerChain) -> bytes:
    fn, (state,) = chain.__reduce__()
    assert fn is _sampler_chain_from_state
    assert isinstance(state, bytes)
    return state


def test_a_hostile_state_is_refused_without_reserving_memory() -> None:
    state = _state(SampleOpts(seed=1).into_chain())
    for n in range(len(state)):
        with pytest.raises(RlxError, match="not a sampler chain state"):
            _sampler_chain_from_state(state[:n])
    # A count of 2**62 bias entries in a small state: refused by its size, not tried.
    at = _value_at(state, "logit_bias") + 1  # after the value's tag (a mapping)
    assert state[at : at + 8] == struct.pack("<Q", 0)
    forged = state[:at] + struct.pack("<Q", 2**62) + state[at + 8 :]
    with pytest.raises(RlxError, match="claims"):
        _sampler_chain_from_state(forged)
    with pytest.raises(RlxError, match="not a sampler chain state"):
        _sampler_chain_from_state(b"XLXSMP03" + b"\xff" * 32)
    # Another version's header is refused by its name, saying which this one reads.
    with pytest.raises(RlxError, match=r'"RLXSMP01" is not one this version reads'):
        _sampler_chain_from_state(b"RLXSMP01" + b"\xff" * 32)


def _value_at(state: bytes, knob: str) -> int:
    """Where knob ``knob``'s value (its tag, then the value) starts in a state."""
    entry = bytes([len(knob)]) + knob.encode()
    return state.index(entry) + len(entry)


def test_a_state_with_invalid_knobs_is_refused_like_new_options() -> None:
    state = bytearray(_state(SampleOpts(seed=1).into_chain()))
    at = _value_at(bytes(state), "top_p")
    assert state[at] == 1  # a number, then its f64
    state[at + 1 : at + 9] = struct.pack("<d", 2.0)
    with pytest.raises(InvalidOptionError, match="top_p"):
        _sampler_chain_from_state(bytes(state))
