"""Decode-loop overhead and cached-vs-uncached decode of the Llama runner, as same-run ratios.

Run the full figures with ``python benches/bench_runner.py`` (release build); pytest runs the
same code once on a tiny model as a smoke test.

* overhead: one decode step of the generation loop (sample, accept, the runner's Python glue
  and the one call into the Rust engine) minus the time spent inside that engine call, as a
  fraction of the step. Measuring both in one step cancels the noise of a shared machine.
  Target below 10% at hidden 1024 x 8 layers.
* cache: decode step at ``ctx`` tokens of context vs a plain forward over all ``ctx + 1``
  tokens without a cache (what decoding costs without one). Target at least 10x at 512.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from rlx_lm.runners.llama import LlamaRunner, load_llama


def random_gguf(
    path: Path,
    *,
    hidden: int = 1024,
    layers: int = 8,
    heads: int = 16,
    kv_heads: int = 4,
    inter: int = 2816,
    vocab: int = 32000,
    seed: int = 0,
) -> Path:
    """A float32 llama GGUF with random weights."""
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)

    def mat(o: int, i: int) -> np.ndarray:
        m: np.ndarray = rng.standard_normal((o, i), dtype=np.float32) / np.float32(np.sqrt(i))
        return m

    ones = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(vocab, hidden))
    for b in range(layers):
        p = f"blk.{b}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", mat(heads * hd, hidden))
        w.add_tensor(p + "attn_k.weight", mat(kv_heads * hd, hidden))
        w.add_tensor(p + "attn_v.weight", mat(kv_heads * hd, hidden))
        w.add_tensor(p + "attn_output.weight", mat(hidden, heads * hd))
        w.add_tensor(p + "ffn_gate.weight", mat(inter, hidden))
        w.add_tensor(p + "ffn_up.weight", mat(inter, hidden))
        w.add_tensor(p + "ffn_down.weight", mat(hidden, inter))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _median(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class _TimedEngine:
    """The runner's engine with ``decode`` clocked."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def decode(self, cache: Any, token: int) -> Any:
        t = time.perf_counter()
        out = self._engine.decode(cache, token)
        self.seconds += time.perf_counter() - t
        return out


def decode_steps(runner: LlamaRunner, ctx: int, steps: int) -> tuple[float, float]:
    """Median step time of the generation loop (sample + accept + decode) at ``ctx`` context,
    and the median fraction of each step spent outside the engine call of that same step."""
    from rlx_lm import SampleOpts

    chain = SampleOpts().into_chain()
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, runner.vocab_size, ctx)]
    logits = runner.prefill_logits(prompt)
    history = list(prompt)
    times, fractions = [], []
    real = runner.engine
    clock = _TimedEngine(real)
    runner.engine = clock  # type: ignore[assignment]
    try:
        for _ in range(steps):
            clock.seconds = 0.0
            t = time.perf_counter()
            tok = chain.sample(logits, history)
            chain.accept(tok)
            history.append(tok)
            logits = runner.decode_logits(tok)
            step = time.perf_counter() - t
            times.append(step)
            fractions.append((step - clock.seconds) / step)
    finally:
        runner.engine = real
    return statistics.median(times), statistics.median(fractions)


def nocache_seconds(runner: LlamaRunner, ctx: int, reps: int) -> float:
    """Time to get the next logits at ``ctx`` context without a cache: a forward over ctx + 1."""
    prompt = list(np.random.default_rng(4).integers(0, runner.vocab_size, ctx + 1))
    return _median(lambda: runner.predict_logits(prompt), reps)


def report(runner: LlamaRunner, *, ctx: int, steps: int, reps: int) -> dict[str, float]:
    """Every figure of this bench, measured in one run."""
    step, overhead = decode_steps(runner, ctx, steps)
    full = nocache_seconds(runner, ctx, reps)
    return {
        "step_ms": step * 1e3,
        "overhead_fraction": overhead,
        "decode_tok_s": 1.0 / step,
        "nocache_ms": full * 1e3,
        "cache_speedup": full / step,
        "prefill_tok_s": (ctx + 1) / full,
    }


def test_bench_runner_smoke(tmp_path: Path) -> None:
    path = random_gguf(
        tmp_path / "m.gguf", hidden=64, layers=2, heads=4, kv_heads=2, inter=128, vocab=256
    )
    figures = report(load_llama(path, max_seq=64), ctx=16, steps=3, reps=1)
    assert set(figures) >= {"overhead_fraction", "cache_speedup"}
    assert all(np.isfinite(v) for v in figures.values())


if __name__ == "__main__":
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    with tempfile.TemporaryDirectory() as d:
        r = load_llama(random_gguf(Path(d) / "m.gguf"), max_seq=ctx + 64)
        for key, value in report(r, ctx=ctx, steps=30, reps=3).items():
            print(f"{key:>18}: {value:.4g}")
