"""Options of a conformance run: tolerances and search budget, and the hypothesis requirement."""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

from rlx_lm.errors import InvalidOptionError

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_PROMPT_LEN",
    "DEFAULT_RTOL",
    "CheckOptions",
    "require_hypothesis",
]


DEFAULT_ATOL = 1e-4
"""Absolute tolerance when two logits rows must agree: ``|got - want| <= atol + rtol * |want|``."""
DEFAULT_RTOL = 1e-4
"""Relative tolerance when two logits rows must agree (see `DEFAULT_ATOL`)."""
DEFAULT_MAX_EXAMPLES = 20
"""Hypothesis examples per clause."""
DEFAULT_MAX_PROMPT_LEN = 8
"""Longest prompt drawn, in tokens."""
DEFAULT_MAX_NEW_TOKENS = 4
"""Most tokens generated or decoded per example."""


def require_hypothesis() -> None:
    """Raise a clear ImportError when hypothesis, which draws the prompts, is not installed."""
    try:
        importlib.import_module("hypothesis")
    except ImportError as exc:
        raise ImportError(
            "rlx_lm.testing draws prompts with hypothesis, which is not installed; "
            "install it with: pip install 'rlx-lm[testing]'"
        ) from exc


@dataclass(frozen=True)
class CheckOptions:
    """Tolerances and search budget of a conformance run (defaults: the ``DEFAULT_*`` constants).

    The longest token sequence a clause builds is ``max_prompt_len + 2 * max_new_tokens``,
    so a runner with a fixed context must hold at least that many.
    """

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    max_examples: int = DEFAULT_MAX_EXAMPLES
    max_prompt_len: int = DEFAULT_MAX_PROMPT_LEN
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int | None = 0
    image_size: tuple[int, int] = (8, 8)
    multimodal_prompt: str = "<image>\nDescribe the image."

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InvalidOptionError(f"{name} must be a finite number >= 0, got {value!r}")
        for name, low in (("max_examples", 1), ("max_prompt_len", 2), ("max_new_tokens", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidOptionError(f"{name} must be an int >= {low}, got {value!r}")
        w, h = self.image_size
        if w < 1 or h < 1:
            raise InvalidOptionError(f"image_size must be positive, got {self.image_size!r}")
