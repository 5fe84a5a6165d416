"""HostDriven: a prefill/decode pair for any runner, on its cached pair or by re-prefill.

A server samples for itself, so it needs ``prefill_logits`` and ``decode_logits``.
Families without a cached pair still have ``predict_logits``; `HostDriven` turns
that into the pair by re-running the whole context for every token. That is
quadratic over a generation, so it is used only when the inner runner has no pair.

Two rules keep it honest:

* It falls back only when the inner runner says the pair is unsupported: the
  members are missing, or they raise `NotImplementedError` (which
  `rlx_lm.UnsupportedError` subclasses). Any other error propagates.
* The path is chosen when a sequence starts (at ``prefill_logits``) and kept
  until the next prefill: a sequence that fell back never calls the inner
  ``decode_logits``, whose cache would not hold the prompt. A prefill that
  fails ends the previous sequence too, since the inner cache may have changed.
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Sequence
from os import PathLike
from typing import Generic, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from rlx_lm.errors import SequenceStateError, TokenOutOfRangeError, UnsupportedError
from rlx_lm.runner import (
    LmCore,
    OnToken,
    PhaseCallback,
    RunnerAdapter,
    as_logits,
    supports_host_driven,
)
from rlx_lm.session import SessionSnapshot

__all__ = ["WARN_ENV", "HostDriven"]

WARN_ENV = "RLX_WARN_SLOW_DECODE"
"""Set this environment variable to have `HostDriven` say on stderr when it falls back."""

_R = TypeVar("_R", bound=LmCore)
_Path = Literal["inner", "fallback"]


class HostDriven(Generic[_R]):
    """A runner whose prefill/decode pair always works, falling back to re-prefill."""

    __slots__ = ("_adapter", "_context", "_fell_back", "_inner", "_path", "_warned")

    def __init__(self, inner: _R) -> None:
        self._adapter = RunnerAdapter(inner)
        self._inner = inner
        self._context: list[int] = []
        self._path: _Path | None = None
        self._fell_back = False
        self._warned = False

    def __repr__(self) -> str:
        return f"HostDriven({self._inner!r})"

    @property
    def inner(self) -> _R:
        """The wrapped runner, for its own API."""
        return self._inner

    def fell_back(self) -> bool:
        """Whether the slow re-prefill path has been taken (the inner runner has no cached pair)."""
        return self._fell_back

    @property
    def context(self) -> tuple[int, ...]:
        """The tokens of the current sequence (prompt plus decoded tokens); empty before prefill."""
        return tuple(self._context)

    # -- the host-driven pair -------------------------------------------------

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        """Start a sequence: the inner cached prefill if it has one, else a full predict."""
        prompt = self._checked(prompt_ids)
        # Whatever happens below, the previous sequence is over: the inner
        # runner's cache may already hold part of the new prompt.
        self._start([], None)
        inner: object = self._inner
        if supports_host_driven(inner):
            try:
                raw = inner.prefill_logits(prompt)
            except NotImplementedError:
                pass
            else:
                # The inner cache now holds this prompt, whether or not its logits are valid.
                self._start(prompt, "inner")
                return as_logits(raw, self.vocab_size)
        logits = self._adapter.predict_logits(prompt)
        self._start(prompt, "fallback")
        self._note_fallback()
        return logits

    def decode_logits(self, token: int, /) -> npt.NDArray[np.float32]:
        """Append ``token`` and return the next logits, on the path the sequence started on."""
        if self._path is None:
            raise SequenceStateError(
                f"{self.family}: decode_logits before prefill_logits; there is no sequence "
                f"to continue"
            )
        (tok,) = self._checked([token])
        if self._path == "inner":
            inner: object = self._inner
            assert supports_host_driven(inner)
            try:
                raw = inner.decode_logits(tok)
            except NotImplementedError as exc:
                raise UnsupportedError(
                    f"{self.family}: prefill_logits worked but decode_logits is unsupported; "
                    f"HostDriven does not switch paths in the middle of a sequence"
                ) from exc
            self._context.append(tok)  # the inner cache has taken the token
            return as_logits(raw, self.vocab_size)
        logits = self._adapter.predict_logits([*self._context, tok])
        self._context.append(tok)
        return logits

    def _checked(self, tokens: Sequence[int]) -> list[int]:
        ids = [operator.index(t) for t in tokens]
        vocab = self.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise TokenOutOfRangeError(f"token {t} is outside the vocabulary 0..{vocab}")
        return ids

    def _start(self, prompt: list[int], path: _Path | None) -> None:
        self._context = prompt
        self._path = path

    def _note_fallback(self) -> None:
        self._fell_back = True
        if not self._warned and os.environ.get(WARN_ENV) is not None:
            self._warned = True
            print(
                f"[rlx_lm] {self.family}: runner has no cached prefill/decode pair; HostDriven "
                f"re-runs the whole context for every token (quadratic in sequence length)",
                file=sys.stderr,
            )

    # -- everything else is the inner runner's, with the adapter's defaults --

    @property
    def family(self) -> str:
        """The inner runner's family."""
        return self._adapter.family

    @property
    def vocab_size(self) -> int:
        """The inner runner's vocabulary size."""
        return self._adapter.vocab_size

    def predict_logits(self, prompt_ids: Sequence[int], /) -> npt.NDArray[np.float32]:
        """The inner runner's stateless prefill."""
        return self._adapter.predict_logits(prompt_ids)

    def generate(
        self, prompt_ids: Sequence[int], n_new: int, on_token: OnToken | None = None, /
    ) -> list[int]:
        """The inner runner's own greedy generate (or the re-prefill default)."""
        return self._adapter.generate(prompt_ids, n_new, on_token)

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> npt.NDArray[np.float32]:
        """The inner runner's prefix-reusing prefill, else a plain `prefill_logits` here."""
        if callable(getattr(self._inner, "prefill_logits_reusing", None)):
            prompt = self._checked(prompt_ids)
            self._start([], None)
            try:
                logits = self._adapter.prefill_logits_reusing(prompt, snapshot, reuse_len)
            except NotImplementedError:
                pass
            else:
                self._start(prompt, "inner")
                return logits
        return self.prefill_logits(prompt_ids)

    def export_session(self) -> SessionSnapshot | None:
        """The inner runner's session snapshot, or None."""
        return self._adapter.export_session()

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        """Restore through the inner runner; False without support."""
        return self._adapter.restore_session(snapshot)

    def kv_store_stats(self) -> tuple[int, int, int] | None:
        """The inner runner's KV-store occupancy, or None."""
        return self._adapter.kv_store_stats()

    def set_multimodal_phase_callback(self, callback: PhaseCallback | None, /) -> None:
        """Forward to the inner runner; a no-op for text-only runners."""
        self._adapter.set_multimodal_phase_callback(callback)

    def supports_multimodal(self) -> bool:
        """The inner runner's answer; False when it does not say."""
        return self._adapter.supports_multimodal()

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
        return self._adapter.generate_multimodal(
            prompt, rgb, img_w, img_h, tokenizer, n_new, on_token
        )
