"""Continuous batching: every running sequence advances one token per step, on one thread.

`BatchScheduler` owns the runner. It runs on its own thread (never an event loop) and
loops over steps:

1. drop what was cancelled (a client that went away frees its slot here);
2. admit waiting requests while there are free slots: prefill each prompt, reusing the
   longest prefix the shared `PromptCache` holds, and export the session. While other
   sequences are decoding, a prompt longer than ``config.prefill_chunk`` is prefilled
   one chunk per step instead (the running batch decodes between the chunks);
3. sample one token for every running sequence from its logits, with its own
   `SamplerChain` (keyed by the request's seed, the choice index and the step, so a
   seeded request draws the same tokens whatever else is in the batch);
4. decode the sampled tokens of every unfinished sequence in one
   ``decode_batch(sessions, tokens)`` call (the runner's own batched decode, or the
   adapter's loop over sessions for any other runner).

Requests join and leave between steps. A request that fails (its prefill raises, its
logits are NaN, its sink raises) fails alone: its choices finish with
``reason="error"`` and the message, and the batch goes on. If ``decode_batch`` raises,
each sequence is retried on its own so that only the one at fault fails.

Results go to the ``sink`` given to `BatchScheduler.submit`, called on the scheduler
thread with `Chunk` and `Finish` events; `BatchScheduler.generate` is a blocking
convenience over it. The scheduler does not need the HTTP app: wrap it as you like.

The events of a step are handed out together, once every sequence has been sampled and
just before the step's decode starts: a sink that wakes another thread (the app's event
loop) wakes it once per step, not once per sequence, and that thread's work (SSE frames,
socket writes) overlaps the decode instead of the sampling of the rest of the batch.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rlx_lm._core import SamplerChain
from rlx_lm.errors import (
    CapacityError,
    InvalidOptionError,
    RlxError,
    SnapshotMismatchError,
    TokenOutOfRangeError,
)
from rlx_lm.generation import TokenLogprob, _StopMatcher
from rlx_lm.host_driven import HostDriven
from rlx_lm.prompt_cache import PromptCache
from rlx_lm.runner import (
    LmCore,
    as_logits,
    supports_host_driven,
    supports_prompt_cache,
    with_defaults,
)
from rlx_lm.sample_opts import SampleOpts
from rlx_lm.server.config import ServerConfig
from rlx_lm.server.metrics import ServerMetrics
from rlx_lm.session import SessionSnapshot
from rlx_lm.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "BatchScheduler",
    "Chunk",
    "Completion",
    "Event",
    "Finish",
    "FinishReason",
    "GenerationRequest",
    "QueueFullError",
    "RequestHandle",
    "ShuttingDownError",
]

log = logging.getLogger("rlx_lm.server")

FinishReason = Literal["stop", "length", "context", "cancelled", "error"]
"""Why a choice ended: a stop token or string, ``max_tokens``, the context limit, a
cancel (client gone or shutdown), or an error (then `Finish.error` says which)."""


class QueueFullError(RlxError):
    """The queue is full; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDownError(RlxError):
    """The scheduler is closing (or closed) and takes no new requests."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt and how to continue it, ``n`` times.

    ``logprobs`` is None (off) or how many alternatives to report per token (0: only the
    sampled token's). ``order`` is the sampler order (`SampleOpts.into_chain`).
    ``max_tokens`` None generates until a stop or the context limit. ``stop_token_ids``
    end a choice like EOS does; ``ignore_eos`` keeps going past the tokenizer's EOS
    (the context limit and ``max_tokens`` still hold). ``use_cache=False`` skips the
    prompt-cache lookup for this request.
    """

    prompt: tuple[int, ...]
    opts: SampleOpts = field(default_factory=SampleOpts)
    max_tokens: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logprobs: int | None = None
    order: str | tuple[str, ...] | None = None
    use_cache: bool = True


@dataclass(frozen=True)
class Chunk:
    """New text of choice ``index``: the ``tokens`` that released it and their logprobs.

    Text that may be the start of a stop string is held back, so a chunk can carry
    several tokens; the tokens of a stop string that was hit are never sent.
    """

    index: int
    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finish:
    """Choice ``index`` is over: why, and how many tokens it sampled."""

    index: int
    reason: FinishReason
    completion_tokens: int
    error: str | None = None
    status: int = 500
    """For ``reason="error"``: 400 when the request was at fault, else 500."""


