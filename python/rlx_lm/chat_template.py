"""Chat templates: a conversation -> the prompt text the model was trained on.

A model ships its template as Jinja source: in a GGUF header (``tokenizer.chat_template``,
and named variants ``tokenizer.chat_template.<name>``), in a model directory's
``tokenizer_config.json`` (``chat_template``: a string or a list of ``{"name", "template"}``)
or ``chat_template.jinja``, or in a file the user names. `ChatTemplate.render` follows the
conventions of Hugging Face's ``apply_chat_template``, so the templates models publish render
as their authors document:

* the variables ``messages``, ``add_generation_prompt``, ``tools``, ``documents``, the special
  tokens (``bos_token``, ``eos_token``, ...) and any extra keyword;
* the globals ``raise_exception(message)`` and ``strftime_now(format)``, the ``tojson`` filter
  as Hugging Face defines it (no HTML escaping, ``ensure_ascii=False``, ``indent``,
  ``separators``, ``sort_keys``), the ``loopcontrols`` extension and the ``{% generation %}``
  block;
* ``trim_blocks`` and ``lstrip_blocks`` on, the template's final newline dropped.

A template is code from a model file, so it runs in Jinja's `ImmutableSandboxedEnvironment`
(no attribute of Python internals, no mutation of the caller's data, no loader: ``include``,
``import`` and ``extends`` reach no file) with three budgets of our own: a render time limit
(a trace on the template's own frames), a bound on every value the template builds and on its
output (``*``, ``+``, ``%``, ``**``, width arguments and ``str.format`` widths are checked
before they allocate), and Python's recursion limit. Anything a template does wrong, or
refuses through ``raise_exception``, is a `ChatTemplateError`.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from rlx_lm.errors import ChatTemplateError

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_TIMEOUT",
    "MAX_TEMPLATE_SOURCE",
    "ChatTemplate",
    "ChatTemplates",
    "templates_from_gguf_metadata",
    "templates_from_tokenizer_config",
]

DEFAULT_TIMEOUT = 2.0
"""Seconds a render may take (real templates take well under a millisecond)."""
DEFAULT_MAX_OUTPUT = 16 << 20
"""Characters a rendered prompt, and any value a template builds, may have."""
MAX_TEMPLATE_SOURCE = 1 << 20
"""Characters of template source accepted (published templates are under 30 000)."""

_TEMPLATE_FILENAME = "<chat template>"
_PROBE = "\x1erlx-probe\x1e"


class _Budget:
    """Per-render limits, checked from the trace hook and from the sandbox's hooks."""

    __slots__ = ("deadline", "lines", "max_size", "timeout")

    def __init__(self, timeout: float, max_size: int) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.max_size = max_size
        self.lines = 0


_local = threading.local()


def _budget() -> _Budget | None:
    return getattr(_local, "budget", None)


def _max_size() -> int:
    b = _budget()
    return DEFAULT_MAX_OUTPUT if b is None else b.max_size


class _TemplateLimit(Exception):
    """Raised inside a render when a budget is exceeded; turned into ChatTemplateError."""


def _too_big(what: str, size: int) -> _TemplateLimit:
    return _TemplateLimit(f"{what} would have {size} characters (limit {_max_size()})")


def _sized(value: Any) -> int:
    if isinstance(value, (str, bytes, list, tuple, dict)):
        return len(value)
    return 0


def _check_ints(args: Iterable[Any], what: str) -> None:
    limit = _max_size()
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > limit:
            raise _TemplateLimit(f"{what} got the number {a}, larger than the limit {limit}")


_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(\d+|\*)?(?:\.(\d+|\*))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d{7,})")


def _check_percent(fmt: str, args: Any) -> None:
    limit = _max_size()
    for m in _PERCENT_WIDTH.finditer(fmt):
        for g in m.groups():
            if g and g != "*" and int(g) > limit:
                raise _TemplateLimit(f"a %-format width of {g} exceeds the limit {limit}")
    values = args.values() if isinstance(args, Mapping) else args
    if isinstance(values, (tuple, list)) or isinstance(args, Mapping):
        _check_ints(values, "%-formatting")


def _check_format(fmt: str) -> None:
    m = _FORMAT_WIDTH.search(fmt)
    if m and int(m.group(1)) > _max_size():
        raise _TemplateLimit(f"a format width of {m.group(1)} exceeds the limit {_max_size()}")


