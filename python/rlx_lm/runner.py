"""The runner contract: structural protocols, capability probes and the defaults adapter.

A runner is any object with the right members; nothing has to subclass or import
rlx_lm. The contract is split so that a third party writes only what it has:

    LmCore                 family, vocab_size, predict_logits      (the minimum)
    LmRunner(LmCore)       + generate                              (what callers hold)
    SupportsHostDriven     prefill_logits, decode_logits
    SupportsPromptCache    prefill_logits_reusing, export_session, restore_session
    SupportsKvStats        kv_store_stats
    SupportsBatchedDecode  decode_batch                            (one step for B sequences)
    SupportsMultimodal     set_multimodal_phase_callback, supports_multimodal,
                           generate_multimodal
    FullLmRunner           all of the above

Structural typing gives a third-party class none of our method bodies, so the
defaults live in one adapter: ``with_defaults(obj)`` returns a `RunnerAdapter`
that forwards what ``obj`` has and supplies the rest (greedy generate by
re-prefill, "unsupported" errors naming `HostDriven`, full prefill instead of
snapshot reuse, a no-op phase callback, no stats, no sessions). Probes such as
`supports_host_driven` narrow a runner's type when a capability is present.

Parameters of protocol methods are positional-only, so an implementation may
name them as it likes.

Every protocol is ``@runtime_checkable``. ``isinstance(obj, SupportsHostDriven)`` proves only
that ``obj`` has attributes of those names (on Python < 3.12 reading a property member, such
as ``family``, runs it): not that they are callable with these parameters, nor what they
return. The ``supports_*`` probes also check that methods are callable and that paired methods
come together; ``rlx_lm.testing`` (``rlx-lm check``) checks signatures and behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from os import PathLike
from typing import Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
from typing_extensions import TypeIs

from rlx_lm._core import argmax
from rlx_lm.errors import (
    DtypeError,
    InvalidLogitsError,
    InvalidOptionError,
    ShapeError,
    UnsupportedError,
)
from rlx_lm.session import SessionSnapshot

__all__ = [
    "FullLmRunner",
    "LmCore",
    "LmRunner",
    "Logits",
    "PhaseCallback",
    "RunnerAdapter",
    "SupportsBatchedDecode",
    "SupportsHostDriven",
    "SupportsKvStats",
    "SupportsMultimodal",
    "SupportsPromptCache",
    "as_logits",
    "greedy_generate",
    "supports_batched_decode",
    "supports_generate",
    "supports_host_driven",
    "supports_kv_stats",
    "supports_multimodal",
    "supports_prompt_cache",
    "with_defaults",
]

Logits = npt.NDArray[np.float32] | Sequence[float]
"""What a runner may return for one position: a float32 row, or any sequence of floats."""

PhaseCallback = Callable[[str], None]
"""Called with ``"vision"`` or ``"prefill"`` at multimodal phase boundaries."""

OnToken = Callable[[int], bool]


@runtime_checkable
class LmCore(Protocol):
    """Protocol: the three members every runner must have."""

    @property
    def family(self) -> str:
        """Short family identifier, e.g. ``"llama"``."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of logits per position."""
        ...

    def predict_logits(self, prompt_ids: Sequence[int], /) -> Logits:
        """Prefill ``prompt_ids`` from scratch and return the last position's logits."""
        ...


@runtime_checkable
class LmRunner(LmCore, Protocol):
    """Protocol: a runner callers hold — the core plus greedy generation."""

    def generate(
        self, prompt_ids: Sequence[int], n_new: int, on_token: OnToken | None = None, /
    ) -> list[int]:
        """Greedily produce up to ``n_new`` tokens; each is kept, then ``on_token`` False stops."""
        ...


@runtime_checkable
class SupportsHostDriven(Protocol):
    """Protocol: a cached decode pair, so the caller owns sampling."""

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> Logits:
        """Start a sequence from ``prompt_ids`` and return the last position's logits."""
        ...

    def decode_logits(self, token: int, /) -> Logits:
        """Append ``token`` to the current sequence and return the next position's logits."""
        ...


@runtime_checkable
class SupportsPromptCache(Protocol):
    """Protocol: session export/restore and prefill that reuses a cached prefix."""

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> Logits:
        """Prefill ``prompt_ids`` whose first ``reuse_len`` tokens ``snapshot`` already covers."""
        ...

    def export_session(self) -> SessionSnapshot | None:
        """Snapshot the current decode session, or None when unsupported."""
        ...

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        """Resume from ``snapshot``; True when it was applied."""
        ...


@runtime_checkable
class SupportsKvStats(Protocol):
    """Protocol: occupancy of a long-context KV store."""

    def kv_store_stats(self) -> tuple[int, int, int] | None:
        """``(blocks, tokens, disk_bytes)`` of the KV store, or None without one."""
        ...


