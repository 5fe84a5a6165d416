"""A runner with a wrong signature: ``mypy --strict`` must reject passing it as an LmRunner.

Checked by tests/test_typing.py, which expects an ``arg-type`` error naming
``predict_logits``; never run, and not part of ``make lint``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import rlx_lm


class WrongSignature:
    family = "wrong"
    vocab_size = 4

    def predict_logits(self, prompt: str) -> list[float]:  # takes text, not token ids
        return [0.0] * 4

    def generate(
        self, ids: Sequence[int], n: int, on_token: Callable[[int], bool] | None = None
    ) -> list[int]:
        return []


def takes_runner(runner: rlx_lm.LmRunner) -> None:
    runner.predict_logits([1])


takes_runner(WrongSignature())