def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (Hugging Face's assistant-mask marker)."""

        tags = {"generation"}  # noqa: RUF012 (jinja's API)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_render")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _render(self, caller: Callable[[], str]) -> str:
            return caller()

    class _Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("*", "**", "+", "%"))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            limit = _max_size()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and _sized(seq) and _sized(seq) * max(n, 0) > limit:
                        raise _too_big("a repetition", _sized(seq) * n)
            elif operator == "+":
                total = _sized(left) + _sized(right)
                if total > limit:
                    raise _too_big("a concatenation", total)
            elif operator == "%":
                if isinstance(left, str):
                    _check_percent(left, right)
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                bits = abs(right) * max(abs(left), 2).bit_length()
                if right > 0 and abs(left) > 1 and bits > 4096:
                    raise _TemplateLimit(f"{left} ** {right} is too large")
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value: Any) -> Any:
            owner = getattr(value, "__self__", None)
            if isinstance(owner, str) and getattr(value, "__name__", "") in (
                "format",
                "format_map",
            ):
                _check_format(owner)
            return super().wrap_str_format(value)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _check_ints(args, "a call")
            _check_ints(kwargs.values(), "a call")
            owner = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, str) and name == "replace" and len(args) >= 2:
                old, new = str(args[0]), str(args[1])
                grow = owner.count(old) * max(len(new) - len(old), 0) if old else 0
                if len(owner) + grow > _max_size():
                    raise _too_big("a replace", len(owner) + grow)
            return super().call(__context, __obj, *args, **kwargs)

    env = _Env(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        autoescape=False,
        cache_size=0,
    )

    def guarded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        skip = 2 if hasattr(fn, "jinja_pass_arg") else 1

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _check_ints(args[skip:], f"the {name} filter")
            _check_ints(kwargs.values(), f"the {name} filter")
            if name == "format" and isinstance(args[skip - 1], str):
                _check_percent(args[skip - 1], args[skip:])
            return fn(*args, **kwargs)

        for attr in ("jinja_pass_arg",):
            if hasattr(fn, attr):
                setattr(wrapper, attr, getattr(fn, attr))
        return wrapper

    for name, fn in list(env.filters.items()):
        env.filters[name] = guarded(name, fn)

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(str(message))

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        if isinstance(indent, int):
            _check_ints((indent,), "tojson")
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(str(fmt))

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_ENV: Any = None
_ENV_LOCK = threading.Lock()


def _env() -> Any:
    global _ENV
    with _ENV_LOCK:
        if _ENV is None:
            _ENV = _environment()
        return _ENV


def _namespace_values(value: Any) -> Iterable[Any]:
    attrs = getattr(value, "_Namespace__attrs", None)
    return attrs.values() if isinstance(attrs, dict) else ()


def _tracer(budget: _Budget) -> Callable[[FrameType, str, Any], Any]:
    """A trace function that runs only in the template's own frames."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > budget.deadline:
            raise _TemplateLimit(f"rendering took longer than {budget.timeout:g} s")
        budget.lines += 1
        limit = budget.max_size
        for v in frame.f_locals.values():
            n = _sized(v)
            if n > limit:
                raise _too_big("a value", n)
            for inner in _namespace_values(v):
                if _sized(inner) > limit:
                    raise _too_big("a namespace value", _sized(inner))
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == _TEMPLATE_FILENAME:
            return local(frame, event, arg)
        if time.monotonic() > budget.deadline:
            raise _TemplateLimit(f"rendering took longer than {budget.timeout:g} s")
        return None

    return global_


def _run_bounded(budget: _Budget, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` under ``budget``; every failure becomes ChatTemplateError."""
    import jinja2

    old_trace = sys.gettrace()
    old_budget = _budget()
    _local.budget = budget
    sys.settrace(_tracer(budget))
    try:
        return fn()
    except ChatTemplateError:
        raise
    except _TemplateLimit as exc:
        raise ChatTemplateError(f"chat template refused: {exc}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"chat template refused by the sandbox: {exc}") from None
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"chat template has a syntax error (line {exc.lineno}): {exc.message}"
        ) from None
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template error: {exc.message or exc}") from None
    except RecursionError:
        raise ChatTemplateError("chat template refused: it recurses too deeply") from None
    except MemoryError:
        raise ChatTemplateError("chat template refused: it ran out of memory") from None
    except Exception as exc:
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
    finally:
        sys.settrace(old_trace)
        _local.budget = old_budget


