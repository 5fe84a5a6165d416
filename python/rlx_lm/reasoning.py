"""A reply's reasoning told apart from its answer, as it streams.

Reasoning models write their chain of thought before the answer, in one of two shapes:

- **think tags** (Qwen3, DeepSeek-R1 and its distills, SmolLM3, ...): ``<think>reasoning
  </think>answer``. When the chat template ends the prompt with ``<think>`` already (DeepSeek-R1's
  does), the reply starts inside the reasoning.
- **harmony** (OpenAI's gpt-oss): messages on channels, ``<|channel|>analysis<|message|>
  reasoning`` then ``<|start|>assistant<|channel|>final<|message|>answer``; the tokens that close
  a message (``<|end|>``) are left out of the text, the markup that opens one is kept
  (rlx_lm.tokenizer renders it, as llama.cpp does). The ``analysis`` channel is reasoning; every
  other channel's message is answer.

A parser takes the reply's text in the pieces it is decoded in and gives back, for each piece,
the reasoning and the answer text it completes; markup is dropped, and a piece that may be the
start of a tag is held back until the next piece (or :meth:`ReasoningParser.finish`) settles it.
However the text is cut, the concatenated outputs are the same (tests/test_reasoning.py), and
no text is lost: what cannot be parsed is answer. This is llama-server's ``reasoning_content``
(its ``--reasoning-format auto``) and vLLM's reasoning parsers' split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

__all__ = [
    "REASONING_FORMATS",
    "Harmony",
    "ReasoningFormat",
    "ReasoningParser",
    "ThinkTags",
    "parser_for",
    "reasoning_parser",
    "split_reasoning",
]

#: ``"auto"``: split the reasoning out when the model's vocabulary has a known shape
#: (``"deepseek"``, llama-server's name for it, is the same); ``"none"``: leave the reply whole.
ReasoningFormat = Literal["auto", "deepseek", "none"]
REASONING_FORMATS: tuple[str, ...] = ("auto", "deepseek", "none")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_START, _CHANNEL, _MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
# The longest harmony header waited for (``<|channel|>commentary to=functions.name
# <|constrain|>json`` is well within it); text that long with no ``<|message|>`` is answer.
_HEADER_LIMIT = 256


class ReasoningParser(Protocol):
    """Splits a streamed reply into (reasoning, answer) pieces."""

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the answer that ``text`` (the reply's next piece) completes."""
        ...

    def finish(self) -> tuple[str, str]:
        """Whatever was held back, at the end of the reply."""
        ...


