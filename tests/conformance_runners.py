"""Runners for the conformance kit's own tests: a correct toy, and broken ones with one defect each.

The toy is a tiny deterministic "model": its state after each token is a hash chain over
the context (the KV cache is the list of those states), and its logits are pseudo-random
normals seeded by the last state, so any wrong context gives visibly different logits.
It uses nothing from rlx_lm but the snapshot types a session must return.

Each broken runner overrides one member of `ToyRunner` with a realistic bug; the kit's
tests check that exactly the clause named in `DEFECTS` reports it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rlx_lm import ModelFingerprint, SessionSnapshot, SnapshotMismatchError

VOCAB = 32
ROOT = 0x9E3779B97F4A7C15  # state of the empty context

Row = npt.NDArray[np.float32]


def step(state: int, token: int) -> int:
    """The toy's state after appending ``token``."""
    digest = hashlib.blake2b(struct.pack("<QQ", state, token), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def logits_at(state: int, vocab: int) -> Row:
    """The toy's logits in ``state``: pseudo-random normals (scaled so argmax ties are rare)."""
    return (np.random.default_rng(state).standard_normal(vocab) * 4).astype(np.float32)


def states(tokens: Sequence[int], start: int = ROOT) -> list[int]:
    """The state after each token of ``tokens``."""
    out, state = [], start
    for t in tokens:
        state = step(state, t)
        out.append(state)
    return out


class ToyRunner:
    """A correct runner with every capability: cached pair, sessions, multimodal."""

    family = "toy"

    def __init__(self, vocab: int = VOCAB) -> None:
        self.vocab_size = vocab
        self.kv: list[int] = []
        self.tokens: list[int] = []
        self.started = False
        self.phase_cb: Callable[[str], None] | None = None

    def _check(self, tokens: Sequence[int]) -> list[int]:
        ids = [int(t) for t in tokens]
        if not ids:
            raise ValueError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise IndexError(f"tokens {bad} outside the vocabulary")
        return ids

    def _fingerprint(self) -> ModelFingerprint:
        return ModelFingerprint(self.family, (self.vocab_size,), "toy-v1")

    def _logits(self, state: int) -> Any:
        return logits_at(state, self.vocab_size)

    # core
    def predict_logits(self, prompt_ids: Sequence[int], /) -> Any:
        return self._logits(states(self._check(prompt_ids))[-1])

    def generate(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        context, out = self._check(prompt_ids), []
        for _ in range(n_new):
            token = int(np.argmax(np.asarray(self.predict_logits(context))))
            out.append(token)
            context.append(token)
            if on_token is not None and not on_token(token):
                break
        return out

    # host-driven pair
    def prefill_logits(self, prompt_ids: Sequence[int], /) -> Any:
        ids = self._check(prompt_ids)
        self.kv, self.tokens, self.started = states(ids), ids, True
        return self._logits(self.kv[-1])

    def decode_logits(self, token: int, /) -> Any:
        if not self.started:
            raise RuntimeError("decode_logits before prefill_logits")
        self._check([token])
        self.kv.append(step(self.kv[-1], token))
        self.tokens.append(token)
        return self._logits(self.kv[-1])

    # sessions
    def export_session(self) -> SessionSnapshot | None:
        if not self.started:
            return None
        return SessionSnapshot(tuple(self.kv), self.tokens, self._fingerprint())

    def _accept(self, snap: SessionSnapshot) -> None:
        if snap.fingerprint != self._fingerprint():
            raise SnapshotMismatchError(
                f"snapshot of {snap.fingerprint} cannot be restored into {self._fingerprint()}"
            )

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        self._accept(snapshot)
        self.kv, self.tokens, self.started = list(snapshot.kv), list(snapshot.tokens), True
        return True

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> Any:
        ids = self._check(prompt_ids)
        self._accept(snapshot)
        if not 0 <= reuse_len < len(ids) or list(snapshot.tokens[:reuse_len]) != ids[:reuse_len]:
            raise ValueError(f"the snapshot does not cover the first {reuse_len} prompt tokens")
        kv = list(snapshot.kv[:reuse_len])
        kv += states(ids[reuse_len:], kv[-1] if kv else ROOT)
        self.kv, self.tokens, self.started = kv, ids, True
        return self._logits(kv[-1])

    def kv_store_stats(self) -> tuple[int, int, int] | None:
        return None

    # multimodal
    def set_multimodal_phase_callback(self, callback: Callable[[str], None] | None, /) -> None:
        self.phase_cb = callback

    def supports_multimodal(self) -> bool:
        return True

    def _phase(self, name: str) -> None:
        if self.phase_cb is not None:
            self.phase_cb(name)

    def generate_multimodal(
        self,
        prompt: str,
        rgb: bytes,
        img_w: int,
        img_h: int,
        tokenizer: object,
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        self._phase("vision")
        image_token = int.from_bytes(hashlib.blake2b(rgb, digest_size=4).digest(), "little")
        ids = [b % self.vocab_size for b in prompt.encode()] + [image_token % self.vocab_size]
        self._phase("prefill")
        return self.generate(ids, n_new, on_token)


class CoreOnly:
    """Only the three required members, returning plain lists: everything else is defaulted."""

    family = "core-only"
    vocab_size = VOCAB

    def predict_logits(self, tokens: Sequence[int], /) -> list[float]:
        return [float(x) for x in logits_at(states(tokens)[-1], VOCAB)]


# -- one defect each --------------------------------------------------------------------


class OffByOneDecode(ToyRunner):
    """decode_logits returns the logits from before the token is appended."""

    def decode_logits(self, token: int, /) -> Any:
        if not self.started:
            raise RuntimeError("decode_logits before prefill_logits")
        before = self._logits(self.kv[-1])
        self.kv.append(step(self.kv[-1], token))
        self.tokens.append(token)
        return before


class WrongLength(ToyRunner):
    """A truncated LM head: every row is one logit short."""

    def _logits(self, state: int) -> Any:
        return logits_at(state, self.vocab_size)[:-1]


class NonDeterministic(ToyRunner):
    """predict_logits adds fresh noise on every call."""

    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__(vocab)
        self.noise = np.random.default_rng()

    def predict_logits(self, prompt_ids: Sequence[int], /) -> Any:
        row = super().predict_logits(prompt_ids)
        return row + self.noise.normal(0, 0.5, row.shape).astype(np.float32)


class DropsStopToken(ToyRunner):
    """generate asks on_token first and drops the token it was told to stop on."""

    def generate(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        context, out = self._check(prompt_ids), []
        for _ in range(n_new):
            token = int(np.argmax(self.predict_logits(context)))
            if on_token is not None and not on_token(token):
                break
            out.append(token)
            context.append(token)
        return out


class SharedSnapshot(ToyRunner):
    """export_session hands out the live KV list, so decoding afterwards changes the snapshot."""

    def export_session(self) -> SessionSnapshot | None:
        if not self.started:
            return None
        snap = SessionSnapshot(self.kv, self.tokens, self._fingerprint())
        object.__setattr__(snap, "kv", self.kv)  # the defect: no copy
        return snap


class IgnoresSuffix(ToyRunner):
    """prefill_logits_reusing restores the prefix and never processes the rest of the prompt."""

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> Any:
        ids = self._check(prompt_ids)
        self._accept(snapshot)
        self.kv = list(snapshot.kv[:reuse_len]) or [ROOT]
        self.tokens, self.started = ids, True
        return self._logits(self.kv[-1])


class BadSignature(ToyRunner):
    """decode_logits takes no token."""

    def decode_logits(self) -> Any:  # type: ignore[override]
        return self._logits(self.kv[-1])


class EmptyFamily(ToyRunner):
    """family is the empty string."""

    family = ""


class FamilyMethod(ToyRunner):
    """family is a method, as in the seed's Rust trait, instead of a str."""

    def family(self) -> str:  # type: ignore[override]
        return "toy"


class ZeroVocab(ToyRunner):
    """vocab_size is 0."""

    def __init__(self) -> None:
        super().__init__()
        self.vocab_size = 0


class Float64Logits(ToyRunner):
    """predict_logits returns a float64 array."""

    def predict_logits(self, prompt_ids: Sequence[int], /) -> Any:
        return np.asarray(super().predict_logits(prompt_ids), np.float64)


class ReusedBuffer(ToyRunner):
    """predict_logits returns one buffer that every call overwrites."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = np.zeros(self.vocab_size, np.float32)

    def predict_logits(self, prompt_ids: Sequence[int], /) -> Any:
        self.buffer[:] = super().predict_logits(prompt_ids)
        return self.buffer


class DecodeWithoutPrefill(ToyRunner):
    """decode_logits on a fresh runner decodes from the empty context instead of raising."""

    def decode_logits(self, token: int, /) -> Any:
        if not self.started:
            self.kv, self.started = [ROOT], True
        return super().decode_logits(token)


class AcceptsForeign(ToyRunner):
    """restore_session never checks the snapshot's fingerprint."""

    def _accept(self, snap: SessionSnapshot) -> None:
        pass


class RestoreShares(ToyRunner):
    """restore_session adopts the snapshot's KV list, so decoding after it edits the snapshot."""

    def export_session(self) -> SessionSnapshot | None:
        snap = super().export_session()
        if snap is not None:
            object.__setattr__(snap, "kv", list(snap.kv))
        return snap

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        self._accept(snapshot)
        self.kv, self.tokens, self.started = snapshot.kv, list(snapshot.tokens), True
        return True


class PhasesOutOfOrder(ToyRunner):
    """The phase callback fires 'prefill' before 'vision'."""

    def _phase(self, name: str) -> None:
        super()._phase({"vision": "prefill", "prefill": "vision"}[name])


class NegInfLogit(ToyRunner):
    """A padded LM head whose last logit is always -inf."""

    def _logits(self, state: int) -> Any:
        row = logits_at(state, self.vocab_size)
        row[-1] = -np.inf
        return row


class IgnoresStop(ToyRunner):
    """generate calls on_token but never stops when it returns False."""

    def generate(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
        /,
    ) -> list[int]:
        out = super().generate(prompt_ids, n_new, None)
        for t in out:
            if on_token is not None:
                on_token(t)
        return out


class PrefillKeepsOldContext(ToyRunner):
    """prefill_logits continues the previous sequence instead of starting a new one."""

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> Any:
        ids = self._check(prompt_ids)
        self.kv = self.kv + states(ids, self.kv[-1] if self.kv else ROOT)
        self.tokens, self.started = self.tokens + ids, True
        return self._logits(self.kv[-1])


class RestoreReturnsNone(ToyRunner):
    """restore_session applies the snapshot but returns None instead of True."""

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        super().restore_session(snapshot)
        return None  # type: ignore[return-value]


class ClobbersBeforeCheck(ToyRunner):
    """restore_session overwrites the live session before it checks the fingerprint."""

    def restore_session(self, snapshot: SessionSnapshot, /) -> bool:
        self.kv, self.tokens = list(snapshot.kv), list(snapshot.tokens)
        return super().restore_session(snapshot)


class NeverClears(ToyRunner):
    """set_multimodal_phase_callback(None) leaves the old callback in place."""

    def set_multimodal_phase_callback(self, callback: Callable[[str], None] | None, /) -> None:
        if callback is not None:
            self.phase_cb = callback


class NoPhases(ToyRunner):
    """The phase callback is stored but never fired."""

    def _phase(self, name: str) -> None:
        pass


DEFECTS: dict[str, tuple[type, str]] = {
    # the list
    "off-by-one context in decode": (OffByOneDecode, "host_driven.decode"),
    "logits of the wrong length": (WrongLength, "logits.row"),
    "non-deterministic predict": (NonDeterministic, "logits.deterministic"),
    "generate drops the stopping token": (DropsStopToken, "greedy.stop"),
    "snapshot shares state with the live session": (SharedSnapshot, "sessions.roundtrip"),
    "prefill_logits_reusing ignores the suffix": (IgnoresSuffix, "sessions.reuse"),
    # one per remaining clause
    "decode_logits without its token parameter": (BadSignature, "structure.members"),
    "empty family": (EmptyFamily, "structure.family"),
    "family is a method": (FamilyMethod, "structure.family"),
    "zero vocab_size": (ZeroVocab, "structure.vocab_size"),
    "float64 logits": (Float64Logits, "logits.row"),
    "logits in a reused buffer": (ReusedBuffer, "logits.deterministic"),
    "decode before prefill returns logits": (
        DecodeWithoutPrefill,
        "host_driven.decode_before_prefill",
    ),
    "restore accepts a foreign snapshot": (AcceptsForeign, "sessions.foreign"),
    "restore shares state with the snapshot": (RestoreShares, "sessions.roundtrip"),
    "phase callback out of order": (PhasesOutOfOrder, "multimodal.phases"),
    "a -inf logit": (NegInfLogit, "logits.row"),
    "generate ignores on_token's stop": (IgnoresStop, "greedy.stop"),
    "prefill continues the old sequence": (PrefillKeepsOldContext, "host_driven.prefill"),
    "restore_session returns None": (RestoreReturnsNone, "sessions.roundtrip"),
    "a refused restore clobbers the session": (ClobbersBeforeCheck, "sessions.foreign"),
    "a None phase callback does not clear": (NeverClears, "multimodal.phases"),
    "the phase callback never fires": (NoPhases, "multimodal.phases"),
}
"""Defect -> (runner class, the clause that must report it)."""