@dataclass(frozen=True)
class ChatTemplate:
    """One Jinja chat template, compiled once, rendered under time and size budgets."""

    source: str
    name: str = "default"
    timeout: float = DEFAULT_TIMEOUT
    max_output: int = DEFAULT_MAX_OUTPUT
    _compiled: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise ChatTemplateError(f"a chat template must be text, got {type(self.source)}")
        if len(self.source) > MAX_TEMPLATE_SOURCE:
            raise ChatTemplateError(
                f"chat template {self.name!r} has {len(self.source)} characters "
                f"(limit {MAX_TEMPLATE_SOURCE})"
            )
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ChatTemplateError(f"timeout must be a positive number, got {self.timeout}")
        env = _env()
        budget = _Budget(self.timeout, self.max_output)
        compiled = _run_bounded(budget, lambda: _compile(env, self.source, self.name))
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def from_file(cls, path: str | Path, **kw: Any) -> ChatTemplate:
        """A template read from a ``.jinja`` file (or a JSON file holding ``chat_template``)."""
        p = Path(path)
        text = _read_template_file(p)
        if p.suffix == ".json":
            found = templates_from_tokenizer_config(_json_object(p, text), where=str(p))
            if "default" not in found.names():
                raise ChatTemplateError(f"{p}: no default chat_template in the JSON file")
            return cls(found.source("default"), name=p.name, **kw)
        return cls(text, name=p.name, **kw)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (Hugging Face's ``apply_chat_template`` variables)."""
        chat = _messages(messages)
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set"
            )
        if continue_final_message and not chat:
            raise ChatTemplateError("continue_final_message needs at least one message")
        variables: dict[str, Any] = {
            k: v for k, v in (special_tokens or {}).items() if isinstance(v, str)
        }
        variables.update(kwargs)
        variables.update(
            messages=chat,
            tools=None if tools is None else [_plain(t, "tools") for t in tools],
            documents=None if documents is None else [_plain(d, "documents") for d in documents],
            add_generation_prompt=bool(add_generation_prompt),
        )
        budget = _Budget(self.timeout, self.max_output)

        def run() -> str:
            out: list[str] = []
            size = 0
            for piece in self._compiled.generate(**variables):
                size += len(piece)
                if size > budget.max_size:
                    raise _too_big("the rendered prompt", size)
                out.append(piece)
            return "".join(out)

        text = str(_run_bounded(budget, run))
        if continue_final_message:
            text = _cut_after_final_message(text, chat[-1])
        return text

    def end_of_turn_text(self, special_tokens: Mapping[str, str | None] | None = None) -> str:
        """The text the template writes right after an assistant message ("" if none).

        Rendered from a two-message probe conversation; for ChatML this is ``<|im_end|>\\n``.
        """
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = self.render(probe, special_tokens=special_tokens)
        except ChatTemplateError:
            return ""
        at = text.rfind(_PROBE)
        return "" if at < 0 else text[at + len(_PROBE) :]


class ChatTemplates:
    """A model's templates by name (``"default"``, ``"tool_use"``, ``"rag"``), compiled on use.

    A template that fails to compile fails when it is selected, not when the model loads,
    so a broken template never stops plain text generation.
    """

    def __init__(
        self,
        sources: Mapping[str, str | ChatTemplate] | None = None,
        *,
        where: str = "",
        error: str | None = None,
    ) -> None:
        self._sources: dict[str, str | ChatTemplate] = dict(sources or {})
        self._where = where
        self._error = error
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._sources) or self._error is not None

    def __repr__(self) -> str:
        return f"ChatTemplates({sorted(self._sources)!r})"

    def names(self) -> list[str]:
        """The template names, ``"default"`` first when present."""
        return sorted(self._sources, key=lambda n: (n != "default", n))

    def has_default(self) -> bool:
        """Whether a default template exists (or could not be read, which `select` reports)."""
        return "default" in self._sources or self._error is not None

    def source(self, name: str = "default") -> str:
        """The Jinja text of template ``name``."""
        tpl = self._sources[name]
        return tpl.source if isinstance(tpl, ChatTemplate) else tpl

    def with_default(self, template: ChatTemplate) -> ChatTemplates:
        """A copy whose default template is ``template``."""
        return ChatTemplates({**self._sources, "default": template}, where=self._where)

    def get(self, name: str) -> ChatTemplate:
        """Template ``name``, compiled (once)."""
        with self._lock:
            tpl = self._sources[name]
            if isinstance(tpl, str):
                try:
                    tpl = ChatTemplate(tpl, name=name)
                except ChatTemplateError as exc:
                    where = f"{self._where}: " if self._where else ""
                    raise ChatTemplateError(f"{where}chat template {name!r}: {exc}") from None
                self._sources[name] = tpl
            return tpl

    def select(self, name: str | None = None, *, tools: bool = False) -> ChatTemplate:
        """Hugging Face's choice: a named template, else ``tool_use`` with tools, else default."""
        if self._error is not None:
            raise ChatTemplateError(self._error)
        if name is not None:
            if name in self._sources:
                return self.get(name)
            raise ChatTemplateError(
                f"the model has no chat template named {name!r} "
                f"(it has: {', '.join(self.names()) or 'none'})"
            )
        if tools and "tool_use" in self._sources:
            return self.get("tool_use")
        if "default" in self._sources:
            return self.get("default")
        if not self._sources:
            raise ChatTemplateError(
                "the model has no chat template: pass chat_template=... (template text or a "
                "file), or build the prompt yourself"
            )
        raise ChatTemplateError(
            "the model has several chat templates and none is the default: choose one of "
            + ", ".join(self.names())
        )


