"""The OpenAI-compatible server as Ray Serve replicas, with prefix-aware routing.

Two deployments make one Serve application:

* ``RlxIngress`` (one or more light replicas, no model) takes the HTTP request
  from Serve's proxy, reads its body, works out a routing key from the start
  of the prompt (the first ``prefix_chars`` characters of the rendered chat
  messages or of the completion prompt), and forwards the request through a
  deployment handle.
* ``RlxModel`` (N replicas) each hold one runner and run the very app that
  ``rlx-lm serve`` runs (`rlx_lm.server.create_app`: its own continuous batch
  and prefix cache). A forwarded request is fed to that ASGI app in-process and
  its response messages are streamed back, so status codes, errors, SSE
  framing and ``usage`` are exactly the single-process server's.

`PrefixAffinityRouter` is the handle's request router: requests with the same
key go to the same replica (rendezvous hashing over the live replicas, so a
replica joining or leaving moves only its share of keys), unless that replica's
queue is ``imbalance`` requests longer than the shortest one, when the
least-loaded replica wins. With it, requests sharing a system prompt land where
that prefix is cached; without it (``prefix_routing=False``) Serve's default
power-of-two-choices spreads them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import AsyncIterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from rlx_lm.errors import InvalidOptionError

__all__ = [  # and PrefixAffinityRouter, made on first use (it subclasses Ray's router)
    "build_app",
    "routing_key",
    "serve_app",
]

_MAX_BODY = 8 * 1024 * 1024


def routing_key(path: str, body: bytes, prefix_chars: int = 256) -> str:
    """The routing key of a request: a digest of the start of its prompt ("" when it has none)."""
    if not body or prefix_chars <= 0:
        return ""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(doc, dict):
        return ""
    text = ""
    if path.endswith("/chat/completions"):
        messages = doc.get("messages")
        if isinstance(messages, list):
            parts = []
            for m in messages:
                if isinstance(m, dict):
                    content = m.get("content")
                    if not isinstance(content, str):
                        content = json.dumps(content, sort_keys=True)
                    parts.append(f"{m.get('role')}:{content}\n")
                if sum(map(len, parts)) >= prefix_chars:
                    break
            text = "".join(parts)
    elif path.endswith("/completions"):
        prompt = doc.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)[: prefix_chars * 4]
    if not text:
        return ""
    return hashlib.blake2b(text[:prefix_chars].encode(), digest_size=12).hexdigest()


def _router_base() -> tuple[type, ...]:
    from ray.serve.request_router import FIFOMixin, RequestRouter

    return (FIFOMixin, RequestRouter)


def _weight(key: str, replica: Any) -> bytes:
    rid = getattr(replica.replica_id, "unique_id", str(replica.replica_id))
    return hashlib.blake2b(f"{key}|{rid}".encode(), digest_size=8).digest()


class _PrefixAffinityPolicy:
    """The choice itself, apart from Ray, so it can be tested on plain objects."""

    imbalance = 4

    def rank(self, key: str, replicas: list[Any], queue_len: Any) -> list[list[Any]]:
        if not replicas:
            return []
        if not key:
            shuffled = list(replicas)
            random.shuffle(shuffled)
            return [shuffled[:2], shuffled[2:]] if len(shuffled) > 2 else [shuffled]
        ranked = sorted(replicas, key=lambda r: _weight(key, r), reverse=True)
        lens = {id(r): queue_len(r) for r in ranked}
        known = [n for n in lens.values() if n is not None]
        mine = lens[id(ranked[0])]
        if known and mine is not None and mine > min(known) + self.imbalance:
            least = min((r for r in ranked if lens[id(r)] is not None), key=lambda r: lens[id(r)])
            return [[least], [r for r in ranked if r is not least]]
        # Only the owner: if its queue-length probe is slow (a busy machine), Serve retries
        # it with backoff instead of sending the request to a replica without the prefix.
        return [[ranked[0]]]


def _make_router_class() -> type:
    bases = _router_base()

    class PrefixAffinityRouter(_PrefixAffinityPolicy, *bases):  # type: ignore[misc]
        """Ray Serve request router: the same prompt prefix goes to the same replica."""

        def initialize_state(self, imbalance: int = 4, **kwargs: Any) -> None:
            self.imbalance = int(imbalance)

        async def choose_replicas(
            self, candidate_replicas: list[Any], pending_request: Any = None
        ) -> list[list[Any]]:
            key = ""
            if pending_request is not None and pending_request.args:
                first = pending_request.args[0]
                key = first if isinstance(first, str) else ""
            cache = self.replica_queue_len_cache
            return self.rank(key, list(candidate_replicas), lambda r: cache.get(r.replica_id))

    PrefixAffinityRouter.__module__ = __name__
    return PrefixAffinityRouter


def __getattr__(name: str) -> Any:
    # The router subclasses Ray's classes, so it exists only once Ray is importable.
    if name == "PrefixAffinityRouter":
        cls = _make_router_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


class _Replica:
    """One model replica: the single-process server's ASGI app, fed by forwarded requests."""

    def __init__(
        self,
        model: str | None,
        server: Mapping[str, Any],
        load: Mapping[str, Any],
        chat_template: str | None = None,
    ):
        from rlx_lm.default_model import load_default
        from rlx_lm.generation import load_model
        from rlx_lm.server import ServerConfig, create_app

        kwargs = dict(load)
        if model is None:
            self.runner, self.tokenizer = load_default(**kwargs)
        else:
            self.runner, self.tokenizer = load_model(model, **kwargs)
        if chat_template is not None:
            self.tokenizer.set_chat_template(chat_template)
        self.app = create_app(self.runner, self.tokenizer, config=ServerConfig(**dict(server)))

    async def handle(
        self,
        key: str,
        method: str,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> AsyncIterator[dict[str, Any]]:
        """Run one request through the app; yield its ASGI response messages."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }
        out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        gone = asyncio.Event()
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            await out.put(dict(message))

        task = asyncio.create_task(self.app(scope, receive, send))
        try:
            while True:
                getter = asyncio.create_task(out.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    message = getter.result()
                    yield message
                    if message["type"] == "http.response.body" and not message.get("more_body"):
                        break
                else:
                    getter.cancel()
                    task.result()  # the app ended without finishing its response: raise
                    break
        finally:
            gone.set()  # the client went away (or we are done): the app frees the slot
            if not task.done():
                try:
                    await asyncio.wait_for(task, timeout=5)
                except (asyncio.TimeoutError, Exception):
                    task.cancel()


class _Ingress:
    """The HTTP side: read the body, key it by its prompt prefix, forward to a model replica."""

    def __init__(self, model_handle: Any, prefix_chars: int = 256) -> None:
        self._handle = model_handle.options(stream=True)
        self._prefix_chars = prefix_chars

    def __serve_build_asgi_app__(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        async def forward(request: Request) -> Response:
            body = b""
            async for part in request.stream():
                body += part
                if len(body) > _MAX_BODY:
                    error = {
                        "message": f"request body over {_MAX_BODY} bytes",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "body_too_large",
                    }
                    return JSONResponse({"error": error}, status_code=413)
            path = request.url.path
            key = routing_key(path, body, self._prefix_chars)
            headers = [(k.lower(), v) for k, v in request.headers.raw]
            gen = self._handle.handle.remote(
                key, request.method, path, request.url.query.encode(), headers, body
            )
            start = await gen.__anext__()
            status = int(start.get("status", 500))
            raw = [
                (bytes(k), bytes(v))
                for k, v in start.get("headers", [])
                if bytes(k).lower() != b"content-length"
            ]

            async def chunks() -> AsyncIterator[bytes]:
                async for message in gen:
                    if message["type"] == "http.response.body":
                        data = message.get("body", b"")
                        if data:
                            yield bytes(data)

            response = StreamingResponse(chunks(), status_code=status)
            response.raw_headers = [
                *raw,
                *[h for h in response.raw_headers if h[0] not in {k.lower() for k, _ in raw}],
            ]
            return response

        return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


def serve_app(
    model: str | Path | None = None,
    *,
    num_replicas: int | str = 2,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    num_cpus_per_replica: float = 1.0,
    threads: int | None = None,
    max_ongoing_requests: int = 32,
    prefix_routing: bool = True,
    prefix_chars: int = 256,
    imbalance: int = 4,
    server: Mapping[str, Any] | None = None,
    load_kwargs: Mapping[str, Any] | None = None,
    chat_template: str | None = None,
) -> Any:
    """A Ray Serve application: ``serve.run(serve_app(...))`` serves the OpenAI API.

    ``num_replicas`` model replicas (or autoscaling between ``min_replicas`` and
    ``max_replicas``), each reserving ``num_cpus_per_replica`` CPUs and loading
    ``model`` (None: the bundled default model) with ``threads`` compute
    threads (default: the CPUs it reserves). ``server`` holds `ServerConfig`
    fields for every replica. ``max_ongoing_requests`` bounds what Serve sends
    one replica at once (its batch plus queue). ``chat_template`` (Jinja text) replaces
    the model's own chat template in every replica.
    """
    from ray import serve

    if prefix_chars < 0:
        raise InvalidOptionError(f"prefix_chars must be >= 0, got {prefix_chars}")
    if num_cpus_per_replica <= 0:
        raise InvalidOptionError(f"num_cpus_per_replica must be > 0, got {num_cpus_per_replica}")
    server_cfg = dict(server or {})
    from rlx_lm.server import ServerConfig

    ServerConfig(**server_cfg)  # refuse a bad field here, not in every replica
    if chat_template is not None:
        from rlx_lm.chat_template import ChatTemplate

        ChatTemplate(chat_template)  # and a template that does not compile
    load = dict(load_kwargs or {})
    if server_cfg.get("max_context"):
        load.setdefault("max_seq", server_cfg["max_context"])
    load.setdefault("threads", threads or max(1, int(num_cpus_per_replica)))
    model_path = None if model is None else str(Path(model).resolve())
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": num_cpus_per_replica},
        "max_ongoing_requests": max_ongoing_requests,
    }
    if min_replicas is not None or max_replicas is not None:
        lo = 1 if min_replicas is None else min_replicas
        hi = max(lo, 2 if max_replicas is None else max_replicas)
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi}
    else:
        options["num_replicas"] = num_replicas
    if prefix_routing:
        from ray.serve.config import RequestRouterConfig

        options["request_router_config"] = RequestRouterConfig(
            # Imported by name in the process that routes (the ingress replica).
            request_router_class=f"{__name__}.PrefixAffinityRouter",  # type: ignore[arg-type]
            request_router_kwargs={"imbalance": imbalance},
        )
    model_dep = serve.deployment(name="RlxModel", **options)(_Replica)
    ingress = serve.deployment(name="RlxIngress", ray_actor_options={"num_cpus": 0})(
        serve.ingress()(_Ingress)
    )
    return ingress.bind(model_dep.bind(model_path, server_cfg, load, chat_template), prefix_chars)


def build_app(args: dict[str, str]) -> Any:
    """Application builder for ``serve run rlx_lm.ray.serve:build_app model=... num_replicas=2``."""
    known = {"model", "num_replicas", "num_cpus_per_replica", "prefix_routing", "prefix_chars"}
    unknown = set(args) - known
    if unknown:
        raise InvalidOptionError(
            f"unknown serve run arguments {sorted(unknown)}; known: {sorted(known)}"
        )
    return serve_app(
        args.get("model") or None,
        num_replicas=int(args.get("num_replicas", 2)),
        num_cpus_per_replica=float(args.get("num_cpus_per_replica", 1)),
        prefix_routing=args.get("prefix_routing", "true").lower() not in {"0", "false", "no"},
        prefix_chars=int(args.get("prefix_chars", 256)),
    )
