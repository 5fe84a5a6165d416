"""The OpenAI wire format: request bodies in, `GenerationRequest` out, and response shapes.

A body is checked field by field; the first bad one raises `ProtocolError` naming it
(``param``), which the app returns as OpenAI's error JSON with status 400. A field this
server does not know is an error too: nothing is silently ignored, except the fields
listed in `IGNORED_FIELDS`, which OpenAI defines for its own bookkeeping and which change
nothing about the text.

Sampling knobs, by the names OpenAI, llama-server and vLLM accept (body name ->
`SampleOpts` field). Each knob's names come from the core's table (``server_fields`` in
``rlx_lm._core.SAMPLER_KNOBS``, `KNOB_FIELDS` here) and its value is parsed by its kind
there, so a new knob is accepted without an edit to this module; the core checks ranges.
llama-server's own conventions, kept here:

==============================================  =========================================
``temperature`` (default 1.0, as OpenAI)        ``temperature``, in [0, 2] as OpenAI
``frequency_penalty``, ``presence_penalty``     the same, in [-2, 2] as OpenAI
``top_k`` (0 or -1: off)                        ``top_k``
``repeat_penalty`` / ``repetition_penalty``     ``repetition_penalty``
``repeat_last_n`` (-1: whole history)           ``repetition_window``
``logit_bias`` ({"id": bias} or [[id, bias]])   ``logit_bias``; bias in [-100, 100] or
                                                ``false`` (ban, as llama-server)
``dry_sequence_breakers`` (default, when DRY    token ids or strings (every token whose
is on: llama-server's ``"\\n" ":" "\\"" "*"``)  text holds the string); ``[]`` for none
``xtc_probability``                             ``xtc_prob``
``dynatemp_range``, ``dynatemp_exponent``       ``dynamic_temp`` = temperature +- range,
                                                ``dynamic_temp_exponent``
``seed`` (-1: random, as llama-server)          ``seed``
``samplers`` (stage names, llama.cpp's names    the chain's custom order; logit_bias runs
or llama-server's letters ``"edkypmxts"``)      first unless listed
==============================================  =========================================

Every other knob goes by its `SampleOpts` name: ``top_p``, ``min_p``, ``typical_p``,
``top_n_sigma``, ``xtc_threshold``, ``dry_multiplier``, ``dry_base``,
``dry_allowed_length``, ``dry_max_ngram``, ``mirostat`` (0, 1, 2), ``mirostat_tau``,
``mirostat_eta``, ``mirostat_m``, ``min_keep``. The ``samplers`` names and letters come
from the stage table (``llama_cpp_names``, ``llama_cpp_letter`` in
``rlx_lm._core.SAMPLER_STAGES``).

Generation: ``max_tokens`` / ``max_completion_tokens`` / ``n_predict``, ``n``, ``stop``
(a string or up to 16), ``stop_token_ids``, ``ignore_eos``, ``logprobs`` and
``top_logprobs``, ``stream`` and ``stream_options.include_usage``, ``cache_prompt``
(false skips the prefix-cache lookup). Chat also takes ``messages``, ``tools`` (handed
to the chat template; the model's calls come back as ``tool_calls``: rlx_lm.tool_calls),
``tool_choice``
(``"none"``/``"auto"``), ``response_format`` (``{"type": "text"}`` only),
``chat_template_kwargs``, ``add_generation_prompt``, ``reasoning_effort`` (OpenAI's values,
handed to the chat template: gpt-oss's reads it) and ``reasoning_format`` (``"auto"``,
``"deepseek"`` or ``"none"``: whether a reasoning model's chain of thought comes back as
``reasoning_content``). Completions takes ``prompt`` (a
string, a token list, or a list of either), ``echo`` (false only), ``suffix`` (null
only) and ``best_of`` (equal to ``n`` only).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx_lm import _core
from rlx_lm.errors import InvalidOptionError
from rlx_lm.generation import TokenLogprob
from rlx_lm.reasoning import REASONING_FORMATS
from rlx_lm.sample_opts import DRY_DEFAULT_BREAKERS, SampleOpts
from rlx_lm.server.scheduler import GenerationRequest
from rlx_lm.tokenizer import Tokenizer

__all__ = [
    "IGNORED_FIELDS",
    "KNOB_FIELDS",
    "SAMPLER_LETTERS",
    "SAMPLER_NAMES",
    "ParsedRequest",
    "ProtocolError",
    "detokenize",
    "error_body",
    "parse_chat",
    "parse_completion",
    "tokenize",
]

IGNORED_FIELDS = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls"})
"""OpenAI fields accepted and ignored: they label or route a request and change no token."""

_MAX_STOPS = 16

# What OpenAI bounds more tightly than the core (body name -> check).
_Check = Callable[[float], str | None]


def _between(lo: float, hi: float) -> _Check:
    return lambda v: None if lo <= v <= hi else f"must be in [{lo}, {hi}], got {v}"


_OPENAI_RANGES: dict[str, _Check] = {
    "temperature": _between(0, 2),
    "frequency_penalty": _between(-2, 2),
    "presence_penalty": _between(-2, 2),
}

KNOB_FIELDS: dict[str, str] = {
    field: k["name"] for k in _core.SAMPLER_KNOBS for field in k["server_fields"]
}
"""Body name -> `SampleOpts` field, for every knob: its ``server_fields`` in the core's
table (``KnobSpec::server_fields``, rust/sampling/knobs.rs), so a new knob is a field here
without an edit to this module."""

_KINDS: dict[str, str] = {k["name"]: k["kind"] for k in _core.SAMPLER_KNOBS}

SAMPLER_NAMES: dict[str, str] = {
    alias: s["name"] for s in _core.SAMPLER_STAGES for alias in (s["name"], *s["llama_cpp_names"])
}
"""``samplers`` names -> the chain's stage names: each stage's own name and its names in
llama.cpp's lists (``StageSpec::llama_cpp_names``)."""