@runtime_checkable
class SupportsMultimodal(Protocol):
    """Protocol: image+text generation with phase callbacks."""

    def set_multimodal_phase_callback(self, callback: PhaseCallback | None, /) -> None:
        """Register (or clear, with None) the phase-boundary callback."""
        ...

    def supports_multimodal(self) -> bool:
        """Whether image+text generation is available."""
        ...

    def generate_multimodal(
        self,
        prompt: str,
        rgb: bytes,
        img_w: int,
        img_h: int,
        tokenizer: str | PathLike[str] | None,
        n_new: int,
        on_token: OnToken | None = None,
        /,
    ) -> list[int]:
        """Generate from a text prompt whose image markers are filled from ``rgb``."""
        ...


@runtime_checkable
class SupportsBatchedDecode(Protocol):
    """Protocol: one decode step for B independent sequences in one call.

    A sequence is a `SessionSnapshot` (its KV state and tokens). ``decode_batch``
    appends ``tokens[i]`` to ``sessions[i]`` for every i and returns the logits of
    the new positions as a float32 array of shape ``(B, vocab_size)`` together
    with the advanced sessions, in order. The given sessions are values: they
    are not changed and stay usable (a snapshot is immutable). What the runner's
    own current session is afterwards is unspecified; restore one to continue
    with ``decode_logits``. Row i must equal what ``restore_session(sessions[i])``
    then ``decode_logits(tokens[i])`` gives, up to the engine's tolerance.

    A runner that has it runs the batch in one pass over the weights; for any
    other runner `RunnerAdapter.decode_batch` loops one sequence at a time.
    """

    def decode_batch(
        self, sessions: Sequence[SessionSnapshot], tokens: Sequence[int], /
    ) -> tuple[npt.NDArray[np.float32], list[SessionSnapshot]]:
        """Decode ``tokens[i]`` after ``sessions[i]``: logits ``(B, V)`` and the new sessions."""
        ...


@runtime_checkable
class FullLmRunner(
    LmRunner,
    SupportsHostDriven,
    SupportsPromptCache,
    SupportsKvStats,
    SupportsMultimodal,
    Protocol,
):
    """Protocol: the whole runner surface, as `RunnerAdapter` and `HostDriven` provide it."""


def _has_methods(obj: object, *names: str) -> bool:
    return all(callable(getattr(obj, name, None)) for name in names)


def supports_generate(runner: object) -> TypeIs[LmRunner]:
    """Whether ``runner`` has its own ``generate`` (and the core members)."""
    return _is_core(runner) and _has_methods(runner, "generate")


def supports_host_driven(runner: object) -> TypeIs[SupportsHostDriven]:
    """Whether ``runner`` has ``prefill_logits`` and ``decode_logits``."""
    return _has_methods(runner, "prefill_logits", "decode_logits")


def supports_prompt_cache(runner: object) -> TypeIs[SupportsPromptCache]:
    """Whether ``runner`` has prefill_logits_reusing, export_session and restore_session."""
    return _has_methods(runner, "prefill_logits_reusing", "export_session", "restore_session")


def supports_batched_decode(runner: object) -> TypeIs[SupportsBatchedDecode]:
    """Whether ``runner`` has its own ``decode_batch``."""
    return _has_methods(runner, "decode_batch")


def supports_kv_stats(runner: object) -> TypeIs[SupportsKvStats]:
    """Whether ``runner`` has ``kv_store_stats``."""
    return _has_methods(runner, "kv_store_stats")


def supports_multimodal(runner: object) -> TypeIs[SupportsMultimodal]:
    """Whether ``runner`` has the three multimodal members."""
    return _has_methods(
        runner, "set_multimodal_phase_callback", "supports_multimodal", "generate_multimodal"
    )


def _is_core(runner: object) -> bool:
    return (
        hasattr(runner, "family")
        and hasattr(runner, "vocab_size")
        and _has_methods(runner, "predict_logits")
    )


