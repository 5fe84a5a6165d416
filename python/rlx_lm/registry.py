"""The model-family registry: which runner loads which weights.

A family registers a `ModelRegistration` (``family``, ``description``,
``matches(arch, path)``, ``load(builder)``) with `register_model`, directly or
as a decorator on its loader. Lookups walk the registrations in order and take
the first whose ``matches`` accepts the lowercase architecture and the weights
path. Before the first lookup, the built-in runner modules in `BUILTIN_RUNNERS`
are imported, then every entry point in the ``rlx_lm.runners`` group is loaded;
an entry point names either a `ModelRegistration` or a module that registers
on import.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar, overload

from rlx_lm.errors import InvalidOptionError, UnknownArchitectureError

if TYPE_CHECKING:
    from rlx_lm.builder import LmRunnerBuilder
    from rlx_lm.runner import LmCore

__all__ = [
    "BUILTIN_RUNNERS",
    "ENTRY_POINT_GROUP",
    "Loader",
    "Matcher",
    "ModelRegistration",
    "auto_runner_name",
    "find_registration",
    "match_architectures",
    "register_model",
    "registered_models",
]

ENTRY_POINT_GROUP = "rlx_lm.runners"
"""The entry-point group third-party packages use to add model families."""

BUILTIN_RUNNERS: tuple[str, ...] = ("rlx_lm.runners.llama",)
"""Modules of rlx_lm's own runners, imported (and so registered) on the first lookup."""

Matcher = Callable[[str, Path], bool]
"""``(lowercase architecture, weights path) -> bool``: whether a family owns these weights."""

Loader = Callable[["LmRunnerBuilder"], "LmCore"]
"""Build a runner from a builder whose ``weights()`` and ``format()`` are resolved."""


@dataclass(frozen=True)
class ModelRegistration:
    """A model family: its name, a description, a weights matcher and a loader."""

    family: str
    description: str
    matches: Matcher
    load: Loader | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or not self.family.strip():
            raise InvalidOptionError(f"family must be a non-empty string, got {self.family!r}")
        if not callable(self.matches):
            raise InvalidOptionError(f"{self.family}: matches must be callable(arch, path)")
        if self.load is not None and not callable(self.load):
            raise InvalidOptionError(f"{self.family}: load must be callable(builder) or None")


def match_architectures(*names: str) -> Matcher:
    """A matcher accepting exactly these architecture names (case-insensitive)."""
    wanted = frozenset(n.lower() for n in names)

    def matches(arch: str, path: Path) -> bool:
        return arch.lower() in wanted

    matches.__qualname__ = f"match_architectures{tuple(sorted(wanted))!r}"
    return matches


class _Registry:
    """Registrations in order, with lazy loading of built-ins and entry points."""

    def __init__(self, builtins: Iterable[str] = BUILTIN_RUNNERS, group: str = ENTRY_POINT_GROUP):
        self.builtins = tuple(builtins)
        self.group = group
        self.entries: dict[str, ModelRegistration] = {}
        self.problems: list[str] = []
        self.loaded = False
        self.lock = threading.RLock()

    def add(self, registration: ModelRegistration, replace: bool) -> None:
        with self.lock:
            current = self.entries.get(registration.family)
            if current is not None and current is not registration and not replace:
                raise InvalidOptionError(
                    f"model family {registration.family!r} is already registered "
                    f"({current.description!r}); pass replace=True to override it"
                )
            self.entries[registration.family] = registration

    def all(self) -> tuple[ModelRegistration, ...]:
        self.ensure_loaded()
        with self.lock:
            return tuple(self.entries.values())

    def ensure_loaded(self) -> None:
        with self.lock:
            if self.loaded:
                return
            for module in self.builtins:
                importlib.import_module(module)
            self.loaded = True
            for ep in sorted(entry_points(group=self.group), key=lambda e: (e.name, e.value)):
                self._load_entry_point(ep)

    def _load_entry_point(self, ep: EntryPoint) -> None:
        where = f"entry point {ep.name!r} ({ep.value}) in group {self.group!r}"
        try:
            obj = ep.load()
            if isinstance(obj, ModelRegistration):
                self.add(obj, replace=False)
            elif not isinstance(obj, ModuleType):
                raise TypeError(
                    f"names a {type(obj).__name__}; expected a ModelRegistration or a module "
                    f"that calls register_model"
                )
        except Exception as exc:  # a broken plugin must not break every other family
            problem = f"{where}: {type(exc).__name__}: {exc}"
            self.problems.append(problem)
            warnings.warn(f"rlx_lm: skipped {problem}", RuntimeWarning, stacklevel=4)


_registry = _Registry()

_L = TypeVar("_L", bound=Loader)


@overload
def register_model(
    registration: ModelRegistration, /, *, replace: bool = False
) -> ModelRegistration: ...
@overload
def register_model(
    family: str, /, description: str = "", *, matches: Matcher, replace: bool = False
) -> Callable[[_L], _L]: ...
def register_model(
    registration: ModelRegistration | str,
    /,
    description: str = "",
    *,
    matches: Matcher | None = None,
    replace: bool = False,
) -> ModelRegistration | Callable[[_L], _L]:
    """Register a model family; with a family name instead, decorate its loader.

    ``register_model(ModelRegistration(...))`` registers and returns the
    registration. ``@register_model("llama", "...", matches=...)`` on a
    function (or a runner class) taking the builder registers it as the loader
    and returns it unchanged. A family name can be registered once unless
    ``replace=True``.
    """
    if isinstance(registration, ModelRegistration):
        _registry.add(registration, replace)
        return registration
    if matches is None:
        raise InvalidOptionError(f"{registration}: register_model needs matches=")
    family, matcher = registration, matches

    def decorate(load: _L) -> _L:
        _registry.add(ModelRegistration(family, description, matcher, load), replace)
        return load

    return decorate


def registered_models() -> tuple[ModelRegistration, ...]:
    """Every registered family, in lookup order (loading built-ins and entry points first)."""
    return _registry.all()


def find_registration(arch: str, path: str | Path) -> ModelRegistration:
    """The first family whose matcher claims ``(arch, path)``; raises if none does."""
    arch_lc = arch.lower()
    p = Path(path)
    registrations = _registry.all()
    matcher_errors: list[str] = []
    for reg in registrations:
        try:
            if reg.matches(arch_lc, p):
                return reg
        except Exception as exc:  # a broken matcher must not hide the families after it
            matcher_errors.append(f"{reg.family}.matches raised {type(exc).__name__}: {exc}")
    families = ", ".join(r.family for r in registrations) or "none"
    message = (
        f"no registered model family handles architecture {arch_lc or '(none)'!r} at {p} "
        f"(registered families: {families})"
    )
    notes = matcher_errors + _registry.problems
    if notes:
        message += "; " + "; ".join(notes)
    raise UnknownArchitectureError(message)


def auto_runner_name(arch: str, path: str | Path) -> str:
    """The family that handles ``(arch, path)``; the architecture is matched case-insensitively."""
    return find_registration(arch, path).family
