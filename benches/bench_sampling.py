"""Sampler-chain speed as ratios to np.argmax over the same row, timed in the same run.

Run the table:   python benches/bench_sampling.py [--cpu]  (needs a release build)
As benchmarks:   make bench   (ratios printed per group by benches/conftest.py)
As smoke tests:  make check runs each bench once, untimed

Rows are LM-shaped: token ranks in random order, logit = 12 - s*ln(1+rank) plus
Gumbel noise (scale 0.5). s = 2.2 is a peaked row (top-p 0.95 keeps a handful of
tokens); s = 1.1 is a flat one (top-p 0.95 keeps thousands).

The classic, top-p and penalties+DRY chains are also timed on a cycle of eight
rows of different shapes (from peaked to very flat, as consecutive steps of a real
decode loop are), against np.argmax over the same cycle ("mixed"): gather widths
adapt from one row to the next, so a repeated row alone would flatter them.

The penalties+DRY chain is timed with three histories: the same 4096 tokens on
every call ("same"), a 4096-token window that slides by one token per call as in
a decode loop ("decode"), and two unrelated histories in turn, so that nothing
carries over from the previous call ("fresh").
"""

from __future__ import annotations

import functools
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rlx_lm import SampleOpts, SamplerChain

VOCABS = (32000, 151936, 262144)
CLASSIC: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
PENALTIES: dict[str, Any] = {
    **CLASSIC,
    "repetition_penalty": 1.1,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.1,
    "repetition_window": 4096,
    "dry_multiplier": 0.8,
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "greedy": {},
    "classic": CLASSIC,
    "top_p": {"temperature": 0.8, "top_p": 0.95},
    "penalties+dry": PENALTIES,
}
TARGETS = {"greedy": 1.1, "classic": 3.0, "top_p": 5.0, "penalties+dry": 4.0}


def lm_row(vocab: int, shape: float = 2.2, seed: int = 0) -> np.ndarray:
    """One LM-shaped float32 logits row."""
    rng = np.random.default_rng(seed)
    rank = rng.permutation(vocab)
    return (12.0 - shape * np.log1p(rank) + 0.5 * rng.gumbel(size=vocab)).astype(np.float32)