SAMPLER_LETTERS: dict[str, str] = {
    s["llama_cpp_letter"]: s["name"] for s in _core.SAMPLER_STAGES if s["llama_cpp_letter"]
}
"""llama-server's ``samplers`` letters -> stage names (``StageSpec::llama_cpp_letter``)."""

_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "n_predict",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "cache_prompt",
        "samplers",
        *KNOB_FIELDS,
        *IGNORED_FIELDS,
    }
)
CHAT_FIELDS = _COMMON | {
    "messages",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "response_format",
    "chat_template_kwargs",
    "add_generation_prompt",
    "reasoning_format",
    "reasoning_effort",
}
# OpenAI's reasoning_effort values; the chat template gets it as `reasoning_effort` (gpt-oss's
# takes low, medium, high), as vLLM and llama-server pass it.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of"}


class ProtocolError(Exception):
    """A request the server refuses: HTTP ``status``, OpenAI ``type``, ``param`` and ``code``."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        *,
        status: int = 400,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type_
        self.code = code


def error_body(
    message: str, param: str | None = None, type_: str = "invalid_request_error", code: Any = None
) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass
class ParsedRequest:
    """A checked request: one `GenerationRequest` per prompt and how to answer."""

    requests: list[GenerationRequest]
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    model: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ fields


def _present(body: Mapping[str, Any], name: str) -> bool:
    return body.get(name) is not None


def _one_of(body: Mapping[str, Any], name: str, values: Sequence[str]) -> str | None:
    """``body[name]`` when it is one of ``values``, None when absent; else a 400 naming it."""
    v = body.get(name)
    if v is not None and v not in values:
        raise ProtocolError(f"{name}: must be one of {', '.join(values)}, got {v!r}", name)
    return None if v is None else str(v)


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ProtocolError(f"{name}: must be a boolean, got {type(v).__name__}", name)
    return v


def _int(
    body: Mapping[str, Any], name: str, default: int | None, lo: int | None = None
) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError(f"{name}: must be an integer, got {type(v).__name__}", name)
    if lo is not None and v < lo:
        raise ProtocolError(f"{name}: must be >= {lo}, got {v}", name)
    return v


def _float(body: Mapping[str, Any], name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProtocolError(f"{name}: must be a number, got {type(v).__name__}", name)
    f = float(v)
    if not math.isfinite(f):
        raise ProtocolError(f"{name}: must be a finite number, got {v}", name)
    return f


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str], route: str) -> None:
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise ProtocolError(
            f"{unknown[0]}: unknown or unsupported field for {route}"
            + (f" (also: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""),
            unknown[0],
        )


def _token_list(value: Any, name: str, vocab: int) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise ProtocolError(f"{name}: must be a list of token ids", name)
    bad = next((t for t in value if not 0 <= t < vocab), None)
    if bad is not None:
        raise ProtocolError(f"{name}: token {bad} is outside the vocabulary 0..{vocab - 1}", name)
    return list(value)


# ------------------------------------------------------------------ sampling


def _knob_value(
    knob: str, name: str, value: Any, kw: Mapping[str, Any], tokenizer: Tokenizer, vocab: int
) -> Any:
    """The `SampleOpts` value of body field ``name`` for ``knob``: llama-server's own
    spellings first, then by the knob's kind in the core's table (the core checks the
    range)."""
    body = {name: value}
    kind = _KINDS[knob]
    if knob == "top_k":  # llama-server: 0 or -1 is off
        top_k = _int(body, name, None)
        assert top_k is not None
        if top_k < -1:
            raise ProtocolError(f"{name}: must be >= -1 (0 or -1: off), got {top_k}", name)
        return None if top_k <= 0 else top_k
    if knob == "repetition_window":  # llama-server: -1 is the whole history
        window = _int(body, name, None)
        if window == 0:
            raise ProtocolError(
                f"{name}: must be >= 1, or -1 for the whole history, got {window}", name
            )
        return window
    if knob == "dynamic_temp":  # llama-server: a range around temperature
        dyn = _float(body, name)
        assert dyn is not None
        if dyn < 0:
            raise ProtocolError(f"{name}: must be >= 0, got {dyn}", name)
        t = float(kw["temperature"])
        return None if dyn == 0 else (max(0.0, t - dyn), t + dyn)
    if kind == "float":
        f = _float(body, name)
        check = _OPENAI_RANGES.get(name)
        if f is not None and check is not None and (why := check(f)) is not None:
            raise ProtocolError(f"{name}: {why}", name)
        return f
    if kind in ("int", "int | None", "mode"):
        return _int(body, name, None)
    if kind == "seed":  # llama-server: -1 is a random seed
        seed = _int(body, name, None)
        if seed == -1:
            return None
        if seed is not None and not 0 <= seed < 2**64:
            raise ProtocolError(f"{name}: must be in 0..2**64 (or -1: random), got {seed}", name)
        return seed
    if kind == "pair | None":
        if not (isinstance(value, list) and len(value) == 2):
            raise ProtocolError(f"{name}: must be a [min, max] pair of numbers", name)
        lo, hi = (_float({name: v}, name) for v in value)
        return (lo, hi)
    if kind == "tokens":
        return _tokens(value, name, tokenizer, vocab)
    if kind == "bias":
        return _logit_bias(value, name, vocab)
    raise AssertionError(f"{knob}: the server has no parser for knobs of kind {kind!r}")


def sample_opts(body: Mapping[str, Any], tokenizer: Tokenizer, vocab: int) -> SampleOpts:
    """The `SampleOpts` a body asks for (see the module docstring for the names).

    Every knob is read under its ``server_fields`` names in the core's table, in the
    table's order (temperature before ``dynatemp_range``, which is a range around it).
    """
    kw: dict[str, Any] = {"temperature": 1.0}  # OpenAI's default
    source: dict[str, str] = {}  # SampleOpts field -> body name
    for name, knob in KNOB_FIELDS.items():
        if not _present(body, name):
            continue
        v = _knob_value(knob, name, body[name], kw, tokenizer, vocab)
        if knob in source and kw[knob] != v:
            raise ProtocolError(
                f"{name}: conflicts with {source[knob]} (both set {knob}, differently)", name
            )
        kw[knob], source[knob] = v, name
        if knob == "dynamic_temp" and v is not None:
            kw["temperature"] = 0.0  # dynamic temperature replaces it
    on = kw.get("dry_multiplier", 0.0)
    if on and "dry_sequence_breakers" not in kw and tokenizer is not None:
        # llama-server's default breakers, as its DRY has them unless the body says otherwise
        kw["dry_sequence_breakers"] = tokenizer.ids_containing(DRY_DEFAULT_BREAKERS)
    try:
        return SampleOpts(**kw)
    except InvalidOptionError as exc:
        target = str(exc).split(":", 1)[0]
        name = source.get(target, target)
        raise ProtocolError(f"{name}: {str(exc).split(':', 1)[-1].strip()}", name) from None


def _logit_bias(value: Any, name: str, vocab: int) -> dict[int, float]:
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        items = [(p[0], p[1]) for p in value]
    else:
        raise ProtocolError(f"{name}: must map token ids to biases", name)
    out: dict[int, float] = {}
    for key, bias in items:
        try:
            tok = int(key) if not isinstance(key, bool) else None
        except (TypeError, ValueError):
            tok = None
        if tok is None or isinstance(key, float) or not 0 <= tok < vocab:
            raise ProtocolError(f"{name}: {key!r} is not a token id in 0..{vocab - 1}", name)
        if bias is False:
            out[tok] = -math.inf
            continue
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ProtocolError(f"{name}: the bias of token {tok} must be a number", name)
        if not -100 <= bias <= 100:
            raise ProtocolError(
                f"{name}: the bias of token {tok} must be in [-100, 100], got {bias}", name
            )
        out[tok] = float(bias)
    return out


def _tokens(value: Any, name: str, tokenizer: Tokenizer, vocab: int) -> tuple[int, ...]:
    """Token ids, or strings standing for every token whose text holds them, as llama.cpp
    reads DRY's breaker strings (`Tokenizer.ids_containing`)."""
    if not isinstance(value, list):
        raise ProtocolError(f"{name}: must be a list of strings or token ids", name)
    out: list[int] = []
    texts: list[str] = []
    for item in value:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < vocab:
            out.append(item)
        else:
            raise ProtocolError(f"{name}: {item!r} is neither a string nor a token id", name)
    if texts:
        out += tokenizer.ids_containing(texts)
    return tuple(dict.fromkeys(out))