def as_logits(logits: object, vocab_size: int) -> npt.NDArray[np.float32]:
    """Validate one position's logits and return them as a contiguous float32 row.

    Accepts a numpy array of any float dtype or a sequence of numbers; a float32
    contiguous row is returned without copying. Raises `DtypeError` for
    non-numeric data, `ShapeError` unless the row is 1-D of length
    ``vocab_size``, and `InvalidLogitsError` for NaN or a finite value that
    overflows float32.
    """
    if isinstance(logits, np.ndarray):
        arr: npt.NDArray[np.generic] = logits
    else:
        try:
            arr = np.asarray(logits)
        except (TypeError, ValueError) as exc:
            raise DtypeError(
                f"logits must be a numpy array or a sequence of floats, got "
                f"{type(logits).__name__}: {exc}"
            ) from exc
    if arr.dtype.kind not in "fiu":
        raise DtypeError(
            f"logits must hold real numbers, got dtype {arr.dtype} (from {type(logits).__name__})"
        )
    if arr.ndim != 1 or arr.shape[0] != vocab_size:
        hint = " (take the last row with x[-1])" if arr.ndim == 2 else ""
        raise ShapeError(
            f"logits must be a 1-D row of length vocab_size={vocab_size}, got shape "
            f"{arr.shape}{hint}"
        )
    if arr.dtype == np.float32:
        row: npt.NDArray[np.float32] = np.ascontiguousarray(arr)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            row = np.ascontiguousarray(arr, dtype=np.float32)
        if row.size and np.isinf([row.min(), row.max()]).any():  # rare: look closer
            overflow = np.isinf(row) & ~np.isinf(arr.astype(np.float64))
            if overflow.any():
                pos = int(np.argmax(overflow))
                raise InvalidLogitsError(
                    f"logit at position {pos} ({arr[pos]!r}) overflows float32"
                )
    if row.size and np.isnan(row.max()):  # max propagates NaN; one pass, no temporary
        raise InvalidLogitsError(f"logits contain NaN at position {int(np.argmax(np.isnan(row)))}")
    return row


def greedy_generate(
    runner: LmCore, prompt_ids: Sequence[int], n_new: int, on_token: OnToken | None = None
) -> list[int]:
    """Greedy decoding by re-prefilling the whole context each step (quadratic, always correct)."""
    if n_new < 0:
        raise InvalidOptionError(f"n_new must be >= 0, got {n_new}")
    context = [int(t) for t in prompt_ids]
    produced: list[int] = []
    vocab = runner.vocab_size
    for _ in range(n_new):
        token = argmax(as_logits(runner.predict_logits(context), vocab))
        produced.append(token)
        context.append(token)
        if on_token is not None and not on_token(token):
            break
    return produced


def _unsupported(family: str, member: str, what: str) -> UnsupportedError:
    if member in ("prefill_logits", "decode_logits"):
        fix = (
            "wrap the runner in rlx_lm.HostDriven for a correct but slower version, "
            "or implement the family's cached prefill_logits/decode_logits pair"
        )
    else:
        fix = f"the runner has no {member} method"
    return UnsupportedError(f"{family}: {what} ({member}) unsupported; {fix}")


_R = TypeVar("_R", bound=LmCore)


