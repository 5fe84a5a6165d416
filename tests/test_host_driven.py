"""HostDriven: the seed's tests ported, plus its two weak points decided and pinned."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from toy_runners import HasPair, NoPair, hashed_logits, sum_rule_logits

import rlx_lm
from rlx_lm import (
    HostDriven,
    InvalidLogitsError,
    SequenceStateError,
    SessionSnapshot,
    TokenOutOfRangeError,
    UnsupportedError,
    with_defaults,
)
from rlx_lm.host_driven import WARN_ENV


def host_driven_tokens(runner: HostDriven[NoPair], prompt: Sequence[int], n: int) -> list[int]:
    logits = runner.prefill_logits(prompt)
    out = []
    for _ in range(n):
        token = rlx_lm.argmax(logits)
        out.append(token)
        logits = runner.decode_logits(token)
    return out


# -- ported from the seed --------------------------------------------------------


def test_a_runner_without_the_pair_cannot_be_driven_by_a_server() -> None:
    with pytest.raises(UnsupportedError) as info:
        with_defaults(NoPair()).prefill_logits([1, 2])
    assert "unsupported" in str(info.value)
    assert "HostDriven" in str(info.value), "the error should name the fix"


def test_wrapping_it_gives_the_same_tokens_as_its_own_generate() -> None:
    prompt = [3, 5, 7]
    want = with_defaults(NoPair()).generate(prompt, 6)
    wrapped = HostDriven(NoPair())
    assert host_driven_tokens(wrapped, prompt, 6) == want
    assert wrapped.fell_back(), "NoPair has no cached pair, so this is the slow path"


def test_wrapping_a_runner_that_has_the_pair_uses_it() -> None:
    inner = HasPair()
    wrapped = HostDriven(inner)
    got = host_driven_tokens(wrapped, [3, 5, 7], 6)
    assert len(got) == 6
    assert not wrapped.fell_back(), "the family's own pair should have been used"
    assert (inner.prefills, inner.decodes) == (1, 6)
    assert inner.calls == [], "no full re-prefill through predict_logits"


def test_decoding_before_prefilling_says_so() -> None:
    wrapped = HostDriven(NoPair())
    with pytest.raises(SequenceStateError, match="before prefill"):
        wrapped.decode_logits(4)
    with pytest.raises(RuntimeError):
        wrapped.decode_logits(4)


def test_the_context_grows_by_exactly_one_token_per_step() -> None:
    vocab = 1024
    wrapped = HostDriven(NoPair(vocab))
    prompt = [2, 4]
    logits = wrapped.prefill_logits(prompt)
    expect = list(prompt)
    for _ in range(5):
        token = rlx_lm.argmax(logits)
        expect.append(token)
        logits = wrapped.decode_logits(token)
        # The toy's argmax is a function of the whole context, so reproducing
        # it independently proves the wrapper fed the same context.
        want = (sum(expect) + len(expect)) % vocab
        assert rlx_lm.argmax(logits) == want, expect
        assert wrapped.context == tuple(expect)


# -- properties over random deterministic runners ---------------------------------

vocabs = st.integers(2, 50)
seeds = st.integers(0, 2**63 - 1)
prompts = st.lists(st.integers(0, 10_000), min_size=1, max_size=8)
steps = st.integers(0, 12)


@given(vocab=vocabs, seed=seeds, prompt=prompts, n=steps, has_pair=st.booleans())
def test_host_driven_greedy_equals_own_greedy(
    vocab: int, seed: int, prompt: list[int], n: int, has_pair: bool
) -> None:
    prompt = [t % vocab for t in prompt]

    def rule(ctx: Sequence[int]) -> object:
        return hashed_logits(ctx, vocab, seed)

    want = with_defaults(NoPair(vocab, rule)).generate(prompt, n)
    wrapped = HostDriven((HasPair if has_pair else NoPair)(vocab, rule))
    assert host_driven_tokens(wrapped, prompt, n) == want
    assert wrapped.fell_back() is (not has_pair)


@given(vocab=vocabs, seed=seeds, prompt=prompts, n=steps)
def test_fallback_context_grows_by_one_per_step(
    vocab: int, seed: int, prompt: list[int], n: int
) -> None:
    prompt = [t % vocab for t in prompt]
    inner = NoPair(vocab, lambda ctx: hashed_logits(ctx, vocab, seed))
    produced = host_driven_tokens(HostDriven(inner), prompt, n)
    # Each model call saw exactly the prompt plus every token decoded so far.
    assert inner.calls == [tuple(prompt + produced[:i]) for i in range(n + 1)]


# -- weak point 1: fall back only on "unsupported" ----------------------------------


class Failing(HasPair):
    """A pair whose prefill raises a chosen exception."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def prefill_logits(self, prompt_ids: Sequence[int]) -> object:
        raise self.exc


