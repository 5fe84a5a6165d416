"""Tool calls told apart from a reply's text, as it streams.

A chat template that takes ``tools`` tells the model how to call one, and each family writes
its calls its own way. The formats read here, chosen from the model's template and vocabulary
(:func:`tool_call_format`), as llama-server and vLLM read them:

- ``"hermes"`` (Qwen 2.5 and 3, Hermes 2/3, SmolLM3, any template that mentions
  ``<tool_call>``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number,
  with text around them; or Qwen3-Coder's ``<tool_call><function=NAME><parameter=KEY>value
  </parameter></function></tool_call>`` in the same tags.
- ``"mistral"`` (templates with ``[TOOL_CALLS]``): ``[TOOL_CALLS][{"name": ..., "arguments":
  {...}, "id": ...}, ...]`` (Mistral 7B v0.3, Nemo, Small 3) or ``[TOOL_CALLS]name[ARGS]{...}``
  once a call (Mistral's later tokenizers); calls end the reply.
- ``"llama3"`` (templates with Llama 3.1's ``ipython`` role or ``<|python_tag|>``): a reply
  that is nothing but JSON objects ``{"name": ..., "parameters": {...}}`` (``;``-separated).
- ``"harmony"`` (gpt-oss): a message whose header names a recipient, ``<|start|>assistant
  to=functions.get_weather<|channel|>commentary json<|message|>{...}`` (or the recipient after
  the channel). Its body is the arguments. This parser reads the raw reply, before
  `rlx_lm.reasoning.Harmony` splits the channels, and passes every other message on whole.

A parser takes the reply in the pieces it is decoded in and gives back, for each, the text it
completes and the calls it completes; a piece that may be the start of a call is held back
until the next piece (or :meth:`ToolCallParser.finish`) settles it. However the text is cut,
the outputs are the same (tests/test_tool_calls.py), and nothing is lost: a call that does not
parse (bad JSON, no name) is text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rlx_lm.reasoning import _CHANNEL, _MESSAGE, _START, _header_end, _held, _until

__all__ = [
    "TOOL_CALL_FORMATS",
    "HarmonyCalls",
    "Hermes",
    "Llama3Json",
    "MistralCalls",
    "ToolCall",
    "ToolCallFormat",
    "ToolCallParser",
    "split_tool_calls",
    "tool_call_format",
    "tool_call_parser",
]

ToolCallFormat = Literal["hermes", "mistral", "llama3", "harmony"]
TOOL_CALL_FORMATS: tuple[str, ...] = ("hermes", "mistral", "llama3", "harmony")

_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL, _ARGS, _CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's ``name`` and its ``arguments`` as JSON text (OpenAI's shape)."""

    name: str
    arguments: str
    id: str = field(default_factory=_call_id, compare=False)

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` item (with ``index`` in a stream's delta)."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out = {"index": index, **out}
        return out


class ToolCallParser(Protocol):
    """Splits a streamed reply into text and tool calls."""

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """The text and the calls that ``text`` (the reply's next piece) completes."""
        ...

    def finish(self) -> tuple[str, list[ToolCall]]:
        """Whatever was held back, at the end of the reply."""
        ...


def _arguments(value: Any) -> str | None:
    """Arguments as JSON text: an object is dumped, a string kept (models send both)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return None


def _call_of(obj: Any, args_keys: Sequence[str] = ("arguments",)) -> ToolCall | None:
    """A call from a decoded ``{"name": ..., "arguments": ...}``, or None when it is not one."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args: str | None = "{}"
    for key in args_keys:
        if key in obj:
            args = _arguments(obj[key])
            break
    if args is None:
        return None
    given = obj.get("id")
    return ToolCall(name, args, given) if isinstance(given, str) and given else ToolCall(name, args)


def _json_values(text: str) -> list[Any] | None:
    """The JSON values ``text`` is made of (white space or ``;`` between them), or None."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    at = 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return out
        try:
            value, at = dec.raw_decode(text, at)
        except ValueError:
            return None
        out.append(value)


class Hermes:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` among text."""

    def __init__(self) -> None:
        self._buf = ""
        self._inside = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        out: list[str] = []
        calls: list[ToolCall] = []
        while self._buf:
            if not self._inside:
                before, after, opened = _until(self._buf, _CALL_OPEN)
                out.append(before)
                if not opened:
                    self._buf = after
                    break
                self._buf = _CALL_OPEN + after
                self._inside = True
            else:
                at = self._buf.find(_CALL_CLOSE)
                if at < 0:
                    break
                whole = self._buf[: at + len(_CALL_CLOSE)]
                self._buf = self._buf[at + len(_CALL_CLOSE) :]
                self._inside = False
                call = self._parse(whole)
                if call is None:
                    out.append(whole)
                else:
                    calls.append(call)
        return "".join(out), calls

    @staticmethod
    def _parse(whole: str) -> ToolCall | None:
        body = whole[len(_CALL_OPEN) :]
        if body.endswith(_CALL_CLOSE):
            body = body[: -len(_CALL_CLOSE)]
        values = _json_values(body)
        if values is None:
            return _xml_call(body)
        if len(values) != 1:
            return None
        return _call_of(values[0])

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._buf = self._buf, ""
        if self._inside:
            # A call the reply ended in before its closing tag (the end of turn came first).
            self._inside = False
            call = self._parse(rest)
            if call is not None:
                return "", [call]
        return rest, []


_XML_FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*)</function>\s*", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


def _xml_call(body: str) -> ToolCall | None:
    """Qwen3-Coder's calls inside ``<tool_call>``: ``<function=NAME>`` then
    ``<parameter=KEY>value</parameter>`` each (a value that is JSON, such as a number or an
    object, is read as JSON, else as text: vLLM's ``qwen3_coder`` reads them by the tool's
    schema, which a reply parser does not have); anything else between them, not a call."""
    fn = _XML_FUNCTION.fullmatch(body)
    if fn is None:
        return None
    name, inner = fn.group(1), fn.group(2)
    args: dict[str, Any] = {}
    for m in _XML_PARAMETER.finditer(inner):
        value = m.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        try:
            args[m.group(1)] = json.loads(value)
        except ValueError:
            args[m.group(1)] = value
    if _XML_PARAMETER.sub("", inner).strip():
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


class MistralCalls:
    """``[TOOL_CALLS]`` then a JSON list of calls, or ``name[ARGS]{...}`` a call."""

    def __init__(self) -> None:
        self._buf = ""
        self._calls = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        if self._calls:
            return "", []
        at = self._buf.find(_MISTRAL)
        if at >= 0:
            out, self._buf, self._calls = self._buf[:at], self._buf[at:], True
            return out, []
        keep = _held(self._buf, _MISTRAL)
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return out, []

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._buf = self._buf, ""
        if not self._calls:
            return rest, []
        self._calls = False
        calls = self._parse(rest)
        return ("", calls) if calls else (rest, [])

    @staticmethod
    def _parse(rest: str) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for part in rest.split(_MISTRAL)[1:]:
            if _ARGS in part:
                name, _, args = part.partition(_ARGS)
                name = name.split(_CALL_ID, 1)[0].strip()
                values = _json_values(args)
                if not name or values is None or len(values) != 1:
                    return []
                text = _arguments(values[0])
                if text is None:
                    return []
                calls.append(ToolCall(name, text))
                continue
            values = _json_values(part)
            if values is None or len(values) != 1:
                return []
            items = values[0] if isinstance(values[0], list) else [values[0]]
            for item in items:
                call = _call_of(item)
                if call is None:
                    return []
                calls.append(call)
        return calls


class Llama3Json:
    """A reply that is only ``{"name": ..., "parameters": {...}}`` objects (Llama 3.1+)."""

    def __init__(self) -> None:
        self._buf = ""
        self._state = "start"

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._state == "text":
            return text, []
        self._buf += text
        if self._state == "start":
            body = self._buf.lstrip()
            if not body:
                return "", []
            if body.startswith("{"):
                self._state = "json"  # held to the end: a call, or text after all
                return "", []
            self._state = "text"
            out, self._buf = self._buf, ""
            return out, []
        return "", []

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._buf = self._buf, ""
        if self._state != "json":
            return rest, []
        values = _json_values(rest)
        calls = [_call_of(v, ("parameters", "arguments")) for v in values or []]
        if not calls or any(c is None for c in calls):
            return rest, []
        return "", [c for c in calls if c is not None]


class HarmonyCalls:
    """gpt-oss's calls: a message whose header has ``to=functions.NAME``; its body is the
    arguments. The reply's other messages, markup and all, pass through unchanged."""

    def __init__(self) -> None:
        # The reply opens in a header (its prompt ends with ``<|start|>assistant``).
        self._state = "header"
        self._buf = ""
        self._name = ""
        self._opened = False  # whether the header in the buffer followed a <|start|>

    def _opening(self) -> str:
        return _START if self._opened else ""

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buf += text
        out: list[str] = []
        calls: list[ToolCall] = []
        while self._buf:
            if self._state == "header":
                at = _header_end(self._buf)
                if at is None:
                    out.append(self._opening())  # no header after all: pass it on
                    self._state = "body"
                    continue
                if at < 0:
                    break
                end = at + len(_MESSAGE)
                name = _recipient(self._buf[:at])
                if name:
                    self._name, self._state = name, "call"
                else:
                    out.append(self._opening() + self._buf[:end])
                    self._state = "body"
                self._buf = self._buf[end:]
            elif self._state == "call":
                at = self._buf.find(_START)
                if at < 0:
                    break  # the arguments end at the next message or the turn's end
                calls.append(ToolCall(self._name, self._buf[:at].strip()))
                self._buf = self._buf[at + len(_START) :]
                self._state, self._opened = "header", True
            else:
                before, self._buf, ended = _until(self._buf, _START)
                out.append(before)
                if not ended:
                    break
                self._state, self._opened = "header", True
        return "".join(out), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._buf = self._buf, ""
        state, self._state = self._state, "header"
        if state == "call":
            return "", [ToolCall(self._name, rest.strip())]
        if state == "header":
            return self._opening() + rest, []
        return rest, []


