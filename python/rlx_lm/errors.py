"""The exceptions rlx_lm raises.

Every class derives from `RlxError` and also from the builtin a caller would
naturally catch, so ``except ValueError`` keeps working::

    RlxError
    ├── InvalidLogitsError   (ValueError)   NaN, empty or all-banned logits
    ├── InvalidOptionError   (ValueError)   a sampler knob or argument out of range
    ├── ShapeError           (ValueError)   an array of the wrong shape
    ├── CapacityError        (ValueError)   a write past a cache's capacity
    ├── SnapshotMismatchError(ValueError)   a snapshot from another model or geometry
    ├── WeightFormatError    (ValueError)   a malformed, truncated or hostile file
    ├── UnknownArchitectureError (ValueError)  no registered family claims a model
    ├── ChatTemplateError    (ValueError)   a chat template that is broken, hostile or refuses
    ├── SequenceStateError   (RuntimeError) a call out of order, e.g. decode before prefill
    ├── InternalError        (RuntimeError) a bug in the Rust core, caught at its boundary
    ├── DtypeError           (TypeError)    wrong dtype or memory layout
    ├── TokenOutOfRangeError (IndexError)   a token id outside the vocabulary
    └── UnsupportedError     (NotImplementedError)  a runner lacks a capability

The Rust core raises these same classes through one mapping (``rust/py/errors.rs``);
`UnknownArchitectureError`, `ChatTemplateError` and `SequenceStateError` come only from
Python code.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "ChatTemplateError",
    "DtypeError",
    "InternalError",
    "InvalidLogitsError",
    "InvalidOptionError",
    "RlxError",
    "SequenceStateError",
    "ShapeError",
    "SnapshotMismatchError",
    "TokenOutOfRangeError",
    "UnknownArchitectureError",
    "UnsupportedError",
    "WeightFormatError",
]


class RlxError(Exception):
    """Base class of every error rlx_lm raises on purpose."""


class InvalidLogitsError(RlxError, ValueError):
    """Logits that cannot be sampled: NaN, empty, or every token banned."""


class InvalidOptionError(RlxError, ValueError):
    """A sampler option or argument with an invalid value; the message names it."""


class ShapeError(RlxError, ValueError):
    """An array whose shape does not match what the call needs."""


class CapacityError(RlxError, ValueError):
    """A write that would exceed a fixed capacity (for example a KV cache's max_seq)."""


class SnapshotMismatchError(RlxError, ValueError):
    """A session snapshot restored into a model or cache it does not belong to."""


class WeightFormatError(RlxError, ValueError):
    """A weight file or directory that is malformed, truncated, hostile or unrecognised."""


class UnknownArchitectureError(RlxError, ValueError):
    """No registered model family claims an architecture; the message lists the families."""


class InternalError(RlxError, RuntimeError):
    """A bug in the Rust core: a panic caught at the binding's boundary (please report it)."""


class ChatTemplateError(RlxError, ValueError):
    """A chat template that does not parse, exceeds its time or size budget, or refuses input."""


class SequenceStateError(RlxError, RuntimeError):
    """A call made out of order, such as decoding before any prefill."""


class DtypeError(RlxError, TypeError):
    """An array of the wrong dtype or memory layout; the message says how to convert."""


class TokenOutOfRangeError(RlxError, IndexError):
    """A token id outside ``0..vocab_size``."""


class UnsupportedError(RlxError, NotImplementedError):
    """A runner does not implement an optional capability."""