def history(vocab: int, n: int = 4096, seed: int = 1) -> np.ndarray:
    """A token history with some repeats, as DRY and the penalties see in text."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, vocab, n // 4)
    return np.concatenate([base, base[: n // 4], rng.integers(0, vocab, n // 2)]).astype(np.int64)


#: The clock calls are timed with (``--cpu``: CPU seconds of the process, which on a
#: shared machine counts our work only; rayon's threads add theirs, so sample_batch's
#: ratio to row-by-row reads as work done, not wall-clock speedup).
CLOCK: Callable[[], float] = time.perf_counter


def best_of(fn: Callable[[], object], number: int) -> float:
    """Seconds per call: the best of several timed batches."""
    t0 = CLOCK()
    for _ in range(number):
        fn()
    return (CLOCK() - t0) / number


def ratio(
    fn: Callable[[], object], base: Callable[[], object], repeat: int = 15
) -> tuple[float, float, float]:
    """(fn seconds, base seconds, fn/base), interleaving the two to share machine noise."""
    # Calibrate so one batch takes about 20 ms.
    once = max(best_of(fn, 3), 1e-7)
    number = max(3, int(0.02 / once))
    base_number = max(3, int(0.02 / max(best_of(base, 3), 1e-7)))
    f, b = [], []
    for _ in range(repeat):
        b.append(best_of(base, base_number))
        f.append(best_of(fn, number))
    fs, bs = min(f), min(b)
    return fs, bs, fs / bs


def chain_for(name: str) -> SamplerChain:
    return SampleOpts(seed=1, **SCENARIOS[name]).into_chain()


HISTORY_MODES = ("same", "decode", "fresh")
MIXED_SHAPES = (1.1, 2.2, 1.5, 0.9, 2.0, 1.2, 1.8, 1.0)


def mixed_calls(
    vocab: int, name: str = "top_p"
) -> tuple[Callable[[], object], Callable[[], object]]:
    """A chain over a cycle of differently shaped rows, and np.argmax over the same cycle."""
    rows = [lm_row(vocab, shape, seed) for seed, shape in enumerate(MIXED_SHAPES)]
    chain = chain_for(name)
    hist = history(vocab) if name == "penalties+dry" else None
    chain_rows, base_rows = itertools.cycle(rows), itertools.cycle(rows)
    return (lambda: chain.sample(next(chain_rows), hist)), (lambda: np.argmax(next(base_rows)))


def call_for(
    name: str, vocab: int, shape: float = 2.2, history_mode: str = "same"
) -> tuple[Callable[[], object], np.ndarray]:
    """One sampling call of a scenario as a closure, and its row."""
    row = lm_row(vocab, shape)
    chain = chain_for(name)
    if name != "penalties+dry":
        return (lambda: chain.sample(row, None)), row
    hist = history(vocab)
    if history_mode == "same":
        return (lambda: chain.sample(row, hist)), row
    if history_mode == "decode":
        # The window slides by one token per call; once in 4096 calls it jumps back.
        stream = np.concatenate([hist, history(vocab, seed=2)])
        starts = itertools.cycle(range(4096))
        return (lambda: chain.sample(row, stream[(i := next(starts)) : i + 4096])), row
    other = history(vocab, seed=3)
    turns = itertools.cycle((hist, other))
    return (lambda: chain.sample(row, next(turns))), row


# --- pytest-benchmark entry points (smoke tests when benchmarks are disabled) -------
# Each (scenario, vocab) group has np.argmax over the same row as its baseline;
# benches/conftest.py prints every chain as a ratio of it.

CASES = [(name, 2.2) for name in SCENARIOS] + [("top_p", 1.1)]


def _group(name: str, shape: float, vocab: int) -> str:
    return f"sampler {name}{' (flat row)' if shape != 2.2 else ''} V={vocab}"


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize(("name", "shape"), CASES)
def test_np_argmax_baseline(benchmark: Any, name: str, shape: float, vocab: int) -> None:
    row = lm_row(vocab, shape)
    benchmark.group = _group(name, shape, vocab)
    benchmark.extra_info["baseline"] = True
    benchmark(np.argmax, row)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize(("name", "shape"), CASES)
def test_chain(benchmark: Any, name: str, shape: float, vocab: int) -> None:
    fn, _ = call_for(name, vocab, shape)
    benchmark.group = _group(name, shape, vocab)
    assert 0 <= int(benchmark(fn)) < vocab


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("mode", HISTORY_MODES[1:])
def test_penalties_history_modes(benchmark: Any, mode: str, vocab: int) -> None:
    fn, _ = call_for("penalties+dry", vocab, 2.2, mode)
    benchmark.group = _group("penalties+dry", 2.2, vocab)
    assert 0 <= int(benchmark(fn)) < vocab


MIXED = ("classic", "top_p", "penalties+dry")


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("name", MIXED)
def test_chain_mixed_rows(benchmark: Any, name: str, vocab: int) -> None:
    fn, _ = mixed_calls(vocab, name)
    benchmark.group = f"sampler {name} (mixed rows) V={vocab}"
    assert 0 <= int(benchmark(fn)) < vocab


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("name", MIXED)
def test_np_argmax_mixed_rows_baseline(benchmark: Any, name: str, vocab: int) -> None:
    _, base = mixed_calls(vocab, name)
    benchmark.group = f"sampler {name} (mixed rows) V={vocab}"
    benchmark.extra_info["baseline"] = True
    benchmark(base)


def test_call_overhead_small_vocab(benchmark: Any) -> None:
    row = lm_row(16)
    chain = chain_for("classic")
    benchmark.group = "sampler call overhead V=16"
    benchmark(chain.sample, row, None)


def test_rows_one_by_one_baseline(benchmark: Any) -> None:
    logits = np.stack([lm_row(151936, seed=s) for s in range(32)])
    chain = chain_for("classic")
    benchmark.group = "sampler 32 x 151936 rows"
    benchmark.extra_info["baseline"] = True
    benchmark(lambda: [chain.sample(r) for r in logits])


def test_sample_batch(benchmark: Any) -> None:
    logits = np.stack([lm_row(151936, seed=s) for s in range(32)])
    chain = chain_for("classic")
    benchmark.group = "sampler 32 x 151936 rows"
    assert benchmark(chain.sample_batch, logits).shape == (32,)


# --- the table --------------------------------------------------------------------


def main() -> int:
    import argparse

    import rlx_lm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="time in CPU seconds, not wall clock")
    args = ap.parse_args()
    global CLOCK
    if args.cpu:
        CLOCK = time.process_time

    if rlx_lm.build_profile != "release":
        print("build a release extension first: maturin develop --release", file=sys.stderr)
        return 2
    print(
        f"{'scenario':<22}{'vocab':>8}{'np.argmax us':>14}{'chain us':>10}{'ratio':>8}{'target':>8}"
    )
    for name in SCENARIOS:
        variants = [(2.2, "same")]
        if name == "top_p":
            variants.append((1.1, "same"))
        if name == "penalties+dry":
            variants += [(2.2, "decode"), (2.2, "fresh")]
        for shape, mode in variants:
            for vocab in VOCABS:
                fn, row = call_for(name, vocab, shape, mode)
                s, b, r = ratio(fn, functools.partial(np.argmax, row))
                label = name if shape == 2.2 else f"{name} (flat)"
                if mode != "same":
                    label = f"{name} ({mode})"
                us = f"{b * 1e6:>14.1f}{s * 1e6:>10.1f}"
                print(f"{label:<22}{vocab:>8}{us}{r:>8.2f}{TARGETS[name]:>8}")
    for name in ("classic", "top_p", "penalties+dry"):
        for vocab in VOCABS:
            fn, base = mixed_calls(vocab, name)
            s, b, r = ratio(fn, base)
            us = f"{b * 1e6:>14.1f}{s * 1e6:>10.1f}"
            print(f"{name + ' (mixed)':<22}{vocab:>8}{us}{r:>8.2f}{'-':>8}")
    row16 = lm_row(16)
    chain = chain_for("classic")
    s16 = min(best_of(lambda: chain.sample(row16, None), 20000) for _ in range(7))
    print(f"call overhead, classic chain, V=16: {s16 * 1e6:.2f} us (target <= 2 us)")
    logits = np.stack([lm_row(151936, seed=s) for s in range(32)])
    rows = list(logits)
    batch = min(best_of(lambda: chain.sample_batch(logits), 5) for _ in range(7))
    single = min(best_of(lambda: [chain.sample(r) for r in rows], 5) for _ in range(7))
    print(
        f"sample_batch 32 x 151936: {batch * 1e3:.2f} ms vs {single * 1e3:.2f} ms row by row "
        f"= {single / batch:.2f}x the single-row rate (target >= 1.8x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