Event = Chunk | Finish
Sink = Callable[[Event], None]


class RequestHandle:
    """A submitted request: its id, prompt accounting, and `cancel`."""

    def __init__(self, rid: int, request: GenerationRequest, sink: Sink, wake: Callable[[], None]):
        self.id = rid
        self.request = request
        self.prompt_tokens = len(request.prompt)
        self.reused_tokens = 0
        """Prompt tokens the prefix cache supplied (known once the first event is out)."""
        self.submitted = time.perf_counter()
        self._sink = sink
        self._wake = wake
        self._cancelled = False
        self.open = request.n
        """Choices not finished yet."""

    @property
    def cancelled(self) -> bool:
        """Whether `cancel` was called."""
        return self._cancelled

    def cancel(self) -> None:
        """Stop this request at the next step; its choices finish with ``cancelled``."""
        self._cancelled = True
        self._wake()

    def __repr__(self) -> str:
        return f"RequestHandle(id={self.id}, prompt_tokens={self.prompt_tokens})"


@dataclass
class Completion:
    """What `BatchScheduler.generate` returns for one choice."""

    index: int
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason = "cancelled"
    completion_tokens: int = 0
    error: str | None = None


class _Prefill:
    """An admitted request whose prompt is being prefilled one chunk per step."""

    __slots__ = ("done", "handle", "looked_up", "reused", "snap")

    def __init__(self, handle: RequestHandle) -> None:
        self.handle = handle
        self.done = 0  # prompt tokens the runner's session `snap` holds
        self.snap: SessionSnapshot | None = None
        self.reused = 0  # of those, tokens the prefix cache supplied
        self.looked_up = False


class _Seq:
    """One running choice."""

    __slots__ = (
        "buf",
        "chain",
        "detok",
        "filled",
        "finished",
        "first",
        "generated",
        "handle",
        "index",
        "limit",
        "logits",
        "matcher",
        "pending",
        "pending_lp",
        "prompt_len",
        "session",
        "token",
    )

    def __init__(
        self,
        handle: RequestHandle,
        index: int,
        chain: SamplerChain,
        session: SessionSnapshot,
        logits: npt.NDArray[np.float32],
        detok: IncrementalDetokenizer,
        limit: int,
    ) -> None:
        req = handle.request
        self.handle = handle
        self.index = index
        self.chain = chain
        self.session = session
        self.logits: npt.NDArray[np.float32] | None = logits
        self.detok = detok
        self.matcher = _StopMatcher(req.stop)
        self.limit = limit  # tokens this choice may sample at most
        self.buf = np.empty(len(req.prompt) + limit, dtype=np.int64)
        self.buf[: len(req.prompt)] = req.prompt
        self.filled = self.prompt_len = len(req.prompt)
        self.generated = 0
        self.finished = False
        self.first = True
        self.token: int | None = None  # sampled, waiting to be decoded
        self.pending: list[int] = []  # tokens whose text is held back
        self.pending_lp: list[TokenLogprob] = []


def _draw(seq: _Seq, top_n: int | None) -> tuple[int, TokenLogprob | None]:
    """Sample one token and advance the chain's step exactly once.

    The history is the prompt then the output, with ``prompt_len`` marking the split, as
    `rlx_lm.generate` passes it: a preset that scopes a penalty to the output (vLLM's
    frequency and presence) sees the prompt as the prompt.
    """
    assert seq.logits is not None
    history = seq.buf[: seq.filled]
    chain = seq.chain
    before = chain.step
    lp: TokenLogprob | None = None
    if top_n is None:
        tok = int(chain.sample(seq.logits, history, prompt_len=seq.prompt_len))
    else:
        out = chain.sample_with_logprobs(
            seq.logits, history, top_n, mode="raw", prompt_len=seq.prompt_len
        )
        tok = int(out.token)
        lp = TokenLogprob(tok, float(out.logprob), tuple((int(t), float(p)) for t, p in out.top))
    if chain.step == before:  # a chain whose sample() does not accept by itself
        chain.accept(tok)
    return tok, lp


def _client_fault(exc: BaseException) -> bool:
    return isinstance(
        exc, (InvalidOptionError, TokenOutOfRangeError, CapacityError, SnapshotMismatchError)
    )


