"""Batched decode of 8 sequences against one, in CPU time on one engine thread.

    python benches/probe_batched.py FILE [--activations exact|q8] [--threads N]

Prints the best and median rates of one sequence (context 64, 24 steps) and of 8 sequences
in one ``decode_batch`` (8 steps), and their ratio. One thread is timed in CPU seconds
(robust to a busy machine); more threads in wall-clock seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from rlx_lm.runners.llama import load_llama


def _times(step: Callable[[], object], reps: int, clock: Callable[[], float]) -> list[float]:
    out = []
    for _ in range(reps):
        t = clock()
        step()
        out.append(clock() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--activations", default="exact", choices=["exact", "q8"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    clock = time.process_time if args.threads == 1 else time.perf_counter
    runner = load_llama(args.file, max_seq=256, threads=args.threads, activations=args.activations)
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(0, runner.vocab_size, n)]

    runner.prefill_logits(ids(64))
    one = _times(lambda: runner.decode_logits(ids(1)[0]), 24, clock)
    sessions = []
    for _ in range(args.batch):
        runner.prefill_logits(ids(64))
        sessions.append(runner.export_session())

    def step() -> None:
        nonlocal sessions
        _, sessions = runner.decode_batch(sessions, ids(args.batch))

    many = _times(step, 8, clock)
    b = args.batch
    print(
        f"{args.file.rsplit('/', 1)[-1]} {args.activations} threads={args.threads}: "
        f"one {1 / min(one):.1f} tok/s (median {1 / statistics.median(one):.1f}); "
        f"{b} {b / min(many):.1f} tok/s (median {b / statistics.median(many):.1f}); "
        f"{b} / one: best {min(one) * b / min(many):.2f}, "
        f"median {statistics.median(one) * b / statistics.median(many):.2f}"
    )


if __name__ == "__main__":
    main()
