"""``rlx-lm bench``: prompt processing and text generation speed on a model file, as
llama.cpp's ``llama-bench`` measures them.

* ``ppN``: one prefill of N random tokens into an empty context (tokens a second);
* ``tgN``: N tokens generated one at a time from an empty context (the first one
  prefilled alone, then N - 1 ``decode_logits`` steps; tokens a second);
* ``tgN xB`` (with ``batches``): B sequences generating N tokens each together, as
  llama.cpp's ``llama-batched-bench`` does and a server's batch does: each prefilled with
  its first token, then N - 1 ``decode_batch`` steps of B tokens (tokens a second, all B
  sequences counted).

Each test runs once to warm up, then ``reps`` times; a row gives the mean and the standard
deviation of the reps' rates. Random tokens (from a fixed seed) stand for text: the work
of a step does not depend on which tokens it sees.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_lm.config import Activations
from rlx_lm.errors import InvalidOptionError, UnsupportedError
from rlx_lm.session import SessionSnapshot

__all__ = ["BenchResult", "bench_model", "format_json", "format_markdown"]


@dataclass(frozen=True)
class BenchResult:
    """One test of one configuration: ``test`` is ``ppN`` or ``tgN``; ``samples`` the rate
    of each rep in tokens a second."""

    model: str
    size_bytes: int
    threads: int
    activations: str
    test: str
    n_tokens: int
    samples: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Tokens a second, the mean of the reps."""
        return statistics.fmean(self.samples)

    @property
    def stdev(self) -> float:
        """The reps' standard deviation (0 for one rep)."""
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The result as llama-bench's JSON output names things, plus ``samples``."""
        out = asdict(self)
        out["samples"] = list(self.samples)
        out["avg_ts"] = self.mean
        out["stddev_ts"] = self.stdev
        return out


def _check(name: str, values: Sequence[int], low: int) -> None:
    if not values or any(v < low for v in values):
        raise InvalidOptionError(f"{name}: every value must be >= {low}, got {list(values)}")


def bench_model(
    path: str | os.PathLike[str],
    *,
    prompts: Sequence[int] = (512,),
    gens: Sequence[int] = (128,),
    threads: Sequence[int] | None = None,
    activations: Sequence[Activations] = ("exact",),
    batches: Sequence[int] = (),
    reps: int = 5,
    on_result: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """Run ``ppN`` for each of ``prompts`` and ``tgN`` for each of ``gens`` (0 skips a
    test), and ``tgN xB`` for each of ``batches`` too, for every thread count (default:
    `available_cores`) and activations mode, on the model at ``path``. ``on_result`` sees
    each row as it is done."""
    from rlx_lm.builder import LmRunnerBuilder, available_cores

    prompts = [p for p in prompts if p != 0]
    gens = [g for g in gens if g != 0]
    _check("prompts", prompts or [1], 1)
    _check("gens", gens or [1], 1)
    if not prompts and not gens:
        raise InvalidOptionError("nothing to run: give a prompt or a generation length")
    thread_counts = list(threads) if threads is not None else [available_cores()]
    _check("threads", thread_counts, 1)
    _check("batches", list(batches) or [1], 1)
    if isinstance(reps, bool) or reps < 1:
        raise InvalidOptionError(f"reps: must be >= 1, got {reps}")
    file = Path(path)
    size = sum(f.stat().st_size for f in file.iterdir()) if file.is_dir() else file.stat().st_size
    ctx = max([*prompts, *gens]) + 1
    results: list[BenchResult] = []
    for mode in activations:
        for n_threads in thread_counts:
            builder = LmRunnerBuilder().weights(path).max_seq(ctx).threads(n_threads)
            timer = _Timer(builder.activations(mode).build())
            tests: list[tuple[str, int, Callable[[int], float]]]
            tests = [(f"pp{n}", n, timer.pp) for n in prompts]
            tests += [(f"tg{n}", n, timer.tg) for n in gens]
            for b in batches:
                tests += [(f"tg{n} x{b}", n, timer.batched(b)) for n in gens]
            for name, n, run in tests:
                run(n)  # warm-up
                row = BenchResult(
                    model=file.name,
                    size_bytes=size,
                    threads=n_threads,
                    activations=mode,
                    test=name,
                    n_tokens=n,
                    samples=tuple(run(n) for _ in range(reps)),
                )
                results.append(row)
                if on_result is not None:
                    on_result(row)
    return results


class _Timer:
    """The two tests on one runner, random tokens from a fixed seed."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.vocab = int(runner.vocab_size)
        self.rng = np.random.default_rng(0)

    def _ids(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(0, self.vocab, n)]

    def pp(self, n: int) -> float:
        """One prefill of ``n`` tokens into an empty context, tokens a second."""
        prompt = self._ids(n)
        t = time.perf_counter()
        self.runner.prefill_logits(prompt)
        return n / (time.perf_counter() - t)

    def batched(self, b: int) -> Callable[[int], float]:
        """``tgN xB``: ``b`` sequences, each prefilled with its first token, then ``n - 1``
        ``decode_batch`` steps (through `with_defaults`, so any runner); tokens a second."""
        from rlx_lm.runner import with_defaults

        runner = with_defaults(self.runner)

        def run(n: int) -> float:
            firsts = self._ids(b)
            steps = [self._ids(b) for _ in range(n - 1)]
            t = time.perf_counter()
            sessions: list[SessionSnapshot] = []
            for tok in firsts:
                runner.prefill_logits([tok])
                session = runner.export_session()
                if session is None:
                    raise UnsupportedError(f"{runner.family}: no sessions to decode in a batch")
                sessions.append(session)
            for toks in steps:
                _, sessions = runner.decode_batch(sessions, toks)
            return b * n / (time.perf_counter() - t)

        return run

    def tg(self, n: int) -> float:
        """``n`` tokens one at a time from an empty context, tokens a second."""
        steps = self._ids(n)
        t = time.perf_counter()
        self.runner.prefill_logits(steps[:1])
        for tok in steps[1:]:
            self.runner.decode_logits(tok)
        return n / (time.perf_counter() - t)


def format_markdown(rows: Sequence[BenchResult], *, header: bool = True) -> str:
    """llama-bench's table: model, size, threads, activations, test, t/s (mean +- sd)."""
    lines = []
    if header:
        lines += [
            "| model | size | threads | activations | test | t/s |",
            "| --- | ---: | ---: | --- | ---: | ---: |",
        ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.size_bytes / 2**20:.2f} MiB | {r.threads} | {r.activations} | "
            f"{r.test} | {r.mean:.2f} ± {r.stdev:.2f} |"
        )
    return "\n".join(lines)


def format_json(rows: Sequence[BenchResult]) -> str:
    """The rows as a JSON list (``avg_ts``, ``stddev_ts``, ``samples``, ...)."""
    return json.dumps([r.to_json() for r in rows], indent=2)
