"""Deterministic toy runners for the protocol and HostDriven tests.

None of them imports rlx_lm: they stand in for third-party runners, which get
nothing from us but the protocol's shape. Their logits are a pure function of
the context, so every way of decoding greedily must produce the same tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt


def sum_rule_logits(context: Sequence[int], vocab: int) -> list[float]:
    """One-hot at ``(sum(context) + len(context)) % vocab``: the argmax moves with the context."""
    row = [0.0] * vocab
    row[(sum(context) + len(context)) % vocab] = 1.0
    return row


def hashed_logits(context: Sequence[int], vocab: int, seed: int) -> npt.NDArray[np.float32]:
    """Pseudo-random normal logits keyed by the whole context and ``seed``."""
    key = hashlib.blake2b(np.asarray(context, np.int64).tobytes(), key=seed.to_bytes(8, "little"))
    rng = np.random.default_rng(int.from_bytes(key.digest()[:8], "little"))
    return rng.standard_normal(vocab).astype(np.float32)


class NoPair:
    """Only the core: family, vocab_size, predict_logits (returns a Python list)."""

    family = "nopair"

    def __init__(self, vocab: int = 16, rule: Callable[[Sequence[int]], object] | None = None):
        self.vocab_size = vocab
        self.rule = rule or (lambda ctx: sum_rule_logits(ctx, vocab))
        self.calls: list[tuple[int, ...]] = []

    def predict_logits(self, prompt_ids: Sequence[int]) -> object:
        self.calls.append(tuple(prompt_ids))
        return self.rule(prompt_ids)


class HasPair(NoPair):
    """A correct cached pair: decode continues the sequence prefill started."""

    family = "haspair"

    def __init__(self, vocab: int = 16, rule: Callable[[Sequence[int]], object] | None = None):
        super().__init__(vocab, rule)
        self.context: list[int] = []
        self.prefills = 0
        self.decodes = 0

    def prefill_logits(self, prompt_ids: Sequence[int]) -> object:
        self.prefills += 1
        self.context = list(prompt_ids)
        return self.rule(self.context)

    def decode_logits(self, token: int) -> object:
        self.decodes += 1
        self.context.append(token)
        return self.rule(self.context)


class OwnGenerate(NoPair):
    """A core runner with its own greedy generate (counting calls)."""

    def __init__(self, vocab: int = 16) -> None:
        super().__init__(vocab)
        self.generate_calls = 0

    def generate(
        self,
        prompt_ids: Sequence[int],
        n_new: int,
        on_token: Callable[[int], bool] | None = None,
    ) -> list[int]:
        self.generate_calls += 1
        context = list(prompt_ids)
        out: list[int] = []
        for _ in range(n_new):
            token = int(np.argmax(np.asarray(self.predict_logits(context))))
            out.append(token)
            context.append(token)
            if on_token is not None and not on_token(token):
                break
        return out
