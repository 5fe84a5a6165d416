"""Text generation: a runner, a tokenizer and sampler options -> text, token by token.

`stream` yields one `GenerationChunk` per sampled token (its id, the text it completed, and
optionally its log-probability); `generate` collects the whole `GenerationResult`. Both:

* drive any runner: its own cached prefill/decode pair, or `HostDriven` re-prefill when it
  has none;
* sample with the Rust `SamplerChain` built from `SampleOpts` (greedy by default), feeding it
  the whole token history (prompt, then output, with ``prompt_len`` marking the split) for
  penalties and DRY; ``chain.sample`` accepts each token, so every step draws afresh;
* stop on EOS, on ``max_tokens``, on a stop string, which is never emitted (text that could
  be the beginning of a stop string is held back until it is clearly not), or at the end of
  the runner's context (stop reason ``"context"``, not an exception);
* report phases through one ``on_event`` callback: ``load``, ``cache_lookup``, ``prefill``
  (with ``done``/``total`` tokens), ``decode`` (per token), ``stop`` (with the reason);
* reuse and refill a `PromptCache` when one is given and the runner has sessions.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rlx_lm._core import SamplerChain
from rlx_lm.errors import CapacityError, InvalidOptionError, RlxError, SnapshotMismatchError
from rlx_lm.host_driven import HostDriven
from rlx_lm.prompt_cache import PromptCache
from rlx_lm.runner import (
    LmCore,
    LmRunner,
    as_logits,
    supports_generate,
    supports_host_driven,
    supports_prompt_cache,
    with_defaults,
)
from rlx_lm.sample_opts import SampleOpts
from rlx_lm.tokenizer import Tokenizer

__all__ = [
    "EventCallback",
    "GenerationChunk",
    "GenerationEvent",
    "GenerationResult",
    "Generator",
    "LogprobMode",
    "Phase",
    "StopReason",
    "TokenLogprob",
    "generate",
    "load_model",
    "stream",
]

StopReason = Literal["eos", "stop", "length", "cancelled", "context"]
Phase = Literal["load", "cache_lookup", "prefill", "decode", "stop"]
LogprobMode = Literal["raw", "penalized", "final"]


@dataclass(frozen=True)
class GenerationEvent:
    """One phase report: ``phase``, progress ``done``/``total`` and a free-form ``detail``."""

    phase: Phase
    done: int = 0
    total: int = 0
    detail: str = ""


EventCallback = Callable[[GenerationEvent], None]


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the ``top`` most likely ``(token, logprob)``."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationChunk:
    """One sampled token and the text it made printable ("" while held back).

    ``token`` is None for the closing chunk that releases text held back until the end.
    """

    token: int | None
    text: str
    logprob: TokenLogprob | None = None


@dataclass
class GenerationResult:
    """The outcome of a generation: text, tokens, why it stopped, and timings."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    stop_reason: StopReason = "length"
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    logprobs: list[TokenLogprob] | None = None

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens computed (not reused) per second of prefill."""
        computed = self.prompt_tokens - self.reused_tokens
        return computed / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens per second after the first (each needs one decode step)."""
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


class _StopMatcher:
    """Releases text unless it is, or may become, the start of a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add ``text``; return (releasable text, whether a stop string was hit)."""
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self.pending[: min(hits)]
            self.pending = ""
            return out, True
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:n]):
                    hold = n
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Generator:
    """The iterator `stream` returns; ``result`` is complete once it is exhausted."""

    def __init__(self, steps: Iterator[GenerationChunk], result: GenerationResult) -> None:
        self._steps = steps
        self.result = result

    def __iter__(self) -> Generator:
        return self

    def __next__(self) -> GenerationChunk:
        return next(self._steps)

    def close(self) -> None:
        """Stop early (the result then says ``cancelled`` unless already finished)."""
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()


def _make_chain(
    opts: SampleOpts | None,
    seed: int | None,
    order: str | Sequence[str] | None,
    sequence_id: int = 0,
) -> SamplerChain:
    if opts is None:
        opts = SampleOpts()
    if seed is not None:
        opts = replace(opts, seed=seed)
    return opts.into_chain(order, sequence_id=sequence_id)


def _encode(tokenizer: Tokenizer, prompt: str | Sequence[int]) -> list[int]:
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise InvalidOptionError("the prompt encodes to no tokens")
    return ids


