"""Server counters, gauges and histograms, rendered as Prometheus text (format 0.0.4).

Every name starts with ``rlx_lm_``:

=======================================  =========  ==========================================
``requests_total{endpoint,status}``      counter    HTTP requests answered, by route and code
``prompt_tokens_total``                  counter    prompt tokens of admitted requests
``prompt_tokens_cached_total``           counter    of those, tokens the prefix cache supplied
``generation_tokens_total``              counter    tokens sampled
``prefills_total{cache}``                counter    prefills, ``cache="hit"`` or ``"miss"``
``finished_total{reason}``               counter    choices ended, by finish reason
``queue_depth``                          gauge      requests waiting for a slot
``running_sequences``                    gauge      sequences in the running batch
``prompt_cache_hit_rate``                gauge      cached / all prompt tokens so far
``prompt_cache_bytes``                   gauge      bytes the prefix cache holds
``decode_steps_total``                   counter    batched decode steps
``batch_size``                           histogram  sequences per decode step
``decode_seconds_total``                 counter    wall time inside the runner's batched decode
``step_gap_seconds``                     histogram  from one decode's end to the next one's start
``prefill_seconds_total``                counter    wall time spent prefilling admitted prompts
``time_to_first_token_seconds``          histogram  from submit to the first sampled token
=======================================  =========  ==========================================

The step probe: a running batch's time per token is ``decode_seconds`` plus the gap
between steps. The gap is what the scheduler itself puts on the step's critical path
(sampling, stop checks, admission and prefill of new requests, handing events out); it
is observed only between two consecutive steps of a busy scheduler, never across an
idle wait. Sums of both are kept as plain floats (``step_gap_seconds_sum``) so a bench
can difference them around one request.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter
from typing import Any

__all__ = ["Histogram", "ServerMetrics"]

_PREFIX = "rlx_lm_"


class Histogram:
    """A cumulative histogram with fixed upper bounds (``+Inf`` is implied)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is >= it."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, help_: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        total = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            total += c
            lines.append(f'{name}_bucket{{le="{_num(bound)}"}} {total}')
        total += self.counts[-1]
        lines.append(f'{name}_bucket{{le="+Inf"}} {total}')
        lines.append(f"{name}_sum {_num(self.sum)}")
        lines.append(f"{name}_count {self.count}")
        return lines


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ServerMetrics:
    """What a server counts; thread-safe. `render` gives the ``/metrics`` text."""

    TTFT_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
    BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128)
    GAP_BOUNDS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1, 1.0)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.prefills: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.decode_steps = 0
        self.batch_size = Histogram(self.BATCH_BOUNDS)
        self.decode_seconds = 0.0
        self.prefill_seconds = 0.0
        self.step_gap = Histogram(self.GAP_BOUNDS)
        self.ttft = Histogram(self.TTFT_BOUNDS)
        self._scheduler: Any = None

    def bind(self, scheduler: Any) -> None:
        """Read the live gauges (queue, batch, cache) from ``scheduler``."""
        self._scheduler = scheduler

    # -- observations ---------------------------------------------------------

    def observe_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, int(status))] += 1

    def observe_prefill(self, prompt_tokens: int, cached: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached
            self.prefills["hit" if cached > 0 else "miss"] += 1

    def observe_tokens(self, n: int) -> None:
        with self._lock:
            self.generation_tokens += n

    def observe_first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_batch(self, size: int) -> None:
        with self._lock:
            self.decode_steps += 1
            self.batch_size.observe(size)

    def observe_step(self, size: int, decode: float, gap: float | None) -> None:
        """One decode step of ``size`` sequences that took ``decode`` seconds, ``gap``
        seconds after the previous step ended (None: the scheduler was idle before)."""
        with self._lock:
            self.decode_steps += 1
            self.batch_size.observe(size)
            self.decode_seconds += decode
            if gap is not None:
                self.step_gap.observe(gap)

    def observe_prefill_time(self, seconds: float) -> None:
        with self._lock:
            self.prefill_seconds += seconds

    def observe_finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] += 1

    # -- reading --------------------------------------------------------------

    @property
    def cache_hit_rate(self) -> float:
        """Prompt tokens the prefix cache supplied, over all prompt tokens (0 before any)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def render(self) -> str:
        """The Prometheus text exposition of every metric."""
        p = _PREFIX
        s = self._scheduler
        queue = s.queue_depth if s is not None else 0
        running = s.running if s is not None else 0
        cache = getattr(s, "prompt_cache", None)
        cache_bytes = cache.stats().bytes if cache is not None else 0
        with self._lock:
            out: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                out.append(f"# HELP {p}{name} {help_}")
                out.append(f"# TYPE {p}{name} {kind}")
                for labels, value in samples:
                    out.append(f"{p}{name}{labels} {_num(value)}")

            metric(
                "requests_total",
                "counter",
                "HTTP requests answered, by endpoint and status code.",
                [
                    (f'{{endpoint="{_label(e)}",status="{c}"}}', v)
                    for (e, c), v in sorted(self.requests.items())
                ],
            )
            metric(
                "prompt_tokens_total",
                "counter",
                "Prompt tokens of admitted requests.",
                [("", self.prompt_tokens)],
            )
            metric(
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens supplied by the prefix cache.",
                [("", self.cached_tokens)],
            )
            metric(
                "generation_tokens_total",
                "counter",
                "Tokens sampled.",
                [("", self.generation_tokens)],
            )
            metric(
                "prefills_total",
                "counter",
                "Prefills, by prefix-cache outcome.",
                [(f'{{cache="{k}"}}', self.prefills[k]) for k in ("hit", "miss")],
            )
            metric(
                "finished_total",
                "counter",
                "Choices ended, by finish reason.",
                [(f'{{reason="{_label(k)}"}}', v) for k, v in sorted(self.finished.items())],
            )
            metric("queue_depth", "gauge", "Requests waiting for a slot.", [("", queue)])
            metric(
                "running_sequences",
                "gauge",
                "Sequences in the running batch.",
                [("", running)],
            )
            metric(
                "prompt_cache_hit_rate",
                "gauge",
                "Prompt tokens supplied by the prefix cache over all prompt tokens.",
                [("", self.cache_hit_rate)],
            )
            metric(
                "prompt_cache_bytes",
                "gauge",
                "Bytes held by the prefix cache.",
                [("", cache_bytes)],
            )
            metric(
                "decode_steps_total",
                "counter",
                "Batched decode steps.",
                [("", self.decode_steps)],
            )
            out += self.batch_size.render(f"{p}batch_size", "Sequences per decode step.")
            metric(
                "decode_seconds_total",
                "counter",
                "Wall seconds inside the runner's batched decode.",
                [("", self.decode_seconds)],
            )
            out += self.step_gap.render(
                f"{p}step_gap_seconds",
                "Seconds from one decode step's end to the next one's start (busy only).",
            )
            metric(
                "prefill_seconds_total",
                "counter",
                "Wall seconds spent prefilling admitted prompts.",
                [("", self.prefill_seconds)],
            )
            out += self.ttft.render(
                f"{p}time_to_first_token_seconds", "Seconds from submit to the first token."
            )
        return "\n".join(out) + "\n"