def _recipient(header: str) -> str:
    """The function a harmony header sends its message to (``... to=functions.f ...`` -> f)."""
    for word in header.replace(_CHANNEL, " ").replace("<|", " <|").split():
        if word.startswith("to=functions."):
            return word[len("to=functions.") :]
    return ""


def tool_call_format(
    template: str | None, vocabulary: Sequence[str] | frozenset[str] = ()
) -> ToolCallFormat | None:
    """The format a model writes its calls in, from its chat template's source and its added
    tokens (harmony's are enough); None when neither says (its calls stay text)."""
    words = set(vocabulary)
    if {_CHANNEL, _MESSAGE, "<|call|>"} <= words:
        return "harmony"
    src = template or ""
    if "to=functions." in src or ("<|call|>" in src and _CHANNEL in src):
        return "harmony"
    if _CALL_OPEN in src:
        return "hermes"
    if _MISTRAL in src:
        return "mistral"
    if "<|python_tag|>" in src or "ipython" in src:
        return "llama3"
    return None


def tool_call_parser(fmt: str) -> ToolCallParser:
    """A fresh parser for the format ``fmt`` (one of :data:`TOOL_CALL_FORMATS`)."""
    parsers: dict[str, type[ToolCallParser]] = {
        "hermes": Hermes,
        "mistral": MistralCalls,
        "llama3": Llama3Json,
        "harmony": HarmonyCalls,
    }
    if fmt not in parsers:
        raise ValueError(f"tool call format must be one of {TOOL_CALL_FORMATS}, got {fmt!r}")
    return parsers[fmt]()


def split_tool_calls(parser: ToolCallParser | None, text: str) -> tuple[str, list[ToolCall]]:
    """A whole reply's (text, calls); without a parser, ``(text, [])``."""
    if parser is None:
        return text, []
    t1, c1 = parser.feed(text)
    t2, c2 = parser.finish()
    return t1 + t2, c1 + c2