def templates_from_gguf_metadata(metadata: Mapping[str, Any], *, where: str = "") -> ChatTemplates:
    """``tokenizer.chat_template`` and ``tokenizer.chat_template.<name>`` of a GGUF header."""
    sources: dict[str, str | ChatTemplate] = {}
    prefix = "tokenizer.chat_template."
    for key, value in metadata.items():
        if key == "tokenizer.chat_template" and isinstance(value, str):
            sources["default"] = value
        elif key.startswith(prefix) and isinstance(value, str) and len(key) > len(prefix):
            sources[key[len(prefix) :]] = value
    return ChatTemplates(sources, where=where)


def templates_from_tokenizer_config(
    config: Mapping[str, Any], *, where: str = "", jinja_file: Path | None = None
) -> ChatTemplates:
    """``chat_template`` of a ``tokenizer_config.json`` (text, or a list of named templates).

    ``jinja_file`` (a model directory's ``chat_template.jinja``) wins over the config's
    default, as in Hugging Face.
    """
    sources: dict[str, str | ChatTemplate] = {}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        sources["default"] = raw
    elif isinstance(raw, list):
        for entry in raw:
            if not (
                isinstance(entry, Mapping)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                raise ChatTemplateError(
                    f"{where}: chat_template list entries must be {{'name', 'template'}} objects"
                )
            sources[entry["name"]] = entry["template"]
    elif raw is not None:
        raise ChatTemplateError(f"{where}: chat_template must be text or a list")
    if jinja_file is not None and jinja_file.is_file():
        sources["default"] = _read_template_file(jinja_file)
    return ChatTemplates(sources, where=where)


def _read_template_file(p: Path) -> str:
    try:
        size = p.stat().st_size
        if size > 4 * MAX_TEMPLATE_SOURCE:
            raise ChatTemplateError(f"{p}: {size} bytes is too large for a chat template")
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"{p}: cannot read the chat template: {exc}") from None


def _compile(env: Any, source: str, name: str) -> Any:
    """Compile ``source``; its code carries the file name the trace hook looks for."""
    code = env.compile(source, name=name, filename=_TEMPLATE_FILENAME)
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def _json_object(path: Path, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ChatTemplateError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{path}: expected a JSON object")
    return data


def _plain(value: Any, what: str) -> Any:
    """A JSON-like copy of a caller's value (the template sees data, never live objects)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ChatTemplateError(f"{what} must be JSON-like data: {exc}") from None


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    given: object = messages
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise ChatTemplateError("messages must be a list of {'role', 'content'} mappings")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ChatTemplateError(f"message {i} must be a mapping with a 'role'")
        out.append(_plain(dict(m), f"message {i}"))
    return out


def _cut_after_final_message(text: str, final: Mapping[str, Any]) -> str:
    """Hugging Face's ``continue_final_message``: end the prompt right after the last content."""
    content = final.get("content")
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, Mapping) and "text" in b]
        content = texts[-1] if texts else None
    if not isinstance(content, str):
        raise ChatTemplateError("continue_final_message needs text content in the last message")
    content = content.strip()
    at = text.rfind(content)
    if at < 0:
        raise ChatTemplateError(
            "continue_final_message: the final message's content is not in the rendered prompt"
        )
    return text[: at + len(content)]