class BatchScheduler:
    """Runs every admitted sequence one token per step on a thread of its own.

    ``runner`` is any `LmCore`: its cached pair and sessions are used when it has them,
    `HostDriven` re-prefill otherwise; batched decode is ``with_defaults(runner)
    .decode_batch``. Use `start` (or ``with BatchScheduler(...)``), `submit` or
    `generate`, then `close`.
    """

    def __init__(
        self,
        runner: LmCore,
        tokenizer: Tokenizer,
        config: ServerConfig | None = None,
        *,
        metrics: ServerMetrics | None = None,
        prompt_cache: PromptCache | None = None,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config if config is not None else ServerConfig()
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.max_context = self.config.context_for(runner)
        self.vocab_size = int(runner.vocab_size)
        self._adapter = with_defaults(runner)
        self._driver: Any = runner if supports_host_driven(runner) else HostDriven(runner)
        self._sessions = supports_prompt_cache(runner)
        if prompt_cache is None and self._sessions and self.config.prompt_cache_bytes > 0:
            prompt_cache = PromptCache(self.config.prompt_cache_bytes)
        self.prompt_cache = prompt_cache if self._sessions else None
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self._cond = threading.Condition()
        self._waiting: deque[RequestHandle] = deque()
        self._running: list[_Seq] = []
        self._prefilling: deque[_Prefill] = deque()  # admitted, prompt in chunks
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._draining = False
        self._stop = False
        self.steps = 0
        """Decode steps run so far."""
        self._last_end: float | None = None  # when the last decode ended (None: idle since)
        self._outbox: deque[tuple[RequestHandle, Event]] = deque()  # events not handed out
        self._flush_hooks: list[Callable[[], None]] = []
        self.metrics.bind(self)

    # ------------------------------------------------------------------ public

    def start(self) -> BatchScheduler:
        """Start the scheduler thread (idempotent)."""
        with self._cond:
            if self._stop or self._draining:
                raise ShuttingDownError("the scheduler was closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="rlx-lm-scheduler", daemon=True
                )
                self._thread.start()
        return self

    def __enter__(self) -> BatchScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closing(self) -> bool:
        """Whether `close` was called: new requests are refused."""
        return self._draining

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Sequences in the running batch."""
        return len(self._running)

    def on_delivered(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` after each hand-out of events to the sinks (on the thread that
        handed them out, once per step when a step had events). A sink that only buffers
        can wake its consumer there: once per step instead of once per event."""
        self._flush_hooks.append(hook)

    def submit(self, request: GenerationRequest, sink: Sink) -> RequestHandle:
        """Queue ``request``; its events go to ``sink`` on the scheduler thread.

        Raises `InvalidOptionError` (naming the field) for a request that can never
        run, `QueueFullError` when the queue is full and `ShuttingDownError` when closing.
        """
        self._validate(request)
        with self._cond:
            if self._draining or self._stop:
                raise ShuttingDownError("the server is shutting down")
            if len(self._waiting) >= self.config.max_queue and not self._has_room(request.n):
                raise QueueFullError(
                    f"the queue is full ({len(self._waiting)} requests waiting)",
                    self.config.retry_after,
                )
            handle = RequestHandle(next(self._ids), request, sink, self._wake)
            self._waiting.append(handle)
            self._cond.notify_all()
        if self._thread is None:
            self.start()
        return handle

    def generate(
        self, request: GenerationRequest, timeout: float | None = None
    ) -> list[Completion]:
        """Submit ``request`` and block until every choice is done (a convenience)."""
        events: queue.Queue[Event] = queue.Queue()
        handle = self.submit(request, events.put)
        out = [Completion(i) for i in range(request.n)]
        open_ = request.n
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while open_:
                wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    ev = events.get(timeout=wait)
                except queue.Empty:
                    raise TimeoutError(f"request {handle.id} did not finish in time") from None
                c = out[ev.index]
                if isinstance(ev, Chunk):
                    c.text += ev.text
                    c.tokens.extend(ev.tokens)
                    c.logprobs.extend(ev.logprobs)
                else:
                    c.finish_reason = ev.reason
                    c.completion_tokens = ev.completion_tokens
                    c.error = ev.error
                    open_ -= 1
        finally:
            if open_:
                handle.cancel()
        return out

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, let running ones finish for ``timeout`` seconds
        (default ``config.shutdown_timeout``), cancel the rest and stop the thread."""
        timeout = self.config.shutdown_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            self._draining = True
            self._cond.notify_all()
            while (self._running or self._waiting or self._prefilling) and self._thread:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.05))
            self._stop = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, timeout))
        # the thread is gone (or was never started): nothing may be left waiting
        for handle in list(self._waiting):
            self._cancel_handle(handle, "the server shut down before the request ran")
        self._waiting.clear()

    # ---------------------------------------------------------------- checks

    def _validate(self, request: GenerationRequest) -> None:
        prompt = request.prompt
        if not prompt:
            raise InvalidOptionError("prompt: the prompt encodes to no tokens")
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidOptionError(
                f"prompt: token {bad} is outside the vocabulary 0..{self.vocab_size - 1}"
            )
        if len(prompt) >= self.max_context:
            raise CapacityError(
                f"prompt: this model's maximum context length is {self.max_context} tokens, "
                f"and the prompt has {len(prompt)} (room is needed for at least one token)"
            )
        if not 1 <= request.n <= min(self.config.max_n, self.config.max_batch):
            raise InvalidOptionError(
                f"n: must be in 1..{min(self.config.max_n, self.config.max_batch)}, got {request.n}"
            )
        if request.max_tokens is not None and not 0 <= request.max_tokens <= self.config.max_tokens:
            raise InvalidOptionError(
                f"max_tokens: must be in 0..{self.config.max_tokens}, got {request.max_tokens}"
            )
        if request.logprobs is not None and not (
            0 <= request.logprobs <= self.config.max_top_logprobs
        ):
            raise InvalidOptionError(
                f"logprobs: must be in 0..{self.config.max_top_logprobs}, got {request.logprobs}"
            )
        # Building a chain checks the knobs and the order together (a stage the options
        # enable but the order leaves out, an unknown stage name, ...).
        request.opts.into_chain(_order(request.order))

    def _has_room(self, n: int) -> bool:
        waiting = sum(h.request.n for h in self._waiting)
        busy = len(self._running) + sum(p.handle.request.n for p in self._prefilling)
        return busy + waiting + n <= self.config.max_batch

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._stop
                    and not self._running
                    and not self._waiting
                    and not self._prefilling
                ):
                    self._last_end = None  # an idle wait is no gap between steps
                    self._cond.notify_all()  # close() waits on the same condition
                    self._cond.wait()
                if self._stop:
                    break
            try:
                self._step()
            except Exception:  # a bug here must not end the server: fail the batch, go on
                log.exception("scheduler step failed; failing the running batch")
                for seq in list(self._running):
                    self._fail(seq, "internal error in the scheduler", 500)
                self._running = [s for s in self._running if not s.finished]
                self._deliver()
        for seq in list(self._running):
            self._finish(seq, "cancelled", error="the server shut down")
        self._running = []
        while self._prefilling:
            self._cancel_handle(self._prefilling.popleft().handle, "the server shut down")
        self._deliver()
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
            self._cond.notify_all()
        for handle in waiting:
            self._cancel_handle(handle, "the server shut down before the request ran")
        self._deliver()

    def _step(self) -> None:
        # 1. what was cancelled leaves now
        for seq in self._running:
            if seq.handle.cancelled:
                self._finish(seq, "cancelled")
        self._running = [s for s in self._running if not self._done(s)]
        # 2. admit; a long prompt joins while others decode: one chunk of it per step
        for handle in self._admit():
            if self._chunked(handle):
                self._prefilling.append(_Prefill(handle))
            else:
                self._start_request(handle)
        if self._prefilling:
            self._prefill_chunk()
        # 3. sample one token for every sequence
        for seq in self._running:
            if seq.logits is not None and not self._done(seq):
                self._advance(seq)
        self._running = [s for s in self._running if not self._done(s)]
        # 4. hand out this step's events at once, then one batched decode step
        self._deliver()
        live = [s for s in self._running if s.token is not None]
        if live:
            t0 = time.perf_counter()
            self._decode(live)
            t1 = time.perf_counter()
            gap = None if self._last_end is None else t0 - self._last_end
            self._last_end = t1
            self.steps += 1
            self.metrics.observe_step(len(live), t1 - t0, gap)
            self._deliver()  # what the decode finished (a cancel, a failure)
        else:
            self._last_end = None

    def _admit(self) -> list[RequestHandle]:
        out: list[RequestHandle] = []
        if not self._waiting:  # the common step: nothing queued, no lock to take
            return out
        with self._cond:
            keep: deque[RequestHandle] = deque()
            cancelled = [h for h in self._waiting if h.cancelled]
            for h in self._waiting:
                if not h.cancelled:
                    keep.append(h)
            self._waiting = keep
            slots = self.config.max_batch - len(self._running)
            slots -= sum(p.handle.request.n for p in self._prefilling)
            while self._waiting and self._waiting[0].request.n <= slots:
                h = self._waiting.popleft()
                slots -= h.request.n
                out.append(h)
        for h in cancelled:
            self._cancel_handle(h, None)
        return out

    @staticmethod
    def _done(seq: _Seq) -> bool:
        return seq.finished

    # --------------------------------------------------------------- prefill

    def _start_request(self, handle: RequestHandle) -> None:
        prompt = list(handle.request.prompt)
        try:
            t0 = time.perf_counter()
            logits, session, reused = self._prefill(prompt, handle.request.use_cache)
            self.metrics.observe_prefill_time(time.perf_counter() - t0)
            seqs = self._begin(handle, logits, session, reused)
        except Exception as exc:
            self._prefill_failed(handle, exc)
            return
        self._join(seqs)

    def _begin(
        self,
        handle: RequestHandle,
        logits: npt.NDArray[np.float32],
        session: SessionSnapshot,
        reused: int,
    ) -> list[_Seq]:
        """The request's choices, ready to sample their first token from ``logits``."""
        req = handle.request
        prompt = list(req.prompt)
        handle.reused_tokens = reused
        self.metrics.observe_prefill(len(prompt), reused)
        room = self.max_context - len(prompt)
        limit = room if req.max_tokens is None else min(req.max_tokens, room)
        base = req.opts
        seqs = []
        for i in range(req.n):
            chain = base.into_chain(_order(req.order), sequence_id=i)
            detok = self.tokenizer.detokenizer(prompt)
            seqs.append(_Seq(handle, i, chain, session, logits, detok, limit))
        return seqs

    def _join(self, seqs: list[_Seq]) -> None:
        for seq in seqs:
            if seq.limit == 0:
                req = seq.handle.request
                self._finish(seq, "length" if req.max_tokens == 0 else "context")
            else:
                self._running.append(seq)

    def _prefill_failed(self, handle: RequestHandle, exc: BaseException) -> None:
        if not _client_fault(exc):
            log.exception("request %d failed in prefill", handle.id)
        for i in range(handle.request.n):
            self._emit(handle, _error_finish(i, exc, 0))
            self.metrics.observe_finish("error")
        handle.open = 0

    # ------------------------------------------------------- chunked prefill

    def _chunked(self, handle: RequestHandle) -> bool:
        """Whether ``handle``'s prompt is prefilled in chunks (others are decoding)."""
        chunk = self.config.prefill_chunk
        return (
            self._sessions
            and chunk > 0
            and bool(self._running or self._prefilling)
            and len(handle.request.prompt) > chunk
        )

    def _prefill_chunk(self) -> None:
        """Prefill the next chunk of the first prompt in `_prefilling`; the last chunk
        starts its choices (they sample their first token in this very step)."""
        p = self._prefilling[0]
        handle = p.handle
        if handle.cancelled:
            self._prefilling.popleft()
            self._cancel_handle(handle, None)
            return
        prompt = list(handle.request.prompt)
        t0 = time.perf_counter()
        try:
            if not p.looked_up:
                p.looked_up = True
                self._lookup(p, prompt)
            # with nothing else to run, the rest of the prompt goes in one call
            budget = self.config.prefill_chunk if self._running else len(prompt)
            end = min(p.done + budget, len(prompt))
            raw = self._extend(p, prompt, end)
            seqs = None
            if end == len(prompt):
                assert p.snap is not None
                if p.snap.kv is not None:
                    self._cache_insert(p.snap)
                seqs = self._begin(handle, as_logits(raw, self.vocab_size), p.snap, p.reused)
        except Exception as exc:
            self._prefilling.popleft()
            self._prefill_failed(handle, exc)
            return
        finally:
            self.metrics.observe_prefill_time(time.perf_counter() - t0)
        if seqs is not None:
            self._prefilling.popleft()
            self._join(seqs)

    def _lookup(self, p: _Prefill, prompt: list[int]) -> None:
        cache = self.prompt_cache
        if cache is None or not p.handle.request.use_cache:
            return
        snap, reuse = cache.lookup(prompt)
        reuse = min(reuse, len(prompt) - 1)
        if snap is not None and reuse > 0:
            p.snap, p.done, p.reused = snap, reuse, reuse

    def _extend(self, p: _Prefill, prompt: list[int], end: int) -> Any:
        """Prefill ``prompt[:end]`` on top of the ``p.done`` tokens ``p.snap`` holds."""
        raw = None
        if p.snap is not None and p.done > 0:
            try:
                raw = self._adapter.prefill_logits_reusing(prompt[:end], p.snap, p.done)
            except SnapshotMismatchError as exc:
                if not p.reused or p.done != p.reused:
                    raise  # our own chunk's session: not the cache's fault
                log.warning("prompt cache: cached prefix unusable (%s); prefilling", exc)
                p.done = p.reused = 0  # this once, the chunk is the prefix as well
        if raw is None:
            raw = self._driver.prefill_logits(prompt[:end])
        session = self._adapter.export_session()
        if session is None:
            raise RlxError("the runner exported no session between prefill chunks")
        p.snap, p.done = session, end
        return raw

    def _prefill(
        self, prompt: list[int], use_cache: bool
    ) -> tuple[npt.NDArray[np.float32], SessionSnapshot, int]:
        cache = self.prompt_cache
        reused = 0
        if cache is not None:
            snap, reuse = cache.lookup(prompt) if use_cache else (None, 0)
            reuse = min(reuse, len(prompt) - 1)
            raw = None
            if snap is not None and reuse > 0:
                try:
                    raw = self._adapter.prefill_logits_reusing(prompt, snap, reuse)
                    reused = reuse
                except SnapshotMismatchError as exc:  # an entry this runner cannot use
                    log.warning("prompt cache: cached prefix unusable (%s); prefilling", exc)
            if raw is None:
                raw = self._driver.prefill_logits(prompt)
            session = self._adapter.export_session()
            if session is not None and session.kv is not None:
                self._cache_insert(session)
        else:
            raw = self._driver.prefill_logits(prompt)
            session = self._adapter.export_session() if self._sessions else None
        if session is None:
            session = SessionSnapshot(None, prompt, None)
        return as_logits(raw, self.vocab_size), session, reused

    def _cache_insert(self, session: SessionSnapshot) -> None:
        cache = self.prompt_cache
        if cache is None or session.kv is None:
            return
        try:
            cache.insert(session)
        except (RlxError, TypeError, OSError) as exc:  # a cache problem never fails a request
            log.warning("prompt cache refused a snapshot: %s", exc)

    # ---------------------------------------------------------------- sample

    def _is_stop_token(self, req: GenerationRequest, tok: int) -> bool:
        if tok in req.stop_token_ids:
            return True
        if req.ignore_eos:
            return False
        return self.tokenizer.is_eos(tok) or tok in self.stop_token_ids

    def _advance(self, seq: _Seq) -> None:
        """Sample the next token of ``seq`` from its logits and send what it releases."""
        handle, req = seq.handle, seq.handle.request
        try:
            tok, lp = _draw(seq, req.logprobs)
        except Exception as exc:
            if not _client_fault(exc):
                log.exception("request %d failed while sampling", handle.id)
            self._fail(seq, f"sampling failed: {exc}", 500)
            return
        seq.logits = None
        seq.buf[seq.filled] = tok
        seq.filled += 1
        seq.generated += 1
        if seq.first:
            seq.first = False
            self.metrics.observe_first_token(time.perf_counter() - handle.submitted)
        self.metrics.observe_tokens(1)
        if self._is_stop_token(req, tok):
            self._flush_tail(seq)
            self._finish(seq, "stop")
            return
        seq.pending.append(tok)
        if lp is not None:
            seq.pending_lp.append(lp)
        piece, hit = seq.matcher.feed(seq.detok.push(tok))
        if hit:
            if piece:
                self._send(seq, piece)
            self._finish(seq, "stop")
            return
        if piece:
            self._send(seq, piece)
        if seq.generated >= seq.limit:
            self._flush_tail(seq)
            at_context = len(req.prompt) + seq.generated >= self.max_context
            cap_hit = req.max_tokens is not None and seq.generated >= req.max_tokens
            self._finish(seq, "length" if cap_hit or not at_context else "context")
            return
        seq.token = tok

    def _send(self, seq: _Seq, text: str) -> None:
        chunk = Chunk(seq.index, text, tuple(seq.pending), tuple(seq.pending_lp))
        seq.pending, seq.pending_lp = [], []
        self._emit(seq.handle, chunk)

    def _flush_tail(self, seq: _Seq) -> None:
        tail, hit = seq.matcher.feed(seq.detok.flush())
        if not hit:
            tail += seq.matcher.flush()
        if tail or seq.pending:
            self._send(seq, tail)

    # ---------------------------------------------------------------- decode

    def _decode(self, live: list[_Seq]) -> None:
        sessions = [s.session for s in live]
        tokens = [int(s.token) for s in live if s.token is not None]
        try:
            logits, advanced = self._adapter.decode_batch(sessions, tokens)
        except Exception:
            if len(live) == 1:
                self._decode_failed(live[0])
                return
            for seq in live:  # isolate the sequence at fault
                try:
                    one, adv = self._adapter.decode_batch([seq.session], [int(seq.token or 0)])
                except Exception:
                    self._decode_failed(seq)
                    continue
                self._decoded(seq, one[0], adv[0])
            return
        for i, seq in enumerate(live):
            self._decoded(seq, logits[i], advanced[i])

    def _decoded(self, seq: _Seq, row: npt.NDArray[np.float32], session: SessionSnapshot) -> None:
        seq.token = None
        seq.session = session
        if seq.handle.cancelled:
            self._finish(seq, "cancelled")
            return
        seq.logits = row

    def _decode_failed(self, seq: _Seq) -> None:
        import sys

        exc = sys.exc_info()[1]
        log.error("request %d failed in decode: %s", seq.handle.id, exc)
        self._fail(seq, f"decode failed: {exc}", 500)

    # -------------------------------------------------------------- finishing

    def _emit(self, handle: RequestHandle, event: Event) -> None:
        """Queue ``event`` for `_deliver` (the step hands a step's events out at once)."""
        self._outbox.append((handle, event))

    def _deliver(self) -> None:
        """Call the sinks of every queued event, in order (deque: safe from close())."""
        box = self._outbox
        if not box:
            return
        while box:
            handle, event = box.popleft()
            try:
                handle._sink(event)
            except Exception:  # a broken sink cancels its own request only
                log.exception("the sink of request %d raised; cancelling it", handle.id)
                handle._cancelled = True
        for hook in self._flush_hooks:
            try:
                hook()
            except Exception:  # never the step's problem
                log.exception("an on_delivered hook raised")

    def _finish(self, seq: _Seq, reason: FinishReason, *, error: str | None = None) -> None:
        if seq.finished:
            return
        seq.finished = True
        seq.logits = None
        seq.token = None
        if reason not in ("error", "cancelled") and seq.index == 0:
            # keep the whole conversation: the next turn of a chat starts with it
            self._cache_insert(seq.session)
        self._emit(seq.handle, Finish(seq.index, reason, seq.generated, error))
        seq.handle.open -= 1
        self.metrics.observe_finish(reason)

    def _fail(self, seq: _Seq, message: str, status: int) -> None:
        if seq.finished:
            return
        seq.finished = True
        seq.logits = None
        seq.token = None
        self._emit(seq.handle, Finish(seq.index, "error", seq.generated, message, status))
        seq.handle.open -= 1
        self.metrics.observe_finish("error")

    def _cancel_handle(self, handle: RequestHandle, error: str | None) -> None:
        for i in range(handle.request.n):
            self._emit(handle, Finish(i, "cancelled", 0, error))
            self.metrics.observe_finish("cancelled")
        handle.open = 0
        if threading.current_thread() is not self._thread:  # close(): no step will follow
            self._deliver()


def _order(order: str | tuple[str, ...] | None) -> str | list[str] | None:
    return list(order) if isinstance(order, tuple) else order


def _error_finish(index: int, exc: BaseException, generated: int) -> Finish:
    status = 400 if _client_fault(exc) else 500
    return Finish(index, "error", generated, str(exc) or type(exc).__name__, status)
