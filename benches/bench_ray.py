"""Batch generation over Ray Data: prompts per second at 1 and 2 actors, against a plain local loop.

Run the figures with ``python benches/bench_ray.py [n_prompts] [max_tokens]`` (release build;
starts a local Ray cluster); pytest runs the same code once on a few prompts as a smoke test.
The baseline is the same prompts generated one after another in this process with
`rlx_lm.generate` (no Ray): the ratios say what Ray's actors add or cost on this machine.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from rlx_lm import SampleOpts, generate, load_default

OPTS = SampleOpts(temperature=0.8, top_k=40)


def _prompts(n: int) -> list[str]:
    words = ["the", "old", "river", "king", "said", "house", "night", "small"]
    return [" ".join(words[(i + k) % len(words)] for k in range(3 + i % 5)) for i in range(n)]


def measure(n: int, max_tokens: int, actors: tuple[int, ...] = (1, 2)) -> dict[str, float]:
    """Prompts per second: local loop, then Ray with each actor count (cluster must be up)."""
    from rlx_lm.ray import generate as ray_generate

    prompts = _prompts(n)
    runner, tok = load_default()
    t = time.perf_counter()
    for i, p in enumerate(prompts):
        generate(runner, tok, p, opts=OPTS, seed=1, max_tokens=max_tokens, sequence_id=i)
    out = {"local": n / (time.perf_counter() - t)}
    for k in actors:
        # Warm the pool's model load out of the timing: a job of one row per actor first.
        ray_generate(prompts[:k], opts=OPTS, max_tokens=1, num_actors=k).take_all()
        t = time.perf_counter()
        rows = ray_generate(
            prompts, opts=OPTS, seed=1, max_tokens=max_tokens, num_actors=k, batch_size=16
        ).take_all()
        assert len(rows) == n
        out[f"ray_{k}"] = n / (time.perf_counter() - t)
    return out


def _report(figures: dict[str, float]) -> str:
    base = figures["local"]
    return "\n".join(
        f"{name:>8}: {rate:8.1f} prompts/s  ({rate / base:.2f}x local)"
        for name, rate in figures.items()
    )


def test_bench_ray_smoke() -> None:
    ray: Any = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        figures = measure(8, 2, actors=(1,))
    finally:
        if started:
            ray.shutdown()
    assert set(figures) == {"local", "ray_1"}
    assert all(rate > 0 for rate in figures.values())


if __name__ == "__main__":
    import ray
    import ray.data

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    print(_report(measure(n, max_tokens)))