def _samplers(value: Any, opts: SampleOpts) -> tuple[str, ...] | None:
    name = "samplers"
    if value is None:
        return None
    if isinstance(value, str):
        stages = []
        for ch in value:
            if ch not in SAMPLER_LETTERS:
                raise ProtocolError(
                    f"{name}: unknown sampler letter {ch!r} (letters: {''.join(SAMPLER_LETTERS)})",
                    name,
                )
            stages.append(SAMPLER_LETTERS[ch])
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        stages = []
        for v in value:
            if v not in SAMPLER_NAMES:
                raise ProtocolError(
                    f"{name}: unknown sampler {v!r} (known: {', '.join(SAMPLER_NAMES)})", name
                )
            stages.append(SAMPLER_NAMES[v])
    else:
        raise ProtocolError(f"{name}: must be a list of sampler names or a string of letters", name)
    if len(set(stages)) != len(stages):
        raise ProtocolError(f"{name}: a sampler is listed twice", name)
    if "logit_bias" not in stages:
        stages.insert(0, "logit_bias")
    order = tuple(stages)
    try:
        opts.into_chain(list(order))
    except InvalidOptionError as exc:
        raise ProtocolError(f"{name}: {str(exc).split(':', 1)[-1].strip()}", name) from None
    return order


# ------------------------------------------------------------------ common