def stream(
    runner: LmCore,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int],
    *,
    opts: SampleOpts | None = None,
    seed: int | None = None,
    order: str | Sequence[str] | None = None,
    max_tokens: int = 128,
    stop: Sequence[str] = (),
    logprobs: int | None = None,
    logprob_mode: LogprobMode = "raw",
    on_event: EventCallback | None = None,
    prompt_cache: PromptCache | None = None,
    sequence_id: int = 0,
) -> Generator:
    """Generate from ``prompt`` one token at a time (see the module docstring).

    ``logprobs=n`` records each token's log-probability and the ``n`` likeliest
    alternatives, under the raw, penalized or final distribution (``logprob_mode``).
    ``order`` is the chain's order (`SampleOpts.into_chain`): None, a preset, or stage names.
    ``sequence_id`` keys the seeded draw together with ``seed`` and the step, so
    sequences generated side by side (a server's batch, a Ray job's rows) each
    get their own random stream, reproducible from (seed, sequence_id) alone.
    """
    if max_tokens < 0:
        raise InvalidOptionError(f"max_tokens must be >= 0, got {max_tokens}")
    if logprobs is not None and logprobs < 0:
        raise InvalidOptionError(f"logprobs must be >= 0, got {logprobs}")
    ids = _encode(tokenizer, prompt)
    chain = _make_chain(opts, seed, order, sequence_id)
    result = GenerationResult(prompt_tokens=len(ids), logprobs=[] if logprobs is not None else None)
    steps = _steps(
        runner,
        tokenizer,
        ids,
        chain,
        max_tokens,
        stop,
        logprobs,
        logprob_mode,
        on_event,
        prompt_cache,
        result,
    )
    return Generator(steps, result)


def generate(
    runner: LmCore,
    tokenizer: Tokenizer,
    prompt: str | Sequence[int],
    *,
    opts: SampleOpts | None = None,
    seed: int | None = None,
    order: str | Sequence[str] | None = None,
    max_tokens: int = 128,
    stop: Sequence[str] = (),
    logprobs: int | None = None,
    logprob_mode: LogprobMode = "raw",
    on_event: EventCallback | None = None,
    prompt_cache: PromptCache | None = None,
    sequence_id: int = 0,
) -> GenerationResult:
    """Run `stream` to the end and return its `GenerationResult`."""
    gen = stream(
        runner,
        tokenizer,
        prompt,
        opts=opts,
        seed=seed,
        order=order,
        max_tokens=max_tokens,
        stop=stop,
        logprobs=logprobs,
        logprob_mode=logprob_mode,
        on_event=on_event,
        prompt_cache=prompt_cache,
        sequence_id=sequence_id,
    )
    for _ in gen:
        pass
    return gen.result


def _emit(
    cb: EventCallback | None, phase: Phase, done: int = 0, total: int = 0, detail: str = ""
) -> None:
    if cb is not None:
        cb(GenerationEvent(phase, done, total, detail))


