"""Session snapshots: a runner's KV state and the tokens that produced it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelFingerprint", "SessionSnapshot"]


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of the model a snapshot belongs to: family, geometry and a runner-chosen id."""

    family: str
    geometry: tuple[int, ...]
    model_id: str = ""


@dataclass(frozen=True, eq=False)
class SessionSnapshot:
    """A decode session frozen in time: KV state, token history and model fingerprint."""

    kv: Any
    tokens: tuple[int, ...]
    fingerprint: ModelFingerprint | None = None

    def __init__(
        self, kv: Any, tokens: Sequence[int], fingerprint: ModelFingerprint | None = None
    ) -> None:
        object.__setattr__(self, "kv", kv)
        object.__setattr__(self, "tokens", tuple(int(t) for t in tokens))
        object.__setattr__(self, "fingerprint", fingerprint)
