"""The OpenAI-compatible HTTP app: Starlette routes over one `BatchScheduler`.

``create_app(runner, tokenizer, config=ServerConfig(...))`` returns an ASGI app with

* ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or server-sent
  events in OpenAI's chunk format ending with ``data: [DONE]`` when ``stream`` is true);
* ``GET /v1/models`` (and ``/v1/models/{id}``), ``GET /health``, ``GET /metrics``;
* ``POST /tokenize`` and ``POST /detokenize`` (llama-server's and vLLM's request shapes).

The model runs on the scheduler's thread; the event loop only parses, submits and
forwards events. Errors are OpenAI's error JSON: 400 for a bad field (``param`` names
it), 404 for an unknown model, 413 for a body over ``max_body_bytes``, 503 with
``Retry-After`` when the queue is full or the server is shutting down, 401 on a ``/v1/``
route (but ``/health`` and ``/metrics``) without the key when ``config.api_key`` is set, 500
when the
runner fails (that request alone). A stream that fails after it started gets one
``data: {"error": ...}`` event, then ``[DONE]``. A client that disconnects cancels its
request; the scheduler frees the slot at its next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from queue import SimpleQueue
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rlx_lm.errors import CapacityError, InvalidOptionError
from rlx_lm.generation import TokenLogprob
from rlx_lm.reasoning import ReasoningParser, parser_for
from rlx_lm.runner import LmCore
from rlx_lm.server import protocol as proto
from rlx_lm.server.config import ServerConfig
from rlx_lm.server.protocol import ParsedRequest, ProtocolError, error_body
from rlx_lm.server.scheduler import (
    BatchScheduler,
    Chunk,
    Event,
    Finish,
    QueueFullError,
    RequestHandle,
    ShuttingDownError,
)
from rlx_lm.tokenizer import Tokenizer
from rlx_lm.tool_calls import ToolCall, ToolCallParser, tool_call_format, tool_call_parser

__all__ = ["create_app"]

log = logging.getLogger("rlx_lm.server")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error(
    status: int,
    message: str,
    param: str | None = None,
    *,
    type_: str | None = None,
    code: Any = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    kind = type_ or (
        "invalid_request_error"
        if status < 500
        else "server_error"
        if status != 503
        else "overloaded"
    )
    return JSONResponse(error_body(message, param, kind, code), status_code=status, headers=headers)


class _ApiKey:
    """ASGI middleware: every route but ``/health`` and ``/metrics`` answers 401 (OpenAI's
    ``invalid_api_key`` error JSON) unless the request carries the key, as
    ``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``; compared in constant time."""

    OPEN = frozenset({"/health", "/metrics"})

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode("ascii")

    def _given(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), self.key):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN and not self._given(scope):
            response = _error(
                401,
                "Invalid or missing API key: send it as 'Authorization: Bearer KEY'.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _option_error(exc: Exception, prompt_field: str) -> JSONResponse:
    text = str(exc)
    field, _, rest = text.partition(":")
    if isinstance(exc, CapacityError):
        return _error(400, rest.strip() or text, prompt_field, code="context_length_exceeded")
    if field == "prompt":
        field = prompt_field
    return _error(400, text, field if rest else None)


class _Outbox:
    """Events on their way from the scheduler thread to one event loop, coalesced.

    `put` (any thread) only appends to a deque; `flush`, which the scheduler calls once
    it has handed out a step's events (`BatchScheduler.on_delivered`), rings a bell
    unless a wake-up is pending already, and a small thread of the outbox's own wakes
    the loop. So a step's burst of B events (one per running sequence) costs the loop
    one wake-up and one pass, and the pass runs while the step's decode does:

    * waking the loop at every put let the woken loop take the GIL (the wake-up's socket
      write releases it) and drain one event while the scheduler thread waited to hand
      out the next: 2.7 to 3 wake-ups per step at 8 and 16 streams;
    * waking it from the scheduler thread once per step still cost that thread 0.5 to
      0.8 ms a step (SmolLM2, load 6 on 2 cores): the loop took the GIL during the
      write and the scheduler thread waited for its whole pass before it could start
      the decode. The bell (a `queue.SimpleQueue` put) releases no GIL; the ringer
      thread gets the GIL when the scheduler thread lets it go, in the decode.

    `_drain` clears the pending flag before it empties the deque: an event put while it
    runs is either taken by this pass or left for the next flush, which then sees no
    wake-up pending. `close` ends the ringer thread.
    """

    __slots__ = ("__weakref__", "_bell", "_closed", "_items", "_loop", "_pending", "wakes")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[asyncio.Queue[Any], Any]] = deque()
        self._pending = False
        self._closed = False
        self._bell: SimpleQueue[bool] = SimpleQueue()
        self.wakes = 0
        """Wake-ups of the loop asked for so far."""
        threading.Thread(target=self._ring, name="rlx-lm-outbox", daemon=True).start()

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        self._items.append((queue, item))

    def flush(self) -> None:
        if self._items and not self._pending and not self._closed:
            self._pending = True
            self.wakes += 1
            self._bell.put(True)

    def close(self) -> None:
        """End the ringer thread; later flushes wake nobody."""
        self._closed = True
        self._bell.put(False)

    def _ring(self) -> None:
        bell, loop, drain = self._bell, self._loop, self._drain
        while bell.get():
            try:
                loop.call_soon_threadsafe(drain)
            except RuntimeError:  # the loop is closed: nobody is left to read
                self._closed = True
                return

    def _drain(self) -> None:
        self._pending = False
        items = self._items
        while items:
            queue, item = items.popleft()
            queue.put_nowait(item)


class _Stream:
    """Events of one HTTP request (all its prompts), moved from the scheduler thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, box: _Outbox) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.handles: list[RequestHandle] = []
        self._box = box

    def sink(self, k: int) -> Callable[[Event], None]:
        box, queue = self._box, self.queue

        def put(event: Event) -> None:
            box.put(queue, (k, event))

        return put

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()


