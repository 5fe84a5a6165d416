"""The small model that ships inside the wheel, so examples and tests run with no download.

``models/default.gguf`` is a tiny Llama trained on Jane Austen's novels (see
``models/MODEL_CARD.md`` beside it and ``tools/`` in the source tree for how it was made).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlx_lm.runner import LmRunner
    from rlx_lm.tokenizer import Tokenizer

__all__ = ["DEFAULT_CONTEXT", "default_model_path", "load_default"]

DEFAULT_CONTEXT = 256
"""Context length (tokens) the default model was trained with."""


def default_model_path() -> Path:
    """Path of the GGUF file of the model shipped with the package."""
    return Path(__file__).resolve().parent / "models" / "default.gguf"


def load_default(*, max_seq: int = DEFAULT_CONTEXT, **builder: Any) -> tuple[LmRunner, Tokenizer]:
    """Load the shipped default model: a ready (runner, tokenizer) pair."""
    from rlx_lm.generation import load_model

    return load_model(default_model_path(), max_seq=max_seq, **builder)
