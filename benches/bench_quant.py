"""Quantised matmuls in place against numpy's float32 matmul over the dequantised weight.

Run the table:   python benches/bench_quant.py          (needs a release build)
As benchmarks:   make bench   (ratios printed per group by benches/conftest.py)

A 2048 x 5632 weight (a 1B model's MLP projection) in each GGUF block format, times one
activation row (a decode step) and 32 rows (a prefill chunk). The baseline is numpy's BLAS on
the same weight held as float32 (4x to 7x the memory); "gguf" is what packed weights did before
the Rust kernels: dequantise with gguf.quants on every use.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from rlx_lm._core import quant_matmul

T = gguf.GGMLQuantizationType
QTYPES = (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K)
ROWS, COLS = 2048, 5632


def random_blocks(qtype: T, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> np.ndarray:
    """Random block bytes with small float16 scales."""
    rng = np.random.default_rng(seed)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // values * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)
    at = 208 if qtype == T.Q6_K else 0
    scales = rng.uniform(-0.02, 0.02, blocks.shape[:2]).astype(np.float16)
    blocks[:, :, at : at + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if qtype == T.Q4_K:
        mins = rng.uniform(0.0, 0.02, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, 2:4] = mins.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return raw


def best(fn: Callable[[], object], repeat: int = 7, number: int = 5) -> float:
    """Seconds per call, best of `repeat` batches."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t0) / number)
    return min(out)


@pytest.mark.parametrize("n", [1, 32])
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_dense_float32_baseline(benchmark: Any, qtype: T, n: int) -> None:
    w = dequantize(random_blocks(qtype, 256, COLS), qtype).reshape(256, COLS)
    x = np.random.default_rng(1).standard_normal((n, COLS)).astype(np.float32)
    benchmark.group = f"quant {qtype.name} n={n}"
    benchmark.extra_info["baseline"] = True
    benchmark(lambda: x @ w.T)


@pytest.mark.parametrize("n", [1, 32])
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
def test_quant_matmul(benchmark: Any, qtype: T, n: int) -> None:
    raw = random_blocks(qtype, 256, COLS)
    x = np.random.default_rng(1).standard_normal((n, COLS)).astype(np.float32)
    benchmark.group = f"quant {qtype.name} n={n}"
    assert benchmark(quant_matmul, raw, int(qtype), COLS, x).shape == (n, 256)


def main() -> int:
    import rlx_lm

    if rlx_lm.build_profile != "release":
        print("build a release extension first: maturin develop --release", file=sys.stderr)
        return 2
    print(f"{ROWS} x {COLS} weight; times in ms; ratio = ours / numpy float32 matmul")
    print(f"{'format':<8}{'n':>4}{'numpy f32':>11}{'ours':>9}{'ratio':>8}{'gguf':>10}")
    for qtype in QTYPES:
        raw = random_blocks(qtype)
        w = dequantize(raw, qtype).reshape(ROWS, COLS)
        for n in (1, 32):
            x = np.random.default_rng(1).standard_normal((n, COLS)).astype(np.float32)
            base = best(functools.partial(np.matmul, x, w.T))
            ours = best(functools.partial(quant_matmul, raw, int(qtype), COLS, x))

            def old(x: np.ndarray = x, raw: np.ndarray = raw, q: T = qtype) -> object:
                return x @ dequantize(raw, q).T

            old_s = best(old, 1, 1)
            print(
                f"{qtype.name:<8}{n:>4}{base * 1e3:>11.2f}{ours * 1e3:>9.2f}"
                f"{ours / base:>8.2f}{old_s * 1e3:>10.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
