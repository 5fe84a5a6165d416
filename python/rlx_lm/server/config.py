"""Server limits and names, in one frozen value shared by the scheduler and the app."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx_lm.errors import InvalidOptionError
from rlx_lm.reasoning import REASONING_FORMATS
from rlx_lm.tool_calls import TOOL_CALL_FORMATS

__all__ = ["ServerConfig"]


def _positive(name: str, value: object, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionError(f"{name}: must be an integer, got {type(value).__name__}")
    low = 0 if allow_zero else 1
    if value < low:
        raise InvalidOptionError(f"{name}: must be >= {low}, got {value}")


@dataclass(frozen=True)
class ServerConfig:
    """Limits of one server (one runner).

    * ``max_batch``: sequences decoded together at most (a request with ``n`` choices
      takes ``n``); the rest wait in the queue.
    * ``max_queue``: requests waiting beyond the running batch; one more is refused with
      503 and ``Retry-After: retry_after`` seconds.
    * ``max_context``: prompt plus generated tokens of one sequence. None takes the
      runner's ``max_seq`` when it has one, else 2048; a value above ``max_seq`` is
      lowered to it. A sequence that reaches it ends with ``finish_reason="length"``;
      a prompt that leaves no room is a 400 (``context_length_exceeded``).
    * ``max_tokens``: the largest ``max_tokens`` a request may ask for; a request that
      asks for none generates until a stop, EOS or the context limit.
    * ``prompt_cache_bytes``: byte budget of the shared prefix cache (0 turns it off).
    * ``max_body_bytes``: largest request body accepted (413 beyond).
    * ``shutdown_timeout``: seconds in-flight requests get to finish on shutdown before
      they are cancelled.
    * ``prefill_chunk``: prompt tokens prefilled per step while other sequences are
      decoding. A longer prompt admitted then is prefilled in chunks, one between each
      two decode steps of the running batch, instead of stalling the batch for its whole
      prefill (a chunked prefill gives the same logits, bit for bit). With nothing
      running the prompt is prefilled whole. 0 turns chunking off. Needs a runner with
      sessions (the cached pair); others prefill whole.
    * ``reasoning_format``: ``"auto"`` answers a reasoning model's chain of thought (think
      tags, gpt-oss's analysis channel) as ``reasoning_content`` beside ``content``, as
      llama-server does by default; ``"none"`` leaves it in ``content``. A chat request's
      ``reasoning_format`` overrides it.
    * ``tool_call_format``: how the model's tool calls are read out of its replies to
      requests with ``tools`` (answered as ``message.tool_calls``, ``finish_reason``
      ``"tool_calls"``): ``"auto"`` picks the format from the chat template and vocabulary
      (`rlx_lm.tool_calls.tool_call_format`), a format's name forces it, ``"none"`` leaves
      calls in ``content``.
    * ``api_key``: when set, every route wants it as ``Authorization: Bearer KEY`` (or
      ``X-Api-Key: KEY``) and answers 401 without it, as ``llama-server --api-key`` does;
      ``/health`` and ``/metrics`` stay open.
      Printable ASCII without spaces; left out of the config's ``repr``.
    """

    model_name: str = "rlx-lm"
    max_batch: int = 16
    max_queue: int = 64
    max_context: int | None = None
    max_tokens: int = 4096
    max_n: int = 16
    max_top_logprobs: int = 20
    prompt_cache_bytes: int = 256 * 1024 * 1024
    max_body_bytes: int = 8 * 1024 * 1024
    retry_after: int = 1
    shutdown_timeout: float = 10.0
    prefill_chunk: int = 128
    reasoning_format: str = "auto"
    tool_call_format: str = "auto"
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise InvalidOptionError("model_name: must be a non-empty string")
        for name in ("max_batch", "max_tokens", "max_n", "max_body_bytes"):
            _positive(name, getattr(self, name))
        for name in (
            "max_queue",
            "max_top_logprobs",
            "prompt_cache_bytes",
            "retry_after",
            "prefill_chunk",
        ):
            _positive(name, getattr(self, name), allow_zero=True)
        if self.max_context is not None:
            _positive("max_context", self.max_context)
            if self.max_context < 2:
                raise InvalidOptionError("max_context: must be >= 2 (a prompt and one token)")
        key = self.api_key
        if key is not None and not (
            isinstance(key, str) and key and all("!" <= c <= "~" for c in key)
        ):
            raise InvalidOptionError(
                "api_key: must be a non-empty string of printable ASCII without spaces"
            )
        if self.reasoning_format not in REASONING_FORMATS:
            raise InvalidOptionError(
                f"reasoning_format: must be one of {', '.join(REASONING_FORMATS)}, "
                f"got {self.reasoning_format!r}"
            )
        if self.tool_call_format not in ("auto", "none", *TOOL_CALL_FORMATS):
            raise InvalidOptionError(
                f"tool_call_format: must be auto, none or one of {', '.join(TOOL_CALL_FORMATS)}, "
                f"got {self.tool_call_format!r}"
            )
        if not self.shutdown_timeout >= 0:
            raise InvalidOptionError(
                f"shutdown_timeout: must be >= 0 seconds, got {self.shutdown_timeout}"
            )

    def context_for(self, runner: object) -> int:
        """The context limit that applies to ``runner`` (see the class docstring)."""
        cap = getattr(runner, "max_seq", None)
        cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
        if self.max_context is None:
            return cap if cap is not None else 2048
        return min(self.max_context, cap) if cap is not None else self.max_context
