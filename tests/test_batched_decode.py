"""`decode_batch`: the adapter's loop default equals decoding one sequence at a time."""

from __future__ import annotations

import numpy as np
import pytest
from conformance_runners import CoreOnly, ToyRunner

from rlx_lm import (
    HostDriven,
    RunnerAdapter,
    ShapeError,
    load_default,
    supports_batched_decode,
    with_defaults,
)


def _sequential(runner: RunnerAdapter, prompts: list[list[int]], tokens: list[int]) -> np.ndarray:
    rows = []
    for prompt, token in zip(prompts, tokens, strict=True):
        runner.prefill_logits(prompt)
        rows.append(np.array(runner.decode_logits(token)))
    return np.stack(rows)


def test_loop_default_on_a_cached_runner_matches_one_by_one() -> None:
    runner, _ = load_default(max_seq=64)
    adapter = with_defaults(runner)
    prompts = [[1, 5, 9], [2, 7], [3, 3, 3, 3]]
    sessions = []
    for p in prompts:
        adapter.prefill_logits(p)
        snap = adapter.export_session()
        assert snap is not None
        sessions.append(snap)
    tokens = [11, 12, 13]
    logits, advanced = adapter.decode_batch(sessions, tokens)
    assert logits.shape == (3, adapter.vocab_size)
    np.testing.assert_allclose(logits, _sequential(adapter, prompts, tokens), atol=1e-5)
    assert [s.tokens for s in advanced] == [(*p, t) for p, t in zip(prompts, tokens, strict=True)]
    # The given sessions are values: untouched, and usable again.
    assert [s.tokens for s in sessions] == [tuple(p) for p in prompts]
    again, _ = adapter.decode_batch(sessions, tokens)
    np.testing.assert_allclose(again, logits, atol=1e-6)
    # A second step continues from the advanced sessions.
    step2, _ = adapter.decode_batch(advanced, [4, 5, 6])
    adapter.prefill_logits([*prompts[1], 12])
    np.testing.assert_allclose(step2[1], adapter.decode_logits(5), atol=1e-5)


def test_loop_default_without_sessions_re_prefills() -> None:
    core = CoreOnly()
    adapter = with_defaults(core)
    assert not supports_batched_decode(core)
    driven = HostDriven(core)
    from rlx_lm import SessionSnapshot

    sessions = [SessionSnapshot(None, [1, 2]), SessionSnapshot(None, [3])]
    logits, advanced = adapter.decode_batch(sessions, [4, 5])
    for i, ctx in enumerate(([1, 2, 4], [3, 5])):
        np.testing.assert_array_equal(logits[i], driven.predict_logits(ctx))
        assert advanced[i].tokens == tuple(ctx)
        assert advanced[i].kv is None


def test_forwarded_to_a_runner_that_has_it() -> None:
    calls: list[int] = []

    class Batched(ToyRunner):
        def decode_batch(self, sessions, tokens):  # type: ignore[no-untyped-def]
            calls.append(len(tokens))
            return np.zeros((len(tokens), self.vocab_size), np.float32), list(sessions)

    runner = Batched()
    assert supports_batched_decode(runner)
    from rlx_lm import SessionSnapshot

    logits, _ = with_defaults(runner).decode_batch([SessionSnapshot(None, [1])], [2])
    assert calls == [1]
    assert logits.shape == (1, runner.vocab_size)


def test_mismatched_lengths_are_refused() -> None:
    from rlx_lm import SessionSnapshot

    with pytest.raises(ShapeError, match="one token per session"):
        with_defaults(CoreOnly()).decode_batch([SessionSnapshot(None, [1])], [1, 2])