class _Frames:
    """The SSE frames of one streamed response, in OpenAI's chunk format.

    `frame` renders any chunk; `text` renders the commonest one, a choice's new text with
    no logprobs, from a prefix and suffix rendered once, so a token costs one
    ``json.dumps`` of its text. Both give the same bytes (tests/test_server_frames.py).
    """

    __slots__ = ("_body", "_close", "_open", "_text")

    def __init__(self, kind: str, parsed: ParsedRequest) -> None:
        chat = kind == "chat"
        self._body: dict[str, Any] = {
            "id": proto.new_id("chatcmpl" if chat else "cmpl"),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": proto.now(),
            "model": parsed.model,
            "system_fingerprint": None,
        }
        self._close = ',"usage":null' if parsed.include_usage else ""
        head = json.dumps(self._body, separators=(",", ":"))[:-1]
        self._open = f'data: {head},"choices":['
        if chat:
            self._text = '{"index":%d,"delta":{"content":%s},"logprobs":null,"finish_reason":null}'
        else:
            self._text = '{"index":%d,"text":%s,"logprobs":null,"finish_reason":null}'

    def frame(self, choices: list[dict[str, Any]], usage: Any = None) -> str:
        """One ``data:`` event carrying ``choices`` (and ``usage`` when the client asked)."""
        body = {**self._body, "choices": choices}
        if self._close:  # the client asked for usage: every chunk carries the key
            body["usage"] = usage
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    def text(self, index: int, text: str) -> str:
        """``frame`` of choice ``index``'s new ``text`` with no logprobs and no finish."""
        choice = self._text % (index, json.dumps(text))
        return f"{self._open}{choice}]{self._close}}}\n\n"


class _Reply:
    """A chat choice's reply through its parsers, as (reasoning, content, calls) pieces: the
    tool calls are read out of the reasoning parser's answer (a call thought about is not
    made), but harmony's out of the raw reply, whose message headers name the recipient."""

    def __init__(
        self, reasoning: ReasoningParser | None, tools: ToolCallParser | None, tools_first: bool
    ) -> None:
        self.reasoning, self.tools, self.tools_first = reasoning, tools, tools_first
        self.calls = 0  # calls handed out so far (a stream's tool_calls indices)

    def _think(self, text: str, last: bool) -> tuple[str, str]:
        if self.reasoning is None:
            return "", text
        r, a = self.reasoning.feed(text) if text else ("", "")
        if last:
            r2, a2 = self.reasoning.finish()
            r, a = r + r2, a + a2
        return r, a

    def _call(self, text: str, last: bool) -> tuple[str, list[ToolCall]]:
        if self.tools is None:
            return text, []
        t, c = self.tools.feed(text) if text else ("", [])
        if last:
            t2, c2 = self.tools.finish()
            t, c = t + t2, c + c2
        return t, c

    def feed(self, text: str, last: bool = False) -> tuple[str, str, list[ToolCall]]:
        """The reasoning, content and calls ``text`` completes (``last``: and the rest)."""
        if self.tools_first:
            t, calls = self._call(text, last)
            r, a = self._think(t, last)
        else:
            r, a = self._think(text, last)
            a, calls = self._call(a, last)
        self.calls += len(calls)
        return r, a, calls

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        return self.feed("", last=True)


