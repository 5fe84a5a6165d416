"""A multi-turn chat with a model, its KV cache kept between turns.

`ChatSession` holds the conversation (an optional system prompt, then user and assistant
turns) and renders it with the model's chat template on every turn. As llama.cpp does, the
prompt of turn N is the token ids of turn N-1's prompt and reply, exactly as the model saw
and wrote them, followed by the tokens of what the template adds after them (the end of the
reply's turn, the new user turn, the generation prompt). A `PromptCache` holds the runner's
session between turns, so only those new tokens are prefilled
(`GenerationResult.reused_tokens` says how many were not). When the template does not
extend the previous rendering (it rewrites earlier turns, or a reply was cut at a stop
string), the whole conversation is tokenized again and the cache reuses the longest prefix
it still shares.

A reasoning model's reply (think tags, gpt-oss's analysis channel: `rlx_lm.reasoning`) is
split as it streams: the answer goes to ``on_text`` and into the conversation as the
assistant's ``content``, the reasoning to ``on_reasoning`` and ``reasoning_content`` (which
templates leave out of later turns), unless ``reasoning_format="none"``.

A model without a chat template gets a plain transcript (``User: ...`` lines and a final
``Assistant:``), which stops at the next ``User:`` line.

`run_repl` is the ``rlx-lm chat`` loop: readline editing on a terminal, ``/clear`` to start
over, ``/exit`` (or Ctrl-D) to leave, Ctrl-C to cut a reply short.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO, overload

from rlx_lm.chat_template import ChatTemplate
from rlx_lm.errors import CapacityError, ChatTemplateError, InvalidOptionError
from rlx_lm.generation import GenerationResult, stream
from rlx_lm.prompt_cache import PromptCache
from rlx_lm.reasoning import parser_for
from rlx_lm.runner import LmCore
from rlx_lm.sample_opts import SampleOpts
from rlx_lm.tokenizer import Tokenizer

__all__ = ["TRANSCRIPT_TEMPLATE", "ChatSession", "render_conversation", "run_repl"]

TRANSCRIPT_TEMPLATE = (
    "{% for m in messages %}{{ m.role | capitalize }}:"
    "{% if m.role != 'assistant' %} {% endif %}{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
"""The chat format of a model without a template: ``User: ...`` lines, then ``Assistant:``.

A reply is written back exactly as the model continued ``Assistant:`` (its own leading
space or newline included), so the next turn's prompt extends this one token for token.
"""

_TRANSCRIPT_STOPS = ("\nUser:", "\nSystem:")
DEFAULT_CACHE_BYTES = 1 << 30


@dataclass
class ChatSession:
    """A conversation with ``runner``: `send` a user message, get the reply as it streams."""

    runner: LmCore
    tokenizer: Tokenizer
    system_prompt: str | None = None
    opts: SampleOpts | None = None
    order: str | Sequence[str] | None = None
    """The sampler chain's order (`SampleOpts.into_chain`): None, a preset, or stage names."""
    max_tokens: int | None = None
    """Tokens per reply at most; None: until end of turn or the context is full."""
    context: int | None = None
    """Tokens the runner holds (its max_seq when it tells; None: no check)."""
    chat_template: ChatTemplate | None = None
    """None: the model's template, or the plain transcript when it has none."""
    stop: Sequence[str] = ()
    cache_bytes: int = DEFAULT_CACHE_BYTES
    reasoning_format: str = "auto"
    """``"auto"``: a reasoning model's chain of thought is split from its answer; ``"none"``:
    the reply is kept whole."""
    messages: list[dict[str, str]] = field(default_factory=list)
    last: GenerationResult | None = None
    """The result of the latest reply (tokens, reused_tokens, timings, stop reason)."""

    def __post_init__(self) -> None:
        if self.chat_template is None and self.tokenizer.chat_templates.has_default():
            self.chat_template = self.tokenizer.chat_templates.select()
        self.transcript = self.chat_template is None
        if self.chat_template is None:
            self.chat_template = ChatTemplate(TRANSCRIPT_TEMPLATE, name="transcript")
        if self.context is None:
            self.context = _max_seq(self.runner)
        self._cache = PromptCache(self.cache_bytes)
        self.clear()

    def clear(self) -> None:
        """Forget the conversation (the system prompt stays) and the cached KV rows."""
        self.messages = []
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})
        self._cache = PromptCache(self.cache_bytes)
        self._history: list[int] | None = None
        self._history_text = ""
        self.last = None

    def prompt_ids(self, user: str) -> list[int]:
        """The prompt tokens of the conversation with ``user`` as the next turn."""
        return self._prompt(user)[0]

    def _prompt(self, user: str) -> tuple[list[int], str]:
        """(prompt ids, prompt text) for the next turn."""
        turns = [*self.messages, {"role": "user", "content": user}]
        template = self.chat_template
        text = render_conversation(self.tokenizer, turns, chat_template=template, tokenize=False)
        if self._history is not None and text.startswith(self._history_text):
            tail = text[len(self._history_text) :]
            return [*self._history, *self.tokenizer.encode(tail, add_special_tokens=False)], text
        return render_conversation(self.tokenizer, turns, chat_template=template), text

    def send(
        self,
        user: str,
        *,
        on_text: Callable[[str], None] | None = None,
        on_reasoning: Callable[[str], None] | None = None,
    ) -> GenerationResult:
        """Add ``user``'s message, generate the reply (its answer streamed to ``on_text``,
        its reasoning to ``on_reasoning``), keep both.

        A reply cut short (Ctrl-C: KeyboardInterrupt from ``on_text`` or the model) keeps
        what was generated, then the interrupt propagates.
        """
        ids, text = self._prompt(user)
        room = None if self.context is None else self.context - len(ids)
        if room is not None and room < 1:
            raise CapacityError(
                f"the conversation is {len(ids)} tokens and the context holds {self.context}: "
                f"start over with /clear (or a larger -c)"
            )
        limit = room if self.max_tokens is None else min(self.max_tokens, room or self.max_tokens)
        if limit is None:
            raise InvalidOptionError("max_tokens is needed when the runner's context is unknown")
        stops = [*self.stop, *(_TRANSCRIPT_STOPS if self.transcript else ())]
        gen = stream(
            self.runner,
            self.tokenizer,
            ids,
            opts=self.opts,
            order=self.order,
            max_tokens=limit,
            stop=stops,
            prompt_cache=self._cache,
        )
        pieces: list[str] = []
        thoughts: list[str] = []
        parser = parser_for(self.tokenizer, ids, self.reasoning_format)

        def emit(reasoning: str, answer: str) -> None:
            if reasoning:
                thoughts.append(reasoning)
                if on_reasoning is not None:
                    on_reasoning(reasoning)
            if answer:
                pieces.append(answer)
                if on_text is not None:
                    on_text(answer)

        self.messages.append({"role": "user", "content": user})
        self._history = None
        try:
            for chunk in _chunks(gen):
                if chunk:
                    emit(*(parser.feed(chunk) if parser is not None else ("", chunk)))
            if parser is not None:
                emit(*parser.finish())
        finally:
            gen.close()
            reply = "".join(pieces)
            message = {"role": "assistant", "content": reply}
            if thoughts:
                message["reasoning_content"] = "".join(thoughts)
            self.messages.append(message)
            result = gen.result
            self.last = result
            if result.stop_reason in ("eos", "length", "context") and result.text == reply:
                # the reply's tokens decode to exactly its text: the next turn extends them
                self._history = [*ids, *result.tokens]
                self._history_text = text + reply
        return gen.result