@pytest.mark.parametrize(
    "exc", [ValueError("bad prompt"), RuntimeError("device lost"), KeyError("w.0")]
)
def test_a_real_failure_propagates_instead_of_falling_back(exc: Exception) -> None:
    inner = Failing(exc)
    wrapped = HostDriven(inner)
    with pytest.raises(type(exc)) as info:
        wrapped.prefill_logits([1, 2])
    assert info.value is exc
    assert not wrapped.fell_back()
    assert inner.calls == [], "no silent re-prefill behind a real error"


@pytest.mark.parametrize(
    "exc", [NotImplementedError("no pair"), UnsupportedError("x: prefill_logits unsupported")]
)
def test_unsupported_falls_back(exc: Exception) -> None:
    wrapped = HostDriven(Failing(exc))
    np.testing.assert_array_equal(wrapped.prefill_logits([1, 2]), sum_rule_logits([1, 2], 16))
    assert wrapped.fell_back()


def test_an_adapted_runner_without_the_pair_falls_back() -> None:
    # The adapter raises UnsupportedError for the missing pair; HostDriven treats
    # that like a missing member.
    wrapped = HostDriven(with_defaults(NoPair()))
    assert host_driven_tokens(wrapped, [1, 2], 4) == with_defaults(NoPair()).generate([1, 2], 4)
    assert wrapped.fell_back()


def test_a_real_decode_failure_propagates_and_keeps_the_context() -> None:
    class BadDecode(HasPair):
        def decode_logits(self, token: int) -> object:
            raise ValueError("cache corrupt")

    wrapped = HostDriven(BadDecode())
    wrapped.prefill_logits([1, 2])
    with pytest.raises(ValueError, match="cache corrupt"):
        wrapped.decode_logits(3)
    assert wrapped.context == (1, 2)
    assert not wrapped.fell_back()


def test_invalid_logits_keep_the_context_in_step_with_the_runner() -> None:
    # The inner pair took the token even though its logits were NaN, so the
    # context follows it; the stateless fallback keeps the context unchanged.
    poison = [float("nan")] * 16
    inner = HasPair(16, rule=lambda ctx: poison if ctx[-1] == 9 else sum_rule_logits(ctx, 16))
    wrapped = HostDriven(inner)
    wrapped.prefill_logits([1])
    with pytest.raises(InvalidLogitsError, match="NaN"):
        wrapped.decode_logits(9)
    assert wrapped.context == tuple(inner.context) == (1, 9)

    fallback = HostDriven(NoPair(16, rule=inner.rule))
    fallback.prefill_logits([1])
    with pytest.raises(InvalidLogitsError, match="NaN"):
        fallback.decode_logits(9)
    assert fallback.context == (1,)


# -- weak point 2: one sequence never mixes the two paths ---------------------------


class StaleDecode(HasPair):
    """Prefill unsupported, but a decode that would answer from a stale cache."""

    def prefill_logits(self, prompt_ids: Sequence[int]) -> object:
        raise UnsupportedError("stale: prefill_logits unsupported")

    def decode_logits(self, token: int) -> object:
        self.decodes += 1
        return [100.0] + [0.0] * (self.vocab_size - 1)


def test_after_a_fallback_prefill_decode_stays_on_the_fallback() -> None:
    inner = StaleDecode()
    wrapped = HostDriven(inner)
    got = host_driven_tokens(wrapped, [3, 5, 7], 6)
    assert inner.decodes == 0, "the inner decode must not continue a sequence it never saw"
    assert got == with_defaults(NoPair()).generate([3, 5, 7], 6)


def test_an_inner_sequence_does_not_switch_to_the_fallback_midway() -> None:
    class PrefillOnly(HasPair):
        def decode_logits(self, token: int) -> object:
            raise NotImplementedError

    inner = PrefillOnly()
    wrapped = HostDriven(inner)
    wrapped.prefill_logits([1, 2])
    with pytest.raises(UnsupportedError, match="does not switch paths"):
        wrapped.decode_logits(3)
    assert inner.calls == []
    assert not wrapped.fell_back()