class RunnerAdapter(Generic[_R]):
    """A runner with every optional member: forwards what ``inner`` has, supplies the defaults."""

    __slots__ = ("_inner",)

    def __init__(self, inner: _R) -> None:
        if not _is_core(inner):
            raise TypeError(
                f"{type(inner).__name__} is not a runner: it needs family, vocab_size "
                f"and predict_logits"
            )
        self._inner = inner

    def __repr__(self) -> str:
        return f"RunnerAdapter({self._inner!r})"

    @property
    def inner(self) -> _R:
        """The wrapped runner, for its own API."""
        return self._inner

    @property
    def family(self) -> str:
        """The inner runner's family."""
        return self._inner.family

    @property
    def vocab_size(self) -> int:
        """The inner runner's vocabulary size."""
        return self._inner.vocab_size

    def predict_logits(self, prompt_ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        """The inner runner's logits, validated."""
        return as_logits(self._inner.predict_logits(prompt_ids), self.vocab_size)

    def generate(
        self, prompt_ids: Sequence[int], n_new: int, on_token: OnToken | None = None, /
    ) -> list[int]:
        """The inner runner's own generate, else greedy decoding by re-prefill."""
        inner = self._inner
        probe: object = inner
        if supports_generate(probe):
            return [int(t) for t in probe.generate(prompt_ids, n_new, on_token)]
        return greedy_generate(inner, prompt_ids, n_new, on_token)

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        """The inner runner's cached prefill; `UnsupportedError` naming HostDriven without one."""
        inner: object = self._inner
        if not supports_host_driven(inner):
            raise _unsupported(self.family, "prefill_logits", "host-driven decode")
        return as_logits(inner.prefill_logits(prompt_ids), self.vocab_size)

    def decode_logits(self, token: int, /) -> npt.NDArray[np.float32]:
        """The inner runner's cached decode; `UnsupportedError` naming HostDriven without one."""
        inner: object = self._inner
        if not supports_host_driven(inner):
            raise _unsupported(self.family, "decode_logits", "host-driven decode")
        return as_logits(inner.decode_logits(token), self.vocab_size)

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> npt.NDArray[np.float32]:
        """Prefix-reusing prefill if the inner runner has it, else a full `prefill_logits`."""
        inner = self._inner
        reusing = getattr(inner, "prefill_logits_reusing", None)
        if callable(reusing):
            return as_logits(reusing(prompt_ids, snapshot, reuse_len), self.vocab_size)
        return self.prefill_logits(prompt_ids)

    def export_session(self) -> SessionSnapshot | None:
        """The inner runner's session snapshot, or None without support."""
        export = getattr(self._inner, "export_session", None)
        if not callable(export):
            return None
        snap = export()
        if snap is not None and not isinstance(snap, SessionSnapshot):
            raise TypeError(
                f"{self.family}: export_session returned {type(snap).__name__}, "
                f"expected SessionSnapshot or None"
            )
        return snap

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        """Restore through the inner runner; False without support."""
        restore = getattr(self._inner, "restore_session", None)
        if not callable(restore):
            return False
        return bool(restore(snapshot))

    def decode_batch(
        self, sessions: Sequence[SessionSnapshot], tokens: Sequence[int], /
    ) -> tuple[npt.NDArray[np.float32], list[SessionSnapshot]]:
        """The inner runner's batched decode, else one sequence at a time.

        The loop restores each session, decodes its token and exports the result
        (runners with sessions), or re-prefills ``session.tokens + [token]`` and
        returns a token-only `SessionSnapshot` (``kv=None``) for runners without.
        """
        if len(sessions) != len(tokens):
            raise ShapeError(
                f"decode_batch needs one token per session, got {len(sessions)} sessions "
                f"and {len(tokens)} tokens"
            )
        vocab = self.vocab_size
        inner: object = self._inner
        if supports_batched_decode(inner):
            logits, advanced = inner.decode_batch(sessions, tokens)
            rows = np.asarray(logits)
            if rows.shape != (len(tokens), vocab):
                raise ShapeError(
                    f"{self.family}: decode_batch returned logits of shape {rows.shape}, "
                    f"expected {(len(tokens), vocab)}"
                )
            advanced = list(advanced)
            if len(advanced) != len(tokens):
                raise ShapeError(
                    f"{self.family}: decode_batch returned {len(advanced)} sessions for "
                    f"{len(tokens)} tokens"
                )
            return np.ascontiguousarray(rows, dtype=np.float32), advanced
        out = np.empty((len(tokens), vocab), dtype=np.float32)
        new_sessions: list[SessionSnapshot] = []
        cached = supports_prompt_cache(inner) and supports_host_driven(inner)
        for i, (session, token) in enumerate(zip(sessions, tokens, strict=True)):
            if cached and session.kv is not None and self.restore_session(session):
                out[i] = self.decode_logits(int(token))
                snap = self.export_session()
                if snap is None:
                    raise UnsupportedError(
                        f"{self.family}: export_session returned None after a restore"
                    )
                new_sessions.append(snap)
            else:
                context = [*session.tokens, int(token)]
                out[i] = self.predict_logits(context)
                new_sessions.append(SessionSnapshot(None, context, session.fingerprint))
        return out, new_sessions

    def kv_store_stats(self) -> tuple[int, int, int] | None:
        """The inner runner's KV-store occupancy, or None without a store."""
        stats = getattr(self._inner, "kv_store_stats", None)
        if not callable(stats):
            return None
        value = stats()
        if value is None:
            return None
        blocks, tokens, disk = value
        return int(blocks), int(tokens), int(disk)

    def set_multimodal_phase_callback(self, callback: PhaseCallback | None, /) -> None:
        """Forward to the inner runner; a no-op for text-only runners."""
        setter = getattr(self._inner, "set_multimodal_phase_callback", None)
        if callable(setter):
            setter(callback)

    def supports_multimodal(self) -> bool:
        """The inner runner's answer; False when it does not say."""
        probe = getattr(self._inner, "supports_multimodal", None)
        return bool(probe()) if callable(probe) else False

    def generate_multimodal(
        self,
        prompt: str,
        rgb: bytes,
        img_w: int,
        img_h: int,
        tokenizer: str | PathLike[str] | None,
        n_new: int,
        on_token: OnToken | None = None,
        /,
    ) -> list[int]:
        """The inner runner's multimodal generation; `UnsupportedError` without it."""
        inner: object = self._inner
        if not supports_multimodal(inner):
            raise _unsupported(self.family, "generate_multimodal", "multimodal generation")
        return [
            int(t)
            for t in inner.generate_multimodal(
                prompt, rgb, img_w, img_h, tokenizer, n_new, on_token
            )
        ]


def with_defaults(runner: _R) -> RunnerAdapter[_R]:
    """Wrap ``runner`` so every optional member exists, with the documented defaults."""
    return RunnerAdapter(runner)
