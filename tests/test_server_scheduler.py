"""`BatchScheduler` on its own (no HTTP): batch independence, any runner, cancel and close."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import rlx_lm
from rlx_lm import SampleOpts
from rlx_lm.server import (
    BatchScheduler,
    GenerationRequest,
    QueueFullError,
    ServerConfig,
    ShuttingDownError,
)
from rlx_lm.session import SessionSnapshot
from tests.server_harness import SlowSteps

PROMPT = "It is a truth universally acknowledged"


@pytest.fixture(scope="module")
def model() -> tuple[Any, Any]:
    return rlx_lm.load_default(max_seq=256)


def fresh(model: tuple[Any, Any]) -> Any:
    runner, _ = model
    return runner.clone(max_seq=256)


def request(tok: Any, seed: int, n_tokens: int = 12, **kw: Any) -> GenerationRequest:
    opts = SampleOpts(temperature=1.0, top_p=0.9, seed=seed)
    return GenerationRequest(tuple(tok.encode(PROMPT)), opts, max_tokens=n_tokens, **kw)


def test_a_seeded_request_draws_the_same_tokens_alone_or_among_31_others(
    model: tuple[Any, Any],
) -> None:
    _, tok = model
    with BatchScheduler(fresh(model), tok, ServerConfig(max_batch=32)) as sched:
        alone = sched.generate(request(tok, seed=42), timeout=120)[0]
        results: dict[int, Any] = {}
        barrier = threading.Barrier(32)

        def go(i: int) -> None:
            barrier.wait()
            # the others: other seeds, other lengths, other knobs
            req = (
                request(tok, seed=42)
                if i == 0
                else request(tok, seed=1000 + i, n_tokens=4 + i % 9, logprobs=i % 3 or None)
            )
            results[i] = sched.generate(req, timeout=300)[0]

        threads = [threading.Thread(target=go, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert len(results) == 32
        sizes = sched.metrics.batch_size
        assert sizes.count > 0
        assert sizes.counts[0] < sizes.count  # some steps ran more than one sequence
    assert results[0].tokens == alone.tokens
    assert results[0].text == alone.text
    assert alone.finish_reason == "length"
    assert all(r.finish_reason == "length" for r in results.values())


def test_choices_match_the_library_generate(model: tuple[Any, Any]) -> None:
    runner, tok = model
    opts = SampleOpts(temperature=0.8, min_p=0.05, presence_penalty=0.5, seed=9)
    want = rlx_lm.generate(runner, tok, PROMPT, opts=opts, max_tokens=16)
    with BatchScheduler(fresh(model), tok) as sched:
        got = sched.generate(
            GenerationRequest(tuple(tok.encode(PROMPT)), opts, max_tokens=16), timeout=60
        )[0]
    assert got.tokens == want.tokens
    assert got.text == want.text


class PredictOnly:
    """A runner with nothing but the core: no cached pair, no sessions."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.family = inner.family
        self.vocab_size = inner.vocab_size
        self.max_seq = inner.max_seq

    def predict_logits(self, ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        return self.inner.predict_logits(ids)  # type: ignore[no-any-return]


class CountingBatch:
    """A runner with its own decode_batch that records the batch sizes it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.family = inner.family
        self.vocab_size = inner.vocab_size
        self.max_seq = inner.max_seq
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decode_batch(
        self, sessions: Sequence[SessionSnapshot], tokens: Sequence[int], /
    ) -> tuple[npt.NDArray[np.float32], list[SessionSnapshot]]:
        self.sizes.append(len(tokens))
        rows, out = [], []
        for s, t in zip(sessions, tokens, strict=True):
            self.inner.restore_session(s)
            rows.append(self.inner.decode_logits(t))
            out.append(self.inner.export_session())
        return np.stack(rows).astype(np.float32), out


def test_any_runner_predict_only_gives_the_same_tokens(model: tuple[Any, Any]) -> None:
    _, tok = model
    req = request(tok, seed=3, n_tokens=6, n=2)
    with BatchScheduler(fresh(model), tok) as full:
        want = full.generate(req, timeout=60)
    with BatchScheduler(PredictOnly(fresh(model)), tok) as bare:
        assert bare.prompt_cache is None
        got = bare.generate(req, timeout=120)
    assert [c.tokens for c in got] == [c.tokens for c in want]


def test_the_runners_own_decode_batch_is_given_the_whole_batch(model: tuple[Any, Any]) -> None:
    _, tok = model
    runner = CountingBatch(fresh(model))
    with BatchScheduler(runner, tok, ServerConfig(max_batch=8)) as sched:
        out = sched.generate(request(tok, seed=1, n_tokens=5, n=4), timeout=60)
    assert all(c.finish_reason == "length" for c in out)
    assert runner.sizes == [4, 4, 4, 4]  # 5 tokens: 4 decode steps of all four choices


def test_cancel_frees_the_slot_and_close_refuses_new_work(model: tuple[Any, Any]) -> None:
    _, tok = model
    slow = SlowSteps(fresh(model))  # 200 tokens outlast the cancel on any machine
    sched = BatchScheduler(slow, tok, ServerConfig(max_batch=1, max_queue=1)).start()
    events: list[Any] = []
    long = sched.submit(request(tok, seed=1, n_tokens=200, ignore_eos=True), events.append)
    deadline = time.monotonic() + 30
    while sched.running == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    queued: list[Any] = []
    sched.submit(request(tok, seed=2, n_tokens=2), queued.append)
    with pytest.raises(QueueFullError) as full:
        sched.submit(request(tok, seed=3, n_tokens=2), lambda e: None)
    assert full.value.retry_after == 1
    long.cancel()
    while len(queued) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    finish = events[-1]
    assert finish.reason == "cancelled"
    assert finish.completion_tokens < 200
    assert queued[-1].reason == "length"  # the queued request ran in the freed slot
    sched.close(timeout=5)
    with pytest.raises(ShuttingDownError):
        sched.submit(request(tok, seed=4), lambda e: None)


def test_close_cancels_what_does_not_finish_in_time(model: tuple[Any, Any]) -> None:
    _, tok = model
    sched = BatchScheduler(SlowSteps(fresh(model)), tok).start()  # 200 steps take >= 2 s
    events: list[Any] = []
    sched.submit(request(tok, seed=1, n_tokens=200, ignore_eos=True), events.append)
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:
        time.sleep(0.005)
    sched.close(timeout=0.2)
    assert events[-1].reason == "cancelled"
    assert events[-1].error == "the server shut down"


def test_a_broken_sink_cancels_only_its_request(model: tuple[Any, Any]) -> None:
    _, tok = model

    def broken(event: Any) -> None:
        raise RuntimeError("client gone")

    with BatchScheduler(fresh(model), tok) as sched:
        sched.submit(request(tok, seed=1, n_tokens=50), broken)
        ok = sched.generate(request(tok, seed=2, n_tokens=8), timeout=60)[0]
        assert ok.finish_reason == "length"
        assert sched.metrics.finished["cancelled"] == 1


def test_validation_names_the_field(model: tuple[Any, Any]) -> None:
    _, tok = model
    sched = BatchScheduler(fresh(model), tok, ServerConfig(max_tokens=10))
    bad = [
        (GenerationRequest(()), "prompt"),
        (GenerationRequest((1, 10**6)), "prompt"),
        (GenerationRequest((1,), max_tokens=11), "max_tokens"),
        (GenerationRequest((1,), n=99), "n"),
        (GenerationRequest((1,), logprobs=99), "logprobs"),
        (GenerationRequest((1,) * 256), "prompt"),
        (GenerationRequest((1,), SampleOpts(top_p=0.5), order=("top_k",)), "order"),
    ]
    for req, field in bad:
        with pytest.raises(ValueError, match=field):
            sched.submit(req, lambda e: None)
    sched.close()


def test_a_cached_prefix_of_another_model_falls_back_to_a_full_prefill(
    model: tuple[Any, Any],
) -> None:
    from dataclasses import replace

    from rlx_lm import PromptCache

    runner, tok = model
    ids = tok.encode(PROMPT)
    other = fresh(model)
    other.prefill_logits(ids)
    snap = other.export_session()
    alien = SessionSnapshot(snap.kv, snap.tokens, replace(snap.fingerprint, model_id="other"))
    cache = PromptCache(1 << 24)
    cache.insert(alien)
    want = rlx_lm.generate(runner, tok, PROMPT, opts=SampleOpts(), max_tokens=6)
    with BatchScheduler(fresh(model), tok, prompt_cache=cache) as sched:
        got = sched.generate(GenerationRequest(tuple(ids), max_tokens=6), timeout=60)[0]
    assert got.tokens == want.tokens
    assert got.finish_reason == "length"


class FixedRow:
    """A runner whose next-token logits never change: token 5 at 1.0, token 6 at 0.8."""

    family = "fixed"
    max_seq = 64

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab
        self.row = np.zeros(vocab, dtype=np.float32)
        self.row[5], self.row[6] = 1.0, 0.8

    def predict_logits(self, ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        return self.row.copy()


@pytest.mark.parametrize(
    ("knob", "want"),
    [
        # vLLM counts frequency and presence on the output only: token 5, seen in the
        # prompt alone, keeps its lead (the whole history as output would drop it to 0.5)
        ({"presence_penalty": 0.5}, 5),
        ({"frequency_penalty": 0.5}, 5),
        # ... and the repetition penalty on prompt and output: 1.0 / 2 falls below 0.8
        ({"repetition_penalty": 2.0}, 6),
    ],
)
def test_the_prompt_is_the_prompt_to_the_sampler_chain(
    model: tuple[Any, Any], knob: dict[str, float], want: int
) -> None:
    _, tok = model
    runner = FixedRow(tok.vocab_size)
    prompt = (5, 7, 8)
    opts = SampleOpts(temperature=0.0, **knob)  # type: ignore[arg-type]
    lib = rlx_lm.generate(runner, tok, list(prompt), opts=opts, order="vllm", max_tokens=1)
    with BatchScheduler(runner, tok) as sched:
        got = sched.generate(
            GenerationRequest(prompt, opts, max_tokens=1, order="vllm"), timeout=60
        )[0]
    assert got.tokens == lib.tokens == [want]


def test_the_step_probe_splits_busy_time_into_decode_and_gap(model: tuple[Any, Any]) -> None:
    # ~0.5 s: 14 decode steps of 20 ms and one 0.2 s idle pause.
    _, tok = model
    with BatchScheduler(SlowSteps(fresh(model), delay=0.02), tok) as sched:
        for _ in range(2):
            out = sched.generate(request(tok, seed=1, n_tokens=8, ignore_eos=True), timeout=60)
            assert out[0].finish_reason == "length"
            time.sleep(0.2)  # idle: not a gap between steps
        m = sched.metrics
        text = m.render()
    assert m.decode_steps == 14  # 8 tokens: 7 decode steps, twice
    assert m.step_gap.count == 12  # the first step after an idle wait has no gap
    assert m.decode_seconds >= 14 * 0.02
    assert m.step_gap.sum < m.decode_seconds / 2  # the 0.2 s pause was not counted
    assert m.prefill_seconds > 0
    assert "rlx_lm_step_gap_seconds_count 12" in text
    assert "rlx_lm_decode_seconds_total " in text
    assert "rlx_lm_prefill_seconds_total " in text


def test_a_steps_events_are_handed_out_after_every_sequence_is_sampled(
    model: tuple[Any, Any],
) -> None:
    # ~0.1 s: one request of 4 choices, 10 tokens each
    _, tok = model
    seen: list[tuple[str, int]] = []
    with BatchScheduler(fresh(model), tok) as sched:
        done = threading.Event()
        finished = [0]

        def sink(event: Any) -> None:
            # how many tokens the batch had sampled when this event arrived
            seen.append((type(event).__name__, sched.metrics.generation_tokens))
            if type(event).__name__ == "Finish":
                finished[0] += 1
                if finished[0] == 4:
                    done.set()

        sched.submit(request(tok, seed=5, n_tokens=10, n=4, ignore_eos=True), sink)
        assert done.wait(60)
    chunks = [n for kind, n in seen if kind == "Chunk"]
    assert chunks  # the choices released text
    assert all(n % 4 == 0 for n in chunks)  # never in the middle of a step's sampling
    assert [n for kind, n in seen if kind == "Finish"] == [40] * 4


class Recording:
    """The runner, recording its prefill and decode calls in order (5 ms per decode)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def prefill_logits(self, ids: Any) -> Any:
        self.calls.append(("prefill", len(ids)))
        return self._inner.prefill_logits(ids)

    def prefill_logits_reusing(self, ids: Any, snap: Any, reuse: int) -> Any:
        self.calls.append(("reuse", len(ids)))
        return self._inner.prefill_logits_reusing(ids, snap, reuse)

    def decode_batch(self, sessions: Any, tokens: Any) -> Any:
        time.sleep(0.005)
        self.calls.append(("decode", len(sessions)))
        return self._inner.decode_batch(sessions, tokens)


def test_a_long_prompt_is_prefilled_in_chunks_between_the_running_batchs_steps(
    model: tuple[Any, Any],
) -> None:
    # ~0.5 s: a 200-token prompt in 7 chunks of 32 while a 60-token request decodes
    _, tok = model
    rng = np.random.default_rng(3)
    long = tuple(int(t) for t in rng.integers(3, tok.vocab_size, 200))
    opts = SampleOpts(temperature=1.0, top_p=0.9, seed=7)
    second = GenerationRequest(long, opts, max_tokens=8)
    config = ServerConfig(prefill_chunk=32, prompt_cache_bytes=0)
    with BatchScheduler(fresh(model), tok, config) as sched:
        alone = sched.generate(second, timeout=60)[0]  # nothing running: prefilled whole
    runner = Recording(fresh(model))
    with BatchScheduler(runner, tok, config) as sched:
        first: list[Any] = []
        busy = sched.submit(request(tok, seed=1, n_tokens=60, ignore_eos=True), first.append)
        deadline = time.monotonic() + 30
        while not runner.calls and time.monotonic() < deadline:
            time.sleep(0.001)
        among = sched.generate(second, timeout=60)[0]
        assert not first or type(first[-1]).__name__ != "Finish"  # it ran all along
        busy.cancel()
        while not first or type(first[-1]).__name__ != "Finish":
            assert time.monotonic() < deadline
            time.sleep(0.005)
    assert among.tokens == alone.tokens  # chunked or whole: the same logits, bit for bit
    assert among.text == alone.text
    chunks = [i for i, (kind, n) in enumerate(runner.calls) if kind != "decode" and n > 20]
    assert [runner.calls[i] for i in chunks] == [("prefill", 32)] + [
        ("reuse", n) for n in (64, 96, 128, 160, 192, 200)
    ]
    for a, b in itertools.pairwise(chunks):  # the batch decoded between chunks
        assert [kind for kind, _ in runner.calls[a + 1 : b]] == ["decode"]


def test_a_request_cancelled_while_its_prompt_is_prefilled_frees_its_slot(
    model: tuple[Any, Any],
) -> None:
    # ~0.2 s: cancelled after its second chunk, beside a request that is then cancelled
    _, tok = model
    long = tuple(int(t) for t in np.random.default_rng(4).integers(3, tok.vocab_size, 200))
    runner = Recording(fresh(model))
    config = ServerConfig(prefill_chunk=16, prompt_cache_bytes=0, max_batch=2)
    with BatchScheduler(runner, tok, config) as sched:
        first: list[Any] = []
        busy = sched.submit(request(tok, seed=1, n_tokens=200, ignore_eos=True), first.append)
        deadline = time.monotonic() + 30
        while not runner.calls and time.monotonic() < deadline:
            time.sleep(0.001)
        events: list[Any] = []
        handle = sched.submit(GenerationRequest(long, max_tokens=4), events.append)
        while not any(kind == "reuse" for kind, _ in runner.calls):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        handle.cancel()
        while not events:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert [type(e).__name__ for e in events] == ["Finish"]
        assert events[0].reason == "cancelled"
        # its slot is free again: the next request runs beside the first, not after it
        out = sched.generate(request(tok, seed=2, n_tokens=2), timeout=30)
        assert out[0].finish_reason == "length"
        assert not any(type(e).__name__ == "Finish" for e in first)
        busy.cancel()
    assert sum(kind == "reuse" for kind, _ in runner.calls) < 200 // 16 - 1


def test_on_delivered_runs_once_per_step_after_its_events(model: tuple[Any, Any]) -> None:
    # ~0.1 s: 4 choices of 6 tokens
    _, tok = model
    log: list[str] = []
    done = threading.Event()
    with BatchScheduler(fresh(model), tok) as sched:
        sched.on_delivered(lambda: log.append("f"))

        def sink(event: Any) -> None:
            log.append("e")
            if type(event).__name__ == "Finish" and event.index == 3:
                done.set()

        sched.submit(request(tok, seed=5, n_tokens=6, n=4, ignore_eos=True), sink)
        assert done.wait(60)
        deadline = time.monotonic() + 10
        while log[-1] != "f" and time.monotonic() < deadline:
            time.sleep(0.001)
    text = "".join(log)
    assert text.endswith("f")  # the last events were followed by a flush
    assert "ff" not in text  # a flush only after a hand-out that had events
    assert 1 <= text.count("f") <= 6  # at most once per step (6 steps sampled)
    assert all(len(run) <= 8 for run in text.split("f"))  # a step's events, no more