def test_each_prefill_chooses_the_path_again() -> None:
    class Flaky(HasPair):
        supported = False

        def prefill_logits(self, prompt_ids: Sequence[int]) -> object:
            if not self.supported:
                raise NotImplementedError
            return super().prefill_logits(prompt_ids)

    inner = Flaky()
    wrapped = HostDriven(inner)
    host_driven_tokens(wrapped, [1], 3)
    assert inner.decodes == 0
    inner.supported = True
    host_driven_tokens(wrapped, [1], 3)
    assert inner.decodes == 3


def test_a_failed_prefill_ends_the_previous_sequence() -> None:
    inner = Failing(ValueError("boom"))
    wrapped = HostDriven(inner)
    inner.exc = NotImplementedError()
    wrapped.prefill_logits([1, 2])
    inner.exc = ValueError("boom")
    with pytest.raises(ValueError, match="boom"):
        wrapped.prefill_logits([3])
    assert wrapped.context == ()
    with pytest.raises(SequenceStateError):
        wrapped.decode_logits(1)


def test_an_out_of_range_token_is_refused_without_changing_state() -> None:
    inner = NoPair(8)
    wrapped = HostDriven(inner)
    wrapped.prefill_logits([1])
    for bad in (8, -1):
        with pytest.raises(TokenOutOfRangeError, match=f"token {bad} "):
            wrapped.decode_logits(bad)
    assert wrapped.context == (1,)
    with pytest.raises(TokenOutOfRangeError, match="token 9 "):
        wrapped.prefill_logits([1, 9])
    assert inner.calls == [(1,)], "the bad prompt never reached the runner"
    with pytest.raises(TypeError):
        wrapped.decode_logits(1.5)  # type: ignore[arg-type]


def test_wrapping_something_that_is_not_a_runner_fails_at_once() -> None:
    with pytest.raises(TypeError, match="not a runner"):
        HostDriven(object())  # type: ignore[type-var]


# -- the warning -------------------------------------------------------------------


def test_the_warning_is_printed_once_and_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(WARN_ENV, raising=False)
    quiet = HostDriven(NoPair())
    host_driven_tokens(quiet, [1], 3)
    assert quiet.fell_back()
    assert capsys.readouterr().err == ""

    monkeypatch.setenv(WARN_ENV, "1")
    loud = HostDriven(NoPair())
    host_driven_tokens(loud, [1], 3)
    host_driven_tokens(loud, [2], 3)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("re-runs the whole context") == 1
    assert captured.err.startswith("[rlx_lm] nopair:")

    # A runner with the pair never warns.
    fast = HostDriven(HasPair())
    host_driven_tokens(fast, [1], 3)
    assert capsys.readouterr().err == ""


# -- the rest of the surface is forwarded -----------------------------------------


def test_other_members_are_forwarded() -> None:
    inner = HasPair(12)
    wrapped = HostDriven(inner)
    assert wrapped.inner is inner
    assert wrapped.family == "haspair"
    assert wrapped.vocab_size == 12
    assert wrapped.generate([1, 2], 4) == with_defaults(NoPair(12)).generate([1, 2], 4)
    np.testing.assert_array_equal(wrapped.predict_logits([1]), sum_rule_logits([1], 12))
    assert wrapped.export_session() is None
    assert wrapped.restore_session(SessionSnapshot(kv=None, tokens=[])) is False
    assert wrapped.kv_store_stats() is None
    assert wrapped.supports_multimodal() is False
    wrapped.set_multimodal_phase_callback(None)
    with pytest.raises(UnsupportedError):
        wrapped.generate_multimodal("x", b"", 0, 0, None, 1)


def test_prefill_reusing_falls_back_to_a_full_prefill() -> None:
    wrapped = HostDriven(NoPair())
    snap = SessionSnapshot(kv=None, tokens=[1])
    logits = wrapped.prefill_logits_reusing([1, 2], snap, 1)
    np.testing.assert_array_equal(logits, sum_rule_logits([1, 2], 16))
    assert wrapped.fell_back()
    assert wrapped.context == (1, 2)
    wrapped.decode_logits(0)
    assert wrapped.context == (1, 2, 0)


def test_prefill_reusing_uses_the_inner_one_and_its_decode() -> None:
    class Reusing(HasPair):
        reused = 0

        def prefill_logits_reusing(
            self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int
        ) -> object:
            self.reused += 1
            return self.prefill_logits(prompt_ids)

    inner = Reusing()
    wrapped = HostDriven(inner)
    wrapped.prefill_logits_reusing([1, 2], SessionSnapshot(kv=None, tokens=[1]), 1)
    wrapped.decode_logits(5)
    assert (inner.reused, inner.decodes) == (1, 1)
    assert not wrapped.fell_back()
