"""The runner protocols: logits validation, capability probes and the defaults adapter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from toy_runners import HasPair, NoPair, OwnGenerate, hashed_logits

from rlx_lm import (
    DtypeError,
    InvalidLogitsError,
    InvalidOptionError,
    SessionSnapshot,
    ShapeError,
    UnsupportedError,
    as_logits,
    supports_host_driven,
    supports_kv_stats,
    supports_multimodal,
    supports_prompt_cache,
    with_defaults,
)


def reference_greedy(
    rule: Callable[[Sequence[int]], object], prompt: Sequence[int], n: int
) -> list[int]:
    """The obvious loop: argmax of the full context's logits, n times."""
    context, out = list(prompt), []
    for _ in range(n):
        token = int(np.argmax(np.asarray(rule(context), dtype=np.float64)))
        out.append(token)
        context.append(token)
    return out


# -- as_logits -------------------------------------------------------------------


def test_as_logits_converts_a_list_to_float32() -> None:
    row = as_logits([0.5, 1.5, -2.0], 3)
    assert row.dtype == np.float32
    assert row.flags.c_contiguous
    np.testing.assert_array_equal(row, np.array([0.5, 1.5, -2.0], np.float32))


def test_as_logits_keeps_a_float32_row_without_copying() -> None:
    row = np.arange(5, dtype=np.float32)
    assert as_logits(row, 5) is row


def test_as_logits_makes_strided_rows_contiguous() -> None:
    base = np.arange(10, dtype=np.float32)
    row = as_logits(base[::2], 5)
    assert row.flags.c_contiguous
    np.testing.assert_array_equal(row, base[::2])


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.uint8])
def test_as_logits_converts_other_real_dtypes(dtype: type) -> None:
    src = np.array([1, 3, 2], dtype=dtype)
    row = as_logits(src, 3)
    assert row.dtype == np.float32
    np.testing.assert_array_equal(row, [1.0, 3.0, 2.0])


def test_as_logits_refuses_a_float32_overflow() -> None:
    with pytest.raises(InvalidLogitsError, match=r"position 1 .*overflows float32"):
        as_logits([0.0, 1e300, 2.0], 3)
    # Infinities that were already infinite are not an overflow.
    assert np.isneginf(as_logits([0.0, float("-inf")], 2)[1])


def test_as_logits_names_the_first_nan() -> None:
    with pytest.raises(InvalidLogitsError, match="NaN at position 2"):
        as_logits([0.0, 1.0, float("nan"), float("nan")], 4)


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (np.zeros(4, np.float32), r"length vocab_size=3, got shape \(4,\)"),
        (np.zeros((1, 3), np.float32), r"x\[-1\]"),
        (np.float32(1.0), r"got shape \(\)"),
    ],
)
def test_as_logits_shape_errors(value: object, pattern: str) -> None:
    with pytest.raises(ShapeError, match=pattern):
        as_logits(value, 3)


@pytest.mark.parametrize(
    "value",
    [["a", "b"], [True, False], np.array([1 + 2j, 0j]), [object(), object()], [[1.0], [1.0, 2.0]]],
)
def test_as_logits_dtype_errors(value: object) -> None:
    with pytest.raises(DtypeError, match="logits must"):
        as_logits(value, 2)


# -- probes ----------------------------------------------------------------------


class Everything(HasPair):
    """A runner with every optional member, recording what the adapter forwards."""

    family = "everything"

    def __init__(self) -> None:
        super().__init__(8)
        self.log: list[object] = []

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int
    ) -> object:
        self.log.append(("reusing", tuple(prompt_ids), reuse_len))
        return self.prefill_logits(prompt_ids)

    def export_session(self) -> SessionSnapshot:
        return SessionSnapshot(kv="kv", tokens=self.context)

    def restore_session(self, snapshot: SessionSnapshot) -> bool:
        self.context = list(snapshot.tokens)
        return True

    def kv_store_stats(self) -> tuple[int, int, int]:
        return (1, 2, 3)

    def set_multimodal_phase_callback(self, callback: Callable[[str], None] | None) -> None:
        self.log.append(("callback", callback))

    def supports_multimodal(self) -> bool:
        return True

    def generate_multimodal(self, *args: object) -> list[int]:
        self.log.append(("mm", args))
        return [7]


def test_probes_see_the_members_a_runner_has() -> None:
    bare, full = NoPair(), Everything()
    for probe in (supports_host_driven, supports_prompt_cache, supports_kv_stats):
        assert not probe(bare)
        assert probe(full)
    assert not supports_multimodal(bare)
    assert supports_multimodal(full)
    assert supports_host_driven(HasPair())
    # The adapter itself has every member, whatever it wraps.
    assert supports_host_driven(with_defaults(bare))


def test_a_non_callable_attribute_is_not_a_capability() -> None:
    odd = NoPair()
    odd.prefill_logits = None  # type: ignore[attr-defined]
    odd.decode_logits = 3  # type: ignore[attr-defined]
    assert not supports_host_driven(odd)


# -- adapter defaults --------------------------------------------------------------