def _reason(reason: str | None, calls: int) -> str | None:
    """OpenAI's finish reason: a reply that stopped after making calls ended in them."""
    return "tool_calls" if calls and reason == "stop" else reason


class _App:
    def __init__(
        self, runner: LmCore, tokenizer: Tokenizer, config: ServerConfig, scheduler: BatchScheduler
    ) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.scheduler = scheduler
        self.metrics = scheduler.metrics
        self.created = proto.now()
        self._outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = (
            weakref.WeakKeyDictionary()
        )
        self.limits = proto.Limits(
            model_name=config.model_name,
            vocab_size=scheduler.vocab_size,
            max_tokens=config.max_tokens,
            max_n=min(config.max_n, config.max_batch),
            max_top_logprobs=config.max_top_logprobs,
        )
        self.tool_format = self._tool_format(config.tool_call_format)

    def _tool_format(self, fmt: str) -> str | None:
        """The format tool calls are read in (see `ServerConfig.tool_call_format`)."""
        if fmt != "auto":
            return None if fmt == "none" else fmt
        template = getattr(self.tokenizer, "chat_template", None)
        probe = getattr(getattr(self.tokenizer, "inner", None), "token_to_id", None)
        markup = ("<|channel|>", "<|message|>", "<|call|>")
        words = [t for t in markup if callable(probe) and probe(t) is not None]
        return tool_call_format(getattr(template, "source", None), words)

    def _outbox(self) -> _Outbox:
        """The outbox of the running loop, flushed by the scheduler after each hand-out."""
        loop = asyncio.get_running_loop()
        box = self._outboxes.get(loop)
        if box is None:
            box = self._outboxes[loop] = _Outbox(loop)
            self.scheduler.on_delivered(box.flush)
        return box

    def close(self) -> None:
        """End the outboxes' ringer threads (the app's lifespan is over)."""
        for box in list(self._outboxes.values()):
            box.close()

    # ----------------------------------------------------------- small routes

    async def health(self, request: Request) -> Response:
        if self.scheduler.closing:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "rlx-lm",
            "max_model_len": self.scheduler.max_context,
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name != self.config.model_name:
            return _error(
                404, f"The model `{name}` does not exist", "model", code="model_not_found"
            )
        return JSONResponse(self._model_card())

    async def tokenize(self, request: Request) -> Response:
        return await self._tokens(request, proto.tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._tokens(request, proto.detokenize)

    async def _tokens(
        self, request: Request, answer: Callable[[Any, Tokenizer, proto.Limits], dict[str, Any]]
    ) -> Response:
        try:
            body = await self._body(request)
            # a long prompt or a chat template takes a while: off the event loop
            out = await asyncio.to_thread(answer, body, self.tokenizer, self.limits)
        except ProtocolError as exc:
            response = _error(exc.status, exc.message, exc.param, code=exc.code)
        else:
            if "count" in out:
                out["max_model_len"] = self.scheduler.max_context
            response = JSONResponse(out)
        self.metrics.observe_request(request.url.path, response.status_code)
        return response

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    # ------------------------------------------------------------ generation

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def _generate(self, request: Request, kind: str) -> Response:
        endpoint = request.url.path
        response = await self._answer(request, kind)
        self.metrics.observe_request(endpoint, response.status_code)
        return response

    async def _body(self, request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.config.max_body_bytes:
            raise ProtocolError(
                f"the request body is over {self.config.max_body_bytes} bytes", status=413
            )
        raw = await request.body()
        if len(raw) > self.config.max_body_bytes:
            raise ProtocolError(
                f"the request body is over {self.config.max_body_bytes} bytes", status=413
            )
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"the request body is not valid JSON: {exc}") from None

    async def _answer(self, request: Request, kind: str) -> Response:
        prompt_field = "messages" if kind == "chat" else "prompt"
        try:
            body = await self._body(request)
            if kind == "chat":
                parsed = proto.parse_chat(body, self.tokenizer, self.limits)
            else:
                parsed = proto.parse_completion(body, self.tokenizer, self.limits)
        except ProtocolError as exc:
            return _error(exc.status, exc.message, exc.param, type_=None, code=exc.code)
        stream = _Stream(asyncio.get_running_loop(), self._outbox())
        try:
            for k, req in enumerate(parsed.requests):
                stream.handles.append(self.scheduler.submit(req, stream.sink(k)))
        except (InvalidOptionError, CapacityError) as exc:
            stream.cancel()
            return _option_error(exc, prompt_field)
        except QueueFullError as exc:
            stream.cancel()
            return _error(
                503,
                f"the server is busy: {exc}; retry after {exc.retry_after} s",
                headers={"Retry-After": str(exc.retry_after)},
            )
        except ShuttingDownError as exc:
            stream.cancel()
            return _error(503, str(exc), headers={"Retry-After": str(self.config.retry_after)})
        try:
            if parsed.stream:
                return await self._stream(request, kind, parsed, stream)
            return await self._collect(request, kind, parsed, stream)
        except BaseException:
            stream.cancel()
            raise

    def _parsers(self, kind: str, parsed: ParsedRequest) -> list[_Reply | None]:
        """Each choice's reply parsers (chat only): reasoning (`ServerConfig.reasoning_format`)
        and, for a request with tools, tool calls (`ServerConfig.tool_call_format`)."""
        n = parsed.requests[0].n
        total = n * len(parsed.requests)
        if kind != "chat":
            return [None] * total
        fmt = str(parsed.extra.get("reasoning_format") or self.config.reasoning_format)
        tools = self.tool_format if parsed.extra.get("tools") else None
        out: list[_Reply | None] = []
        for i in range(total):
            reasoning = parser_for(self.tokenizer, parsed.requests[i // n].prompt, fmt)
            calls = None if tools is None else tool_call_parser(tools)
            both = reasoning is not None or calls is not None
            out.append(_Reply(reasoning, calls, tools == "harmony") if both else None)
        return out

    # ---------------------------------------------------------- non-streaming

    async def _collect(
        self, request: Request, kind: str, parsed: ParsedRequest, stream: _Stream
    ) -> Response:
        n = parsed.requests[0].n
        total = n * len(parsed.requests)
        texts = [""] * total
        lps: list[list[TokenLogprob]] = [[] for _ in range(total)]
        finishes: list[Finish | None] = [None] * total
        watcher = asyncio.create_task(_on_disconnect(request, stream.cancel))
        try:
            left = total
            while left:
                k, ev = await stream.queue.get()
                i = k * n + ev.index
                if isinstance(ev, Chunk):
                    texts[i] += ev.text
                    lps[i].extend(ev.logprobs)
                else:
                    finishes[i] = ev
                    left -= 1
        finally:
            watcher.cancel()
        failed = next((f for f in finishes if f is not None and f.reason == "error"), None)
        if failed is not None:
            return _error(failed.status, failed.error or "generation failed")
        if any(f is not None and f.reason == "cancelled" for f in finishes):
            if self.scheduler.closing:
                return _error(503, "the server shut down before the request finished")
            return _error(499, "the request was cancelled", type_="cancelled")
        usage = self._usage(parsed, stream, finishes)
        parsers = self._parsers(kind, parsed)
        choices = []
        for i in range(total):
            f = finishes[i]
            assert f is not None
            reason = proto.finish_reason(f.reason)
            if kind == "chat":
                reply = parsers[i]
                reasoning, content, calls = (
                    ("", texts[i], []) if reply is None else reply.feed(texts[i], last=True)
                )
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if reasoning:
                    message["reasoning_content"] = reasoning
                if calls:
                    # OpenAI's shape: no text beside the calls is null content.
                    message["content"] = content if content.strip() else None
                    message["tool_calls"] = [c.to_openai() for c in calls]
                    reason = _reason(reason, len(calls))
                choices.append(
                    {
                        "index": i,
                        "message": message,
                        "logprobs": (
                            {"content": proto.chat_logprobs(self.tokenizer, lps[i])}
                            if parsed.logprobs
                            else None
                        ),
                        "finish_reason": reason,
                    }
                )
            else:
                choices.append(
                    {
                        "index": i,
                        "text": texts[i],
                        "logprobs": (
                            proto.completion_logprobs(self.tokenizer, lps[i], 0)
                            if parsed.logprobs
                            else None
                        ),
                        "finish_reason": reason,
                    }
                )
        body = {
            "id": proto.new_id("chatcmpl" if kind == "chat" else "cmpl"),
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": proto.now(),
            "model": parsed.model,
            "system_fingerprint": None,
            "choices": choices,
            "usage": usage,
        }
        return JSONResponse(body)

    @staticmethod
    def _usage(
        parsed: ParsedRequest, stream: _Stream, finishes: list[Finish | None]
    ) -> dict[str, Any]:
        prompt = sum(h.prompt_tokens for h in stream.handles)
        cached = sum(h.reused_tokens for h in stream.handles)
        completion = sum(f.completion_tokens for f in finishes if f is not None)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    # -------------------------------------------------------------- streaming

    async def _stream(
        self, request: Request, kind: str, parsed: ParsedRequest, stream: _Stream
    ) -> Response:
        # Wait for the first event: a request that fails in prefill still gets a status.
        first = await _first_event(request, stream)
        if first is None:
            return _error(499, "the client went away", type_="cancelled")
        _, ev0 = first
        if isinstance(ev0, Finish) and ev0.reason == "error":
            stream.cancel()
            return _error(ev0.status, ev0.error or "generation failed")
        return StreamingResponse(
            self._events(kind, parsed, stream, first),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )

    async def _events(
        self, kind: str, parsed: ParsedRequest, stream: _Stream, first: tuple[int, Event]
    ) -> AsyncIterator[bytes]:
        n = parsed.requests[0].n
        total = n * len(parsed.requests)
        frames = _Frames(kind, parsed)
        offsets = [0] * total
        finishes: list[Finish | None] = [None] * total
        fast = not parsed.logprobs  # a text chunk is then the pre-rendered frame
        parsers = self._parsers(kind, parsed)

        def split(i: int, text: str, lps: tuple[TokenLogprob, ...], out: list[str]) -> None:
            """A chat choice's new text through its reasoning parser, as frames: reasoning
            first, then answer; the token logprobs ride on the first frame (or on one of
            their own while a possible tag is held back)."""
            parser = parsers[i]
            assert parser is not None
            reasoning, content, calls = parser.feed(text) if text else ("", "", [])
            if reasoning:
                delta = {"reasoning_content": reasoning}
                lp = {"content": proto.chat_logprobs(self.tokenizer, lps)} if lps else None
                body = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}
                out.append(frames.frame([body]))
                lps = ()
            if content and fast:
                out.append(frames.text(i, content))
            elif content or lps:
                out.append(frames.frame([choice(i, content, lps, None)]))
            tool_frames(i, calls, parser.calls, out)

        def tool_frames(i: int, calls: list[ToolCall], made: int, out: list[str]) -> None:
            """Each call whole in one delta (``made``: the calls so far, these the last)."""
            first = made - len(calls)
            for j, call in enumerate(calls):
                delta = {"tool_calls": [call.to_openai(first + j)]}
                body = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                out.append(frames.frame([body]))

        def choice(
            i: int, text: str | None, lps: tuple[TokenLogprob, ...], reason: Any
        ) -> dict[str, Any]:
            if kind == "chat":
                delta: dict[str, Any] = {} if text is None else {"content": text}
                lp = (
                    {"content": proto.chat_logprobs(self.tokenizer, lps)}
                    if parsed.logprobs and text is not None
                    else None
                )
                return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason}
            lpc = (
                proto.completion_logprobs(self.tokenizer, lps, offsets[i])
                if parsed.logprobs and text is not None
                else None
            )
            return {"index": i, "text": text or "", "logprobs": lpc, "finish_reason": reason}

        try:
            if kind == "chat":
                yield "".join(
                    frames.frame(
                        [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                    for i in range(total)
                ).encode()
            left = total
            pending: tuple[int, Event] | None = first
            error: Finish | None = None
            queue = stream.queue
            while left:
                if pending is not None:
                    k, ev = pending
                    pending = None
                else:
                    k, ev = await queue.get()
                # Every event already waiting goes out in one write: under load the loop
                # catches up in one send instead of one per token.
                out: list[str] = []
                while True:
                    i = k * n + ev.index
                    if isinstance(ev, Chunk):
                        if parsers[i] is not None:
                            split(i, ev.text, ev.logprobs, out)
                        elif ev.text and fast:
                            out.append(frames.text(i, ev.text))
                        elif ev.text or ev.logprobs:
                            out.append(frames.frame([choice(i, ev.text, ev.logprobs, None)]))
                        offsets[i] += len(ev.text)
                    else:
                        finishes[i] = ev
                        left -= 1
                        if ev.reason == "error":
                            error = ev
                            stream.cancel()
                        else:
                            parser = parsers[i]
                            if parser is not None:
                                # What the parser held back (a tag that never came).
                                reasoning, content, calls = parser.finish()
                                if reasoning:
                                    delta = {"reasoning_content": reasoning}
                                    body = {"index": i, "delta": delta, "logprobs": None}
                                    body["finish_reason"] = None
                                    out.append(frames.frame([body]))
                                if content:
                                    out.append(frames.frame([choice(i, content, (), None)]))
                                tool_frames(i, calls, parser.calls, out)
                            reason = proto.finish_reason(ev.reason)
                            if parser is not None:
                                reason = _reason(reason, parser.calls)
                            out.append(frames.frame([choice(i, None, (), reason)]))
                    if not left or queue.empty():
                        break
                    k, ev = queue.get_nowait()
                if out:
                    yield "".join(out).encode()
            if error is not None:
                kind_ = "invalid_request_error" if error.status < 500 else "server_error"
                body = error_body(error.error or "generation failed", None, kind_)
                yield f"data: {json.dumps(body)}\n\n".encode()
            elif parsed.include_usage:
                yield frames.frame([], self._usage(parsed, stream, finishes)).encode()
            yield b"data: [DONE]\n\n"
        finally:
            stream.cancel()  # a client that went away: free the slots at the next step

    # ------------------------------------------------------------ not found

    async def not_found(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        detail = getattr(exc, "detail", "Not Found")
        return _error(status, f"{request.method} {request.url.path}: {detail}")

    async def internal(self, request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return _error(500, f"internal server error: {type(exc).__name__}")


async def _on_disconnect(request: Request, then: Callable[[], None]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            then()
            return


async def _first_event(request: Request, stream: _Stream) -> tuple[int, Event] | None:
    get = asyncio.ensure_future(stream.queue.get())
    gone = asyncio.ensure_future(_on_disconnect(request, stream.cancel))
    try:
        done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if get in done:
        return get.result()
    get.cancel()
    return None


def create_app(
    runner: LmCore,
    tokenizer: Tokenizer,
    *,
    config: ServerConfig | None = None,
    scheduler: BatchScheduler | None = None,
    stop_token_ids: tuple[int, ...] | None = None,
) -> Starlette:
    """The OpenAI-compatible ASGI app serving ``runner`` (see the module docstring).

    ``scheduler`` defaults to a new `BatchScheduler` over ``runner``; it starts with the
    app's lifespan (or at the first request when the host runs no lifespan) and closes
    at shutdown, giving in-flight requests ``config.shutdown_timeout`` seconds.
    ``stop_token_ids`` end a turn like EOS does; by default the tokenizer's end-of-turn
    ids when it has them (``Tokenizer.stop_token_ids``).
    """
    config = config if config is not None else ServerConfig()
    if stop_token_ids is None:
        stop_token_ids = tuple(getattr(tokenizer, "stop_token_ids", ()) or ())
    if scheduler is None:
        scheduler = BatchScheduler(runner, tokenizer, config, stop_token_ids=stop_token_ids)
    app_state = _App(runner, tokenizer, config, scheduler)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.close)
            app_state.close()

    routes = [
        Route("/v1/chat/completions", app_state.chat, methods=["POST"]),
        Route("/v1/completions", app_state.completions, methods=["POST"]),
        Route("/v1/models", app_state.models, methods=["GET"]),
        Route("/v1/models/{model:path}", app_state.model, methods=["GET"]),
        Route("/tokenize", app_state.tokenize, methods=["POST"]),
        Route("/detokenize", app_state.detokenize, methods=["POST"]),
        Route("/health", app_state.health, methods=["GET"]),
        Route("/metrics", app_state.metrics_text, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: app_state.not_found,
        Exception: app_state.internal,
    }
    middleware = [] if config.api_key is None else [Middleware(_ApiKey, key=config.api_key)]
    app = Starlette(
        routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=middleware
    )
    app.state.scheduler = scheduler
    app.state.config = config
    return app