def _held(text: str, tag: str) -> int:
    """The length of the longest tail of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _until(buf: str, tag: str) -> tuple[str, str, bool]:
    """``buf`` cut at the first ``tag``: (what comes before, what comes after, True); with no
    ``tag``, (what can go on now, the tail that may start one, False)."""
    at = buf.find(tag)
    if at >= 0:
        return buf[:at], buf[at + len(tag) :], True
    keep = _held(buf, tag)
    return buf[: len(buf) - keep], buf[len(buf) - keep :], False


def _header_end(buf: str) -> int | None:
    """Where the harmony header ``buf`` opens with ends (its ``<|message|>``'s index); -1 while
    one may still come; None when none will (none within the limit, so the outcome does not
    depend on how the text was cut)."""
    at = buf.find(_MESSAGE, 0, _HEADER_LIMIT + len(_MESSAGE))
    if at < 0 and len(buf) >= _HEADER_LIMIT + len(_MESSAGE):
        return None
    return at


class ThinkTags:
    """``<think>reasoning</think>answer``; ``opened``: the prompt ended inside ``<think>``.

    A reply that does not open with ``<think>`` (after white space) is all answer; one that
    never closes it is all reasoning. White space right after ``</think>`` is dropped, as
    llama.cpp's and vLLM's parsers drop it.
    """

    def __init__(self, *, opened: bool = False) -> None:
        self._state = "reasoning" if opened else "start"
        self._buf = ""
        self._trim = False

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning: list[str] = []
        answer: list[str] = []
        while self._buf:
            if self._state == "start":
                body = self._buf.lstrip()
                if body.startswith(THINK_OPEN):
                    self._buf = body[len(THINK_OPEN) :]
                    self._state = "reasoning"
                elif THINK_OPEN.startswith(body):
                    break  # white space, or a start of the tag: wait
                else:
                    self._state = "answer"
            elif self._state == "reasoning":
                before, self._buf, closed = _until(self._buf, THINK_CLOSE)
                reasoning.append(before)
                if not closed:
                    break
                self._state, self._trim = "answer", True
            else:
                if self._trim:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        break
                    self._trim = False
                answer.append(self._buf)
                self._buf = ""
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        rest, self._buf = self._buf, ""
        if self._state == "reasoning":
            return rest, ""
        if self._state == "start":
            return "", rest.lstrip()
        return "", rest.lstrip() if self._trim else rest


class Harmony:
    """gpt-oss's channels: ``[<|start|>role]<|channel|>name[ to=...]<|message|>body`` again
    and again; ``analysis`` bodies are reasoning, the others answer. The reply starts in a
    header (the prompt ends with ``<|start|>assistant``); text before any markup, or a header
    never closed, is answer."""

    def __init__(self) -> None:
        self._state = "header"
        self._buf = ""
        self._channel = ""

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning: list[str] = []
        answer: list[str] = []
        while self._buf:
            if self._state == "header":
                at = _header_end(self._buf)
                if at is None:
                    self._channel, self._state = "", "body"  # no header after all
                    continue
                if at < 0:
                    break
                header, self._buf = self._buf[:at], self._buf[at + len(_MESSAGE) :]
                self._channel = _channel_of(header)
                self._state = "body"
            else:
                out = reasoning if self._channel == "analysis" else answer
                before, self._buf, ended = _until(self._buf, _START)
                out.append(before)
                if not ended:
                    break
                self._state = "header"
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        rest, self._buf = self._buf, ""
        if self._state == "body" and self._channel == "analysis":
            return rest, ""
        if self._state == "header":
            # A header the model never closed: its text, markup dropped, is answer.
            rest = rest.replace(_CHANNEL, " ").replace(_START, "").strip()
        return "", rest


def _channel_of(header: str) -> str:
    """The channel a message header names (``assistant<|channel|>final`` -> ``final``)."""
    _, _, after = header.partition(_CHANNEL)
    return after.strip().split(" ", 1)[0].split("<|", 1)[0] if after else ""


def reasoning_parser(
    vocabulary: Sequence[str] | frozenset[str],
    prompt_tail: str = "",
    fmt: str = "auto",
) -> ReasoningParser | None:
    """The parser for a model whose added tokens are ``vocabulary`` (harmony's markup, or
    ``<think>`` and ``</think>``), given the end of its prompt as text; None when ``fmt`` is
    ``"none"`` or the model has neither shape."""
    if fmt == "none":
        return None
    if fmt not in REASONING_FORMATS:
        raise ValueError(f"reasoning format must be one of {REASONING_FORMATS}, got {fmt!r}")
    words = set(vocabulary)
    if {_CHANNEL, _MESSAGE, "<|return|>"} <= words:
        return Harmony()
    if {THINK_OPEN, THINK_CLOSE} <= words:
        return ThinkTags(opened=prompt_tail.rstrip().endswith(THINK_OPEN))
    return None


# Added tokens that mark a reasoning shape.
_MARKERS = (_CHANNEL, _MESSAGE, "<|return|>", THINK_OPEN, THINK_CLOSE)


def parser_for(
    tokenizer: object, prompt: Sequence[int], fmt: str = "auto"
) -> ReasoningParser | None:
    """:func:`reasoning_parser` for a reply to ``prompt`` (token ids) from a model whose
    tokenizer is ``tokenizer`` (an rlx_lm `Tokenizer`: its markers are looked up by text)."""
    if fmt == "none":
        return None
    probe = getattr(getattr(tokenizer, "inner", None), "token_to_id", None)
    if not callable(probe):
        return reasoning_parser((), "", fmt)
    present = [t for t in _MARKERS if probe(t) is not None]
    tail = ""
    if THINK_OPEN in present and prompt:
        decode = getattr(tokenizer, "decode", None)
        if callable(decode):
            tail = str(decode(list(prompt[-8:]), skip_special_tokens=False))
    return reasoning_parser(present, tail, fmt)


def split_reasoning(parser: ReasoningParser | None, text: str) -> tuple[str, str]:
    """A whole reply's (reasoning, answer); without a parser, ``("", text)``."""
    if parser is None:
        return "", text
    r1, a1 = parser.feed(text)
    r2, a2 = parser.finish()
    return r1 + r2, a1 + a2