def test_the_adapter_refuses_an_object_that_is_not_a_runner() -> None:
    with pytest.raises(TypeError, match="needs family, vocab_size and predict_logits"):
        with_defaults(object())  # type: ignore[type-var]


@given(
    vocab=st.integers(2, 40),
    seed=st.integers(0, 2**32),
    prompt=st.lists(st.integers(0, 39), min_size=1, max_size=6),
    n=st.integers(0, 10),
)
def test_default_generate_is_the_greedy_loop(vocab: int, seed: int, prompt: list[int], n: int):
    prompt = [t % vocab for t in prompt]
    toy = NoPair(vocab, lambda ctx: hashed_logits(ctx, vocab, seed))
    got = with_defaults(toy).generate(prompt, n)
    assert got == reference_greedy(toy.rule, prompt, n)
    # One full prefill per produced token, each over the grown context.
    assert [len(c) for c in toy.calls] == [len(prompt) + i for i in range(n)]


def test_default_generate_keeps_the_token_then_stops() -> None:
    seen: list[int] = []

    def stop_after_two(token: int) -> bool:
        seen.append(token)
        return len(seen) < 2

    out = with_defaults(NoPair()).generate([1, 2], 10, stop_after_two)
    assert out == seen
    assert len(out) == 2


def test_default_generate_rejects_a_negative_count() -> None:
    with pytest.raises(InvalidOptionError, match="n_new"):
        with_defaults(NoPair()).generate([1], -1)


def test_the_runners_own_generate_is_used() -> None:
    toy = OwnGenerate()
    assert with_defaults(toy).generate([3, 4], 5) == reference_greedy(toy.rule, [3, 4], 5)
    assert toy.generate_calls == 1


@pytest.mark.parametrize("member", ["prefill_logits", "decode_logits"])
def test_missing_pair_is_unsupported_and_names_host_driven(member: str) -> None:
    adapter = with_defaults(NoPair())
    call = getattr(adapter, member)
    with pytest.raises(UnsupportedError, match="HostDriven") as info:
        call([1, 2]) if member == "prefill_logits" else call(1)
    message = str(info.value)
    assert "unsupported" in message
    assert message.startswith("nopair:")
    assert isinstance(info.value, NotImplementedError)


def test_reusing_without_support_is_a_full_prefill() -> None:
    toy = HasPair()
    adapter = with_defaults(toy)
    snap = SessionSnapshot(kv=None, tokens=[1])
    np.testing.assert_array_equal(
        adapter.prefill_logits_reusing([1, 2, 3], snap, 1), adapter.predict_logits([1, 2, 3])
    )
    assert toy.prefills == 1
    # And with no pair at all, the full prefill is itself unsupported.
    with pytest.raises(UnsupportedError, match="prefill_logits"):
        with_defaults(NoPair()).prefill_logits_reusing([1], snap, 0)


def test_optional_members_default_quietly() -> None:
    adapter = with_defaults(NoPair())
    assert adapter.export_session() is None
    assert adapter.restore_session(SessionSnapshot(kv=None, tokens=[])) is False
    assert adapter.kv_store_stats() is None
    adapter.set_multimodal_phase_callback(print)
    adapter.set_multimodal_phase_callback(None)
    assert adapter.supports_multimodal() is False
    with pytest.raises(UnsupportedError, match="multimodal"):
        adapter.generate_multimodal("hi", b"\0" * 12, 2, 2, None, 4)


def test_optional_members_are_forwarded_when_present(tmp_path: Path) -> None:
    toy = Everything()
    adapter = with_defaults(toy)
    assert adapter.inner is toy
    assert adapter.family == "everything"
    assert adapter.vocab_size == 8
    adapter.prefill_logits([1, 2])
    assert adapter.decode_logits(3).dtype == np.float32
    assert toy.context == [1, 2, 3]
    snap = adapter.export_session()
    assert snap is not None
    assert snap.tokens == (1, 2, 3)
    assert adapter.restore_session(SessionSnapshot(kv=None, tokens=[5])) is True
    assert toy.context == [5]
    adapter.prefill_logits_reusing([5, 6], SessionSnapshot(kv=None, tokens=[5]), 1)
    assert ("reusing", (5, 6), 1) in toy.log
    assert adapter.kv_store_stats() == (1, 2, 3)
    adapter.set_multimodal_phase_callback(print)
    assert ("callback", print) in toy.log
    assert adapter.supports_multimodal() is True
    assert adapter.generate_multimodal("x", b"rgb", 1, 1, tmp_path, 3) == [7]


def test_forwarded_logits_are_validated() -> None:
    toy = HasPair(4, rule=lambda ctx: [0.0, float("nan"), 0.0, 0.0])
    with pytest.raises(InvalidLogitsError, match="NaN at position 1"):
        with_defaults(toy).prefill_logits([1])
    with pytest.raises(ShapeError, match="vocab_size=5"):
        with_defaults(HasPair(5, rule=lambda ctx: [0.0])).predict_logits([1])


def test_export_session_must_return_a_snapshot() -> None:
    toy = NoPair()
    toy.export_session = lambda: {"kv": 1}  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="expected SessionSnapshot"):
        with_defaults(toy).export_session()
