"""The OpenAI server as Ray Serve replicas: answers the openai client, routes by prompt prefix."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from rlx_lm.ray.serve import _PrefixAffinityPolicy, routing_key, serve_app  # noqa: E402

# System prompts longer than the router's default prefix_chars (256), as real ones are.
SYSTEMS = [
    " ".join(f"{w}{i}" for w in ("the", "old", "river", "king", "said", "house", "night")) * 8
    for i in range(8)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replica(name: str) -> Any:
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name))


def test_routing_key_depends_only_on_the_prompt_start() -> None:
    a = routing_key("/v1/completions", b'{"prompt": "abcdef", "max_tokens": 3}', 4)
    b = routing_key("/v1/completions", b'{"prompt": "abcdXYZ", "seed": 1}', 4)
    c = routing_key("/v1/completions", b'{"prompt": "abXdef"}', 4)
    assert a == b != c
    system = b'{"role": "system", "content": "be brief"}'
    chat = b'{"messages": [' + system + b', {"role": "user", "content": "hi"}]}'
    other = b'{"messages": [' + system + b', {"role": "user", "content": "yo"}]}'
    assert routing_key("/v1/chat/completions", chat, 10) == routing_key(
        "/v1/chat/completions", other, 10
    )
    assert routing_key("/v1/completions", b"not json", 8) == ""
    assert routing_key("/v1/models", b"", 8) == ""


def test_policy_is_sticky_and_yields_to_an_overloaded_replica() -> None:
    policy = _PrefixAffinityPolicy()
    replicas = [_replica(f"r{i}") for i in range(3)]
    first = policy.rank("k1", replicas, lambda r: 0)[0][0]
    assert all(policy.rank("k1", replicas, lambda r: 0)[0][0] is first for _ in range(5))
    # Keys spread over replicas.
    owners = {
        policy.rank(f"k{i}", replicas, lambda r: 0)[0][0].replica_id.unique_id for i in range(40)
    }
    assert len(owners) == 3
    # Removing another replica does not move this key (rendezvous hashing).
    rest = [r for r in replicas if r is not first]
    assert policy.rank("k1", [first, rest[0]], lambda r: 0)[0][0] is first
    # Overloaded: the least-loaded replica takes it.
    lens = {id(first): 10, id(rest[0]): 1, id(rest[1]): 3}
    assert policy.rank("k1", replicas, lambda r: lens[id(r)])[0][0] is rest[0]


@pytest.mark.usefixtures("ray_cluster")
def test_two_replicas_serve_the_openai_client_and_prefix_routing_raises_hits() -> None:
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120)
    rates: dict[bool, float] = {}
    prefix_hits: dict[bool, int] = {}
    try:
        for routing in (False, True):
            serve.run(
                serve_app(num_replicas=2, prefix_routing=routing, server={"max_context": 256}),
                name="rlx",
                route_prefix="/",
            )
            cached = prompt = hits = 0
            texts = []
            for rep in range(3):
                for i, system in enumerate(SYSTEMS):
                    r = client.completions.create(
                        model="rlx-lm",
                        prompt=f"{system} question {rep} {i}",
                        max_tokens=3,
                        temperature=0,
                    )
                    texts.append(r.choices[0].text)
                    details = r.usage.prompt_tokens_details
                    reused = int(getattr(details, "cached_tokens", 0) or 0)
                    cached += reused
                    prompt += r.usage.prompt_tokens
                    hits += reused * 2 >= r.usage.prompt_tokens  # the system prompt was cached
            stream = client.completions.create(
                model="rlx-lm", prompt=SYSTEMS[0], max_tokens=4, stream=True, temperature=0
            )
            assert "".join(c.choices[0].text for c in stream if c.choices)
            rates[routing] = cached / prompt
            prefix_hits[routing] = hits
            serve.delete("rlx")
    finally:
        serve.shutdown()
    print(f"prompt-cache hit rate: {rates}; requests that found their system prompt: {prefix_hits}")
    # 8 prefixes x 3 requests over 2 replicas: routed, each prefix misses once and hits twice;
    # spread by power-of-two choices, a prefix misses once more on the other replica
    # unless all three of its requests land on one (probability 1/4 per prefix).
    assert prefix_hits[True] == 16, prefix_hits
    assert prefix_hits[False] < prefix_hits[True], prefix_hits
    assert rates[True] > rates[False], rates