def _prefill(
    runner: Any, ids: list[int], on_event: EventCallback | None, prompt_cache: PromptCache | None
) -> tuple[npt.NDArray[np.float32], int, Any]:
    """Prefill through the prompt cache when possible; return (logits, reused tokens, driver)."""
    n = len(ids)
    driver: Any = runner if supports_host_driven(runner) else HostDriven(runner)
    set_progress = getattr(runner, "set_progress_callback", None)
    if callable(set_progress) and on_event is not None:
        set_progress(lambda done, total: _emit(on_event, "prefill", done, total))
    try:
        _emit(on_event, "prefill", 0, n)
        reused = 0
        if prompt_cache is not None and supports_prompt_cache(runner):
            snap, reuse = prompt_cache.lookup(ids)
            _emit(
                on_event,
                "cache_lookup",
                int(reuse),
                n,
                "hit" if snap is not None and reuse else "miss",
            )
            logits = None
            if snap is not None and reuse > 0:
                try:
                    logits = runner.prefill_logits_reusing(ids, snap, int(reuse))
                    reused = min(int(reuse), n - 1)
                except SnapshotMismatchError as e:  # a cached entry this runner cannot use
                    warnings.warn(
                        f"prompt cache: the cached prefix does not fit this runner ({e}); "
                        "prefilling from scratch",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            if logits is None:
                logits = driver.prefill_logits(ids)
            _cache_insert(prompt_cache, runner)
        else:
            logits = driver.prefill_logits(ids)
        _emit(on_event, "prefill", n, n)
    finally:
        if callable(set_progress) and on_event is not None:
            set_progress(None)
    return as_logits(logits, runner.vocab_size), reused, driver


def _cache_insert(prompt_cache: PromptCache, runner: Any) -> None:
    """Store the runner's session; a cache that refuses it never costs the caller the result."""
    try:
        snapshot = runner.export_session()
        if snapshot is not None:
            prompt_cache.insert(snapshot)
    except (RlxError, OSError) as e:
        warnings.warn(
            f"prompt cache: the session was not cached ({type(e).__name__}: {e})",
            RuntimeWarning,
            stacklevel=4,
        )


def _sample(
    chain: SamplerChain,
    logits: npt.NDArray[np.float32],
    history: npt.NDArray[np.int64],
    prompt_len: int,
    top_n: int | None,
    mode: LogprobMode,
) -> tuple[int, TokenLogprob | None]:
    if top_n is None:
        return int(chain.sample(logits, history, prompt_len=prompt_len)), None
    out = chain.sample_with_logprobs(logits, history, top_n, mode=mode, prompt_len=prompt_len)
    tok = int(out.token)
    top = tuple((int(t), float(lp)) for t, lp in out.top)
    return tok, TokenLogprob(tok, float(out.logprob), top)


def _steps(
    runner: Any,
    tokenizer: Tokenizer,
    ids: list[int],
    chain: SamplerChain,
    max_tokens: int,
    stop: Sequence[str],
    top_n: int | None,
    logprob_mode: LogprobMode,
    on_event: EventCallback | None,
    prompt_cache: PromptCache | None,
    result: GenerationResult,
) -> Iterator[GenerationChunk]:
    result.stop_reason = "cancelled"
    t0 = time.perf_counter()
    logits, result.reused_tokens, driver = _prefill(runner, ids, on_event, prompt_cache)
    result.prefill_seconds = time.perf_counter() - t0
    # One int64 buffer, viewed up to the current length: the chain reads it without
    # converting a Python list every step.
    buffer = np.empty(len(ids) + max_tokens, dtype=np.int64)
    buffer[: len(ids)] = ids
    filled = len(ids)
    detok = tokenizer.detokenizer(ids)
    matcher = _StopMatcher(stop)
    text: list[str] = []
    reason: StopReason = "length"
    t1 = time.perf_counter()
    try:
        for step in range(max_tokens):
            # sample() accepts the token too: the next step draws a fresh number.
            tok, lp = _sample(chain, logits, buffer[:filled], len(ids), top_n, logprob_mode)
            buffer[filled] = tok
            filled += 1
            if tokenizer.is_eos(tok):
                reason = "eos"
                break
            result.tokens.append(tok)
            if lp is not None and result.logprobs is not None:
                result.logprobs.append(lp)
            piece, hit = matcher.feed(detok.push(tok))
            text.append(piece)
            _emit(on_event, "decode", step + 1, max_tokens)
            yield GenerationChunk(tok, piece, lp)
            if hit:
                reason = "stop"
                break
            if step + 1 < max_tokens:
                capacity = getattr(runner, "max_seq", None)
                if isinstance(capacity, int) and filled > capacity:
                    reason = "context"
                    break
                try:
                    logits = as_logits(driver.decode_logits(tok), runner.vocab_size)
                except CapacityError:
                    reason = "context"
                    break
        else:
            reason = "length"
        if reason != "stop":
            tail, hit = matcher.feed(detok.flush())
            tail += "" if hit else matcher.flush()
            if tail:
                text.append(tail)
                yield GenerationChunk(None, tail, None)
        result.stop_reason = reason
    finally:
        result.decode_seconds = time.perf_counter() - t1
        result.text = "".join(text)
        if prompt_cache is not None and supports_prompt_cache(runner) and result.tokens:
            _cache_insert(prompt_cache, runner)
        _emit(on_event, "stop", len(result.tokens), max_tokens, result.stop_reason)


def load_model(
    path: str | Path,
    *,
    on_event: EventCallback | None = None,
    **builder: Any,
) -> tuple[LmRunner, Tokenizer]:
    """Build the runner for ``path`` through the family registry and load its tokenizer.

    ``builder`` names `LmRunnerBuilder` setters and their values (``max_seq=512``,
    ``threads=2``, ...). Without ``max_seq`` the context is the model's trained one, capped
    by a memory budget (`rlx_lm.context.default_context`), and by ``max_memory_gb`` when it
    is given (the longest context whose KV cache fits beside the weights).
    The runner is what the family's loader built when it has its own ``generate`` (the
    reference family's does), else that runner wrapped by `with_defaults`: an `LmRunner`
    either way, so ``runner.generate(...)`` type-checks in the caller's code.
    """
    from rlx_lm.builder import LmRunnerBuilder
    from rlx_lm.progress import load_progress

    _emit(on_event, "load", 0, 1, str(path))
    b = LmRunnerBuilder().weights(path)
    for name, value in builder.items():
        setter = getattr(b, name, None)
        if setter is None or name.startswith("_") or not callable(setter):
            raise InvalidOptionError(f"LmRunnerBuilder has no setting {name!r}")
        b = setter(value)
    if "max_seq" not in builder:
        from rlx_lm.context import default_context

        ctx = default_context(b.resolved_weights(), kv_dtype=b.kv_dtype())
        fits = b.fitting_max_seq()  # None without max_memory_gb
        b = b.max_seq(ctx if fits is None else min(ctx, fits))
    with load_progress(lambda done, total: _emit(on_event, "load", done, total, str(path))):
        built = b.build()
    tokenizer = Tokenizer.load(b.resolved_weights())
    runner: LmRunner = built if supports_generate(built) else with_defaults(built)
    return runner, tokenizer
