"""Where a model's configuration comes from, the device a runner uses, its KV dtype and threads."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
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
    "cgroup_cpu_quota",
]

KvDtype = Literal["float32", "float16"]

#: How activations meet the weights: ``"exact"`` float32 (default) or ``"q8"``, quantised to
#: 8 bits as llama.cpp does, with integer dot products (faster, slightly less exact).
Activations = Literal["exact", "q8"]
"""How a runner stores its KV cache: float16 halves its memory."""

_T = TypeVar("_T")


def available_cores() -> int:
    """The cores this process may use: its CPU affinity (``os.sched_getaffinity``, else
    ``os.cpu_count()``), capped by its cgroup's CPU quota (a container's ``--cpus``), as
    Rust's ``available_parallelism`` and Go's ``automaxprocs`` do: the default number of
    compute threads of a runner. A container limited to 2 CPUs on a 64-core host so gets 2
    threads, not 64, whose spinning teams the quota would throttle."""
    try:
        n = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        n = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return n if quota is None else max(1, min(n, int(quota)))


def cgroup_cpu_quota(
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
) -> float | None:
    """The CPUs this process's cgroup may use per period (quota over period, the smallest
    along its path up to the mount), or None without a quota or on a system without cgroups.

    cgroup v2: ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") in the process's cgroup
    (``0::/path`` in ``/proc/self/cgroup``) and each parent. cgroup v1: ``cpu.cfs_quota_us``
    (-1: none) over ``cpu.cfs_period_us`` in the ``cpu`` controller's hierarchy. A path that
    is not under the mount (a container without its own cgroup namespace sees the host's
    path) is walked up until it is; unreadable or malformed files count as no quota."""
    try:
        lines = Path(proc_cgroup).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    root = Path(cgroup_root)
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            for mount in (root, root / "unified"):
                limits += _quotas_along(mount, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / name).is_dir():
                    limits += _quotas_along(root / name, path, _v1_quota)
                    break
    return min(limits) if limits else None


def _quotas_along(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """``read``'s quota in the cgroup at ``path`` under ``mount`` and in each of its
    parents up to the mount itself."""
    rel = [p for p in path.split("/") if p and p not in (".", "..")]
    out: list[float] = []
    for depth in range(len(rel), -1, -1):
        q = read(mount.joinpath(*rel[:depth]))
        if q is not None:
            out.append(q)
    return out


def _v2_quota(d: Path) -> float | None:
    try:
        fields = (d / "cpu.max").read_text(encoding="ascii").split()
        if len(fields) != 2 or fields[0] == "max":
            return None
        quota, period = int(fields[0]), int(fields[1])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(d: Path) -> float | None:
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text(encoding="ascii"))
        period = int((d / "cpu.cfs_period_us").read_text(encoding="ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return quota / period if quota > 0 and period > 0 else None


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
