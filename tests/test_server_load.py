"""A bounded load test on loopback: 32 concurrent streaming clients, a fixed number of
requests each, a time limit. Every request completes (or gets a clean error), none is lost
or mixed up, a seeded request streams the tokens it gives alone, and memory stays flat."""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Any

import httpx

import rlx_lm
from rlx_lm.server import ServerConfig, create_app
from tests.server_harness import live_server

CLIENTS = 32
ROUNDS = 3  # the first warms up; memory is compared between the later ones
PER_ROUND = 1
SEEDS = 8
TOKENS = 8
TIME_LIMIT = 600.0  # generous: CI machines are shared; the test stops by itself
PROMPTS = ["It is a truth universally acknowledged", "She was", "Mr Darcy"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _body(seed: int) -> dict[str, Any]:
    return {
        "prompt": PROMPTS[seed % len(PROMPTS)],
        "max_tokens": TOKENS,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
        "ignore_eos": True,
    }


async def _stream(client: httpx.AsyncClient, url: str, seed: int) -> tuple[str, str | None]:
    """(text, error) of one streamed completion, checking the framing as it goes."""
    text, finish = [], None
    async with client.stream("POST", url, json=_body(seed)) as r:
        if r.status_code != 200:
            body = json.loads(await r.aread())
            return "", body["error"]["message"]
        done = False
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            assert not done, "an event after [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return "", event["error"]["message"]
            (choice,) = event["choices"]
            text.append(choice["text"])
            finish = choice["finish_reason"] or finish
        assert done
    assert finish == "length"
    return "".join(text), None


def test_32_concurrent_streaming_clients() -> None:
    runner, tok = rlx_lm.load_default(max_seq=128)
    cfg = ServerConfig(
        model_name="m", max_batch=CLIENTS, max_queue=CLIENTS, prompt_cache_bytes=8 << 20
    )
    app = create_app(runner, tok, config=cfg)
    with live_server(app) as server:
        url = f"{server.url}/v1/completions"

        async def run() -> tuple[
            dict[int, str], list[list[tuple[int, str, str | None]]], list[int]
        ]:
            limits = httpx.Limits(max_connections=CLIENTS + 4)
            async with httpx.AsyncClient(timeout=TIME_LIMIT, limits=limits) as client:
                alone = {}
                for seed in range(SEEDS):  # one at a time: the reference
                    text, err = await _stream(client, url, seed)
                    assert err is None
                    alone[seed] = text
                rounds, rss = [], []
                for _ in range(ROUNDS):

                    async def one_client(c: int) -> list[tuple[int, str, str | None]]:
                        out = []
                        for k in range(PER_ROUND):
                            seed = (c + k) % SEEDS
                            text, err = await _stream(client, url, seed)
                            out.append((seed, text, err))
                        return out

                    results = await asyncio.gather(*(one_client(c) for c in range(CLIENTS)))
                    rounds.append([r for client_results in results for r in client_results])
                    rss.append(_rss_bytes())
                return alone, rounds, rss

        alone, rounds, rss = asyncio.run(asyncio.wait_for(run(), TIME_LIMIT))
        metrics = httpx.get(f"{server.url}/metrics").text
    for results in rounds:
        assert len(results) == CLIENTS * PER_ROUND  # none lost
        for seed, text, err in results:
            assert err is None, err
            assert text == alone[seed]  # not mixed up, and the same as alone
    assert len(set(alone.values())) > 1
    # memory: flat between the rounds after the first (warm caches, pools)
    assert rss[-1] - rss[1] < 48 << 20, [r >> 20 for r in rss]
    assert "rlx_lm_running_sequences 0" in metrics
    assert "rlx_lm_queue_depth 0" in metrics
    # the batch really ran many sequences at once
    big = [ln for ln in metrics.splitlines() if ln.startswith('rlx_lm_batch_size_bucket{le="4"}')]
    total = [ln for ln in metrics.splitlines() if ln.startswith("rlx_lm_batch_size_count")]
    assert int(big[0].split()[-1]) < int(total[0].split()[-1])
