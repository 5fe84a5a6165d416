"""Where a model's configuration comes from, the device a runner uses, its KV dtype and threads."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from rlx_lm.errors import InvalidOptionError

__all__ = [
    "Activations",
    "ConfigSource",
    "Device",
    "Embedded",
    "Explicit",
    "JsonFile",
    "KvDtype",
    "available_cores",
]

KvDtype = Literal["float32", "float16"]

#: How activations meet the weights: ``"exact"`` float32 (default) or ``"q8"``, quantised to
#: 8 bits as llama.cpp does, with integer dot products (faster, slightly less exact).
Activations = Literal["exact", "q8"]
"""How a runner stores its KV cache: float16 halves its memory."""

_T = TypeVar("_T")


def available_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``), else ``os.cpu_count()``:
    the default number of compute threads of a runner."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


class Device(enum.Enum):
    """The device a runner computes on."""

    CPU = "cpu"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> Device:
        """The device named by ``text`` (case-insensitive, e.g. ``"cpu"``)."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            known = "|".join(d.value for d in cls)
            raise InvalidOptionError(f"device: expected {known}, got {text!r}") from None


class ConfigSource:
    """Where a model's configuration comes from: ``Embedded``, ``JsonFile`` or ``Explicit``.

    The three sources are frozen dataclasses deriving from this class and are
    reachable as ``ConfigSource.Embedded()`` (the default),
    ``ConfigSource.JsonFile(path)`` and ``ConfigSource.Explicit(value)``; a
    family runner tells them apart with ``match`` or ``isinstance``.
    """

    __slots__ = ()

    Embedded: ClassVar[type[Embedded]]
    JsonFile: ClassVar[type[JsonFile]]
    Explicit: ClassVar[type[Explicit[Any]]]

    def __new__(cls, *args: object, **kwargs: object) -> ConfigSource:
        if cls is ConfigSource:
            raise TypeError("use ConfigSource.Embedded(), .JsonFile(path) or .Explicit(value)")
        return super().__new__(cls)


@dataclass(frozen=True)
class Embedded(ConfigSource):
    """Read the configuration from the weights themselves (GGUF metadata)."""


@dataclass(frozen=True)
class JsonFile(ConfigSource):
    """Read the configuration from a HuggingFace-style ``config.json``."""

    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))


@dataclass(frozen=True)
class Explicit(ConfigSource, Generic[_T]):
    """Use this configuration object as given."""

    value: _T


ConfigSource.Embedded = Embedded
ConfigSource.JsonFile = JsonFile
ConfigSource.Explicit = Explicit