def _stops(body: Mapping[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ProtocolError("stop: must be a string or a list of strings", "stop")
    if len(v) > _MAX_STOPS:
        raise ProtocolError(f"stop: at most {_MAX_STOPS} stop strings, got {len(v)}", "stop")
    return tuple(s for s in v if s)


def _max_tokens(body: Mapping[str, Any], names: Sequence[str], cap: int) -> int | None:
    chosen: tuple[str, int] | None = None
    for name in names:
        v = _int(body, name, None)
        if v is None:
            continue
        if name == "n_predict" and v == -1:
            continue  # llama-server: -1 = until a stop
        if v < 0 or (v == 0 and name != "n_predict"):
            raise ProtocolError(f"{name}: must be >= 1, got {v}", name)
        if v > cap:
            raise ProtocolError(f"{name}: must be <= {cap} on this server, got {v}", name)
        if chosen is not None and chosen[1] != v:
            raise ProtocolError(f"{name}: conflicts with {chosen[0]}", name)
        chosen = (name, v)
    return None if chosen is None else chosen[1]


def _model(body: Mapping[str, Any], served: str, aliases: frozenset[str]) -> str:
    model = body.get("model")
    if model is None:
        return served
    if not isinstance(model, str):
        raise ProtocolError("model: must be a string", "model")
    if model != served and model not in aliases:
        raise ProtocolError(
            f"The model `{model}` does not exist (this server serves `{served}`)",
            "model",
            status=404,
            code="model_not_found",
        )
    return served


@dataclass(frozen=True)
class Limits:
    """What the protocol layer needs to know of the server."""

    model_name: str
    vocab_size: int
    max_tokens: int
    max_n: int
    max_top_logprobs: int
    aliases: frozenset[str] = frozenset()


def _common(
    body: Mapping[str, Any], tokenizer: Tokenizer, limits: Limits, max_names: Sequence[str]
) -> tuple[dict[str, Any], ParsedRequest]:
    model = _model(body, limits.model_name, limits.aliases)
    stream = _bool(body, "stream", False)
    include_usage = False
    so = body.get("stream_options")
    if so is not None:
        if not stream:
            raise ProtocolError("stream_options: only allowed with stream=true", "stream_options")
        if not isinstance(so, Mapping) or set(so) - {"include_usage"}:
            raise ProtocolError(
                "stream_options: must be an object with include_usage only", "stream_options"
            )
        include_usage = _bool(so, "include_usage", False)
    n = _int(body, "n", 1, lo=1)
    assert n is not None
    if n > limits.max_n:
        raise ProtocolError(f"n: must be <= {limits.max_n} on this server, got {n}", "n")
    opts = sample_opts(body, tokenizer, limits.vocab_size)
    order = _samplers(body.get("samplers"), opts)
    stop_ids = (
        frozenset(_token_list(body["stop_token_ids"], "stop_token_ids", limits.vocab_size))
        if _present(body, "stop_token_ids")
        else frozenset()
    )
    kw: dict[str, Any] = {
        "opts": opts,
        "max_tokens": _max_tokens(body, max_names, limits.max_tokens),
        "n": n,
        "stop": _stops(body),
        "stop_token_ids": stop_ids,
        "ignore_eos": _bool(body, "ignore_eos", False),
        "order": order,
        "use_cache": _bool(body, "cache_prompt", True),
    }
    return kw, ParsedRequest([], stream=stream, include_usage=include_usage, model=model)


# ------------------------------------------------------------------ chat


def _messages(value: Any) -> list[dict[str, Any]]:
    name = "messages"
    if not isinstance(value, list) or not value:
        raise ProtocolError(f"{name}: must be a non-empty list of messages", name)
    out = []
    for i, m in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(m, Mapping):
            raise ProtocolError(f"{where}: must be an object", where)
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ProtocolError(
                f"{where}.role: must be system, developer, user, assistant or tool, got {role!r}",
                f"{where}.role",
            )
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text":
                    raise ProtocolError(
                        f"{where}.content[{j}]: only text parts are supported",
                        f"{where}.content[{j}]",
                    )
                text = part.get("text")
                if not isinstance(text, str):
                    raise ProtocolError(
                        f"{where}.content[{j}].text: must be a string", f"{where}.content[{j}]"
                    )
                parts.append(text)
            content = "".join(parts)
        elif content is None:
            if role != "assistant" or not m.get("tool_calls"):
                raise ProtocolError(f"{where}.content: is required", f"{where}.content")
        elif not isinstance(content, str):
            raise ProtocolError(
                f"{where}.content: must be a string or a list of text parts", f"{where}.content"
            )
        msg = {k: v for k, v in m.items() if k not in ("role", "content")}
        allowed = {"name", "tool_calls", "tool_call_id"}
        extra = sorted(set(msg) - allowed)
        if extra:
            raise ProtocolError(f"{where}.{extra[0]}: unknown message field", f"{where}.{extra[0]}")
        msg["role"] = "system" if role == "developer" else role
        msg["content"] = content
        if "tool_calls" in msg:
            msg["tool_calls"] = _tool_calls(msg["tool_calls"], f"{where}.tool_calls")
        out.append(msg)
    return out


def _tool_calls(value: Any, where: str) -> list[Any]:
    """An assistant message's ``tool_calls`` for the template: OpenAI sends each call's
    ``arguments`` as JSON text, templates read them as an object (Qwen's, gpt-oss's
    ``arguments | tojson``), so text that is a JSON object is decoded, as vLLM does."""
    if not isinstance(value, list):
        raise ProtocolError(f"{where}: must be a list", where)
    out: list[Any] = []
    for j, call in enumerate(value):
        if not isinstance(call, Mapping):
            raise ProtocolError(f"{where}[{j}]: must be an object", f"{where}[{j}]")
        call = dict(call)
        fn = call.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
            try:
                args = json.loads(fn["arguments"])
            except ValueError:
                args = None
            if isinstance(args, dict):
                call["function"] = {**fn, "arguments": args}
        out.append(call)
    return out


def render_chat(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    *,
    tools: list[Any] | None = None,
    add_generation_prompt: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The prompt tokens of a chat: the model's chat template when it has one.

    A tokenizer without a template gets a plain transcript, one ``Role: content`` line
    per message and a final ``Assistant:`` (the bundled model has no template).
    """
    apply = getattr(tokenizer, "apply_chat_template", None)
    has_template = callable(apply) and getattr(tokenizer, "chat_template", True) is not None
    if has_template:
        assert callable(apply)
        kw: dict[str, Any] = dict(template_kwargs or {})
        if tools:
            kw["tools"] = tools
        try:
            out = apply(messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kw)
        except LookupError:
            out = None  # no template after all: fall through to the transcript
        except Exception as exc:
            raise ProtocolError(f"messages: the chat template failed: {exc}", "messages") from None
        if out is not None:
            if isinstance(out, str):
                return tokenizer.encode(out, add_special_tokens=False)
            return [int(t) for t in out]
    if tools:
        raise ProtocolError("tools: this model has no chat template to render tools", "tools")
    lines = [f"{m['role'].capitalize()}: {m['content'] or ''}" for m in messages]
    if add_generation_prompt:
        lines.append("Assistant:")
    return tokenizer.encode("\n".join(lines))


def parse_chat(body: Any, tokenizer: Tokenizer, limits: Limits) -> ParsedRequest:
    """Check a ``/v1/chat/completions`` body."""
    if not isinstance(body, Mapping):
        raise ProtocolError("the request body must be a JSON object")
    _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    messages = _messages(body.get("messages"))
    kw, parsed = _common(
        body, tokenizer, limits, ("max_tokens", "max_completion_tokens", "n_predict")
    )
    logprobs = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, lo=0)
    if top is not None:
        if not logprobs:
            raise ProtocolError("top_logprobs: needs logprobs=true", "top_logprobs")
        if top > limits.max_top_logprobs:
            raise ProtocolError(
                f"top_logprobs: must be <= {limits.max_top_logprobs}, got {top}", "top_logprobs"
            )
    kw["logprobs"] = (top or 0) if logprobs else None
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ProtocolError("tools: must be a list", "tools")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto"):
        raise ProtocolError(
            "tool_choice: only 'none' and 'auto' are supported (a call cannot be forced: "
            "there is no constrained decoding)",
            "tool_choice",
        )
    if choice == "none":
        tools = None
    rf = body.get("response_format")
    if rf is not None and (not isinstance(rf, Mapping) or dict(rf) != {"type": "text"}):
        raise ProtocolError(
            "response_format: only {'type': 'text'} is supported", "response_format"
        )
    tk = body.get("chat_template_kwargs")
    if tk is not None and not isinstance(tk, Mapping):
        raise ProtocolError("chat_template_kwargs: must be an object", "chat_template_kwargs")
    effort = _one_of(body, "reasoning_effort", REASONING_EFFORTS)
    if effort is not None:
        tk = {"reasoning_effort": effort, **(tk or {})}
    prompt = render_chat(
        tokenizer,
        messages,
        tools=tools,
        add_generation_prompt=_bool(body, "add_generation_prompt", True),
        template_kwargs=tk,
    )
    fmt = _one_of(body, "reasoning_format", REASONING_FORMATS)
    if fmt is not None:
        parsed.extra["reasoning_format"] = fmt
    if tools:
        parsed.extra["tools"] = True
    parsed.requests = [GenerationRequest(prompt=tuple(prompt), **kw)]
    parsed.logprobs = logprobs
    return parsed


# ------------------------------------------------------------------ completions


def _prompts(value: Any, tokenizer: Tokenizer, vocab: int) -> list[list[int]]:
    name = "prompt"
    if isinstance(value, str):
        return [tokenizer.encode(value)]
    if isinstance(value, list) and value:
        if all(isinstance(p, str) for p in value):
            return [tokenizer.encode(p) for p in value]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return [_token_list(value, name, vocab)]
        if all(isinstance(p, list) for p in value):
            return [_token_list(p, name, vocab) for p in value]
    raise ProtocolError(
        f"{name}: must be a string, a list of strings, a token list or a list of token lists",
        name,
    )


def parse_completion(body: Any, tokenizer: Tokenizer, limits: Limits) -> ParsedRequest:
    """Check a ``/v1/completions`` body."""
    if not isinstance(body, Mapping):
        raise ProtocolError("the request body must be a JSON object")
    _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    if "prompt" not in body:
        raise ProtocolError("prompt: is required", "prompt")
    prompts = _prompts(body["prompt"], tokenizer, limits.vocab_size)
    for p in prompts:
        if not p:
            raise ProtocolError("prompt: encodes to no tokens", "prompt")
    kw, parsed = _common(body, tokenizer, limits, ("max_tokens", "n_predict"))
    if "max_tokens" not in body and "n_predict" not in body:
        kw["max_tokens"] = min(16, limits.max_tokens)  # OpenAI's default for completions
    lp = _int(body, "logprobs", None, lo=0)
    if lp is not None and lp > limits.max_top_logprobs:
        raise ProtocolError(f"logprobs: must be <= {limits.max_top_logprobs}, got {lp}", "logprobs")
    kw["logprobs"] = lp
    if _bool(body, "echo", False):
        raise ProtocolError("echo: echoing the prompt is not supported", "echo")
    if body.get("suffix") is not None:
        raise ProtocolError("suffix: insertion is not supported", "suffix")
    best_of = _int(body, "best_of", None, lo=1)
    if best_of is not None and best_of != kw["n"]:
        raise ProtocolError("best_of: only best_of equal to n is supported", "best_of")
    parsed.requests = [GenerationRequest(prompt=tuple(p), **kw) for p in prompts]
    parsed.logprobs = lp is not None
    return parsed


# ------------------------------------------------------------------ responses


def new_id(prefix: str) -> str:
    """An id like OpenAI's: ``chatcmpl-...`` or ``cmpl-...``."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    """Seconds since the epoch, for ``created``."""
    return int(time.time())


def token_text(tokenizer: Tokenizer, token: int) -> str:
    """One token's text, special tokens included."""
    return tokenizer.decode([token], skip_special_tokens=False)


def chat_logprobs(tokenizer: Tokenizer, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """``choice.logprobs.content`` entries for the chat API."""

    def entry(tok: int, lp: float) -> dict[str, Any]:
        text = token_text(tokenizer, tok)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return [
        {**entry(x.token, x.logprob), "top_logprobs": [entry(t, p) for t, p in x.top]} for x in lps
    ]


def completion_logprobs(
    tokenizer: Tokenizer, lps: Sequence[TokenLogprob], offset: int
) -> dict[str, Any]:
    """The legacy ``choice.logprobs`` object of the completions API."""
    tokens, offsets = [], []
    pos = offset
    for x in lps:
        t = token_text(tokenizer, x.token)
        tokens.append(t)
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [x.logprob for x in lps],
        "top_logprobs": [{token_text(tokenizer, t): p for t, p in x.top} for x in lps],
        "text_offset": offsets,
    }


def finish_reason(reason: str) -> str | None:
    """The OpenAI ``finish_reason``: the context limit reports ``length``, as vLLM does."""
    return {"stop": "stop", "length": "length", "context": "length"}.get(reason)


# ------------------------------------------------------------ tokenize / detokenize

TOKENIZE_FIELDS = frozenset(
    {
        "content",  # llama-server
        "add_special",
        "with_pieces",
        "prompt",  # vLLM
        "messages",
        "add_special_tokens",
        "add_generation_prompt",
        "return_token_strs",
        "tools",
        "chat_template_kwargs",
        "model",
    }
)
DETOKENIZE_FIELDS = frozenset({"tokens", "model"})


def tokenize(body: Any, tokenizer: Tokenizer, limits: Limits) -> dict[str, Any]:
    """A ``POST /tokenize`` answer, for llama-server's and vLLM's request shapes alike.

    The text is ``content`` (llama-server: special tokens such as BOS added only with
    ``add_special``), ``prompt`` (vLLM: added unless ``add_special_tokens`` is false) or
    ``messages`` (vLLM: rendered with the chat template, ``add_generation_prompt`` true by
    default, as ``/v1/chat/completions`` renders them). The answer has ``tokens`` (each
    ``{"id", "piece"}`` with llama-server's ``with_pieces``), ``count`` and, with vLLM's
    ``return_token_strs``, ``token_strs``.
    """
    if not isinstance(body, Mapping):
        raise ProtocolError("the request body must be a JSON object")
    _check_fields(body, TOKENIZE_FIELDS, "/tokenize")
    _model(body, limits.model_name, limits.aliases)
    given = [k for k in ("content", "prompt", "messages") if body.get(k) is not None]
    if len(given) != 1:
        raise ProtocolError("give the text once: content, prompt or messages", "content")
    (field,) = given
    if field == "messages":
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ProtocolError("tools: must be a list", "tools")
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ProtocolError("chat_template_kwargs: must be an object", "chat_template_kwargs")
        ids = render_chat(
            tokenizer,
            _messages(body["messages"]),
            tools=tools,
            add_generation_prompt=_bool(body, "add_generation_prompt", True),
            template_kwargs=kwargs,
        )
    else:
        text = body[field]
        if not isinstance(text, str):
            raise ProtocolError(f"{field}: must be a string", field)
        special = (
            _bool(body, "add_special", False)
            if field == "content"
            else _bool(body, "add_special_tokens", True)
        )
        ids = tokenizer.encode(text, add_special_tokens=special)
    out: dict[str, Any] = {"tokens": ids, "count": len(ids)}
    strs = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    if _bool(body, "with_pieces", False):
        out["tokens"] = [{"id": t, "piece": s} for t, s in zip(ids, strs, strict=True)]
    if _bool(body, "return_token_strs", False):
        out["token_strs"] = strs
    return out


def detokenize(body: Any, tokenizer: Tokenizer, limits: Limits) -> dict[str, Any]:
    """A ``POST /detokenize`` answer: the text of ``tokens``, special tokens written out,
    as ``content`` (llama-server's name) and ``prompt`` (vLLM's)."""
    if not isinstance(body, Mapping):
        raise ProtocolError("the request body must be a JSON object")
    _check_fields(body, DETOKENIZE_FIELDS, "/detokenize")
    _model(body, limits.model_name, limits.aliases)
    if body.get("tokens") is None:
        raise ProtocolError("tokens: required", "tokens")
    ids = _token_list(body["tokens"], "tokens", limits.vocab_size)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return {"content": text, "prompt": text}