@overload
def render_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_template: ChatTemplate | None,
    tokenize: Literal[True] = ...,
) -> list[int]: ...


@overload
def render_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_template: ChatTemplate | None,
    tokenize: Literal[False],
) -> str: ...


def render_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_template: ChatTemplate | None,
    tokenize: bool = True,
) -> list[int] | str:
    """``messages`` rendered with the generation prompt, as token ids or text.

    A template that refuses a system turn (Gemma's, Mistral's first ones) gets the system
    message folded into the first user message, separated by a newline, as llama.cpp does;
    if that is refused too, the template's own error is raised.
    """
    try:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=tokenize, chat_template=chat_template
        )
    except ChatTemplateError:
        folded = _fold_system(messages)
        if folded is None:
            raise
        try:
            return tokenizer.apply_chat_template(
                folded, add_generation_prompt=True, tokenize=tokenize, chat_template=chat_template
            )
        except ChatTemplateError:
            pass
        raise


def _fold_system(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    if len(messages) < 2 or messages[0].get("role") != "system":
        return None
    first, user = messages[0].get("content"), messages[1]
    if user.get("role") != "user" or not isinstance(first, str):
        return None
    if not isinstance(user.get("content"), str):
        return None
    merged = {**user, "content": f"{first}\n{user['content']}"}
    return [merged, *(dict(m) for m in messages[2:])]


def _chunks(gen: Any) -> Iterator[str]:
    for chunk in gen:
        yield chunk.text


def _max_seq(runner: Any) -> int | None:
    for name in ("max_seq", "max_seq_len", "context_length"):
        value = getattr(runner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


_HELP = "commands: /clear starts over, /exit leaves (so does Ctrl-D); Ctrl-C cuts a reply short"


def run_repl(
    session: ChatSession,
    *,
    stdin: TextIO,
    out: TextIO,
    err: TextIO,
    verbose: bool = False,
) -> int:
    """The interactive loop of ``rlx-lm chat``; returns the exit status (0 at /exit or EOF)."""
    tty = stdin.isatty()
    shows_reasoning = out.isatty()
    if tty:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
        err.write(f"rlx-lm chat: {_HELP}\n")
        err.flush()
    while True:
        try:
            line = _read_line(stdin, out, tty)
        except KeyboardInterrupt:
            out.write("\n")
            return 130
        if line is None:  # Ctrl-D / end of input
            if tty:
                out.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/clear":
            session.clear()
            err.write("rlx-lm chat: conversation cleared\n")
            err.flush()
            continue
        if text in ("/help", "/?"):
            err.write(f"{_HELP}\n")
            continue

        def show(piece: str) -> None:
            out.write(piece)
            out.flush()

        def think(piece: str) -> None:
            # A terminal shows the reasoning dimmed before the answer; a pipe gets the answer.
            if shows_reasoning:
                out.write(f"\x1b[2m{piece}\x1b[0m")
                out.flush()

        try:
            result = session.send(text, on_text=show, on_reasoning=think)
        except KeyboardInterrupt:
            out.write("\n")
            out.flush()
            continue
        except CapacityError as exc:
            err.write(f"rlx-lm chat: {exc}\n")
            err.flush()
            continue
        out.write("\n")
        out.flush()
        if verbose:
            err.write(
                f"[prompt {result.prompt_tokens} tokens, {result.reused_tokens} reused | "
                f"reply {len(result.tokens)} tokens, {result.decode_tokens_per_second:.1f} tok/s"
                f" | stop: {result.stop_reason}]\n"
            )
            err.flush()


def _read_line(stdin: TextIO, out: TextIO, tty: bool) -> str | None:
    if tty:
        try:
            return input("> ")
        except EOFError:
            return None
    line = stdin.readline()
    return line if line else None
