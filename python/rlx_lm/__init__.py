"""rlx_lm: drive a language model token by token from Python.

Runner protocols any backend can meet, a Rust sampler chain and KV cache, and
a reference Llama-family runner.
"""

from __future__ import annotations

from rlx_lm._core import KvCache, KvSnapshot, __version__, argmax, build_profile
from rlx_lm.errors import (
    CapacityError,
    DtypeError,
    InvalidLogitsError,
    InvalidOptionError,
    RlxError,
    ShapeError,
    SnapshotMismatchError,
    TokenOutOfRangeError,
    UnsupportedError,
    WeightFormatError,
)
from rlx_lm.prompt_cache import PromptCache, PromptCacheStats, cached_prefill_logits
from rlx_lm.session import ModelFingerprint, SessionSnapshot

__all__ = [
    "CapacityError",
    "DtypeError",
    "InvalidLogitsError",
    "InvalidOptionError",
    "KvCache",
    "KvSnapshot",
    "ModelFingerprint",
    "PromptCache",
    "PromptCacheStats",
    "RlxError",
    "SessionSnapshot",
    "ShapeError",
    "SnapshotMismatchError",
    "TokenOutOfRangeError",
    "UnsupportedError",
    "WeightFormatError",
    "__version__",
    "argmax",
    "build_profile",
    "cached_prefill_logits",
]
