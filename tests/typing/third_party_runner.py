"""A third-party runner that type-checks as an rlx_lm runner without importing rlx_lm.

Checked by ``mypy --strict`` (``make lint`` and tests/test_typing.py), never run.
The classes import and subclass nothing from rlx_lm; only the usage at the
bottom does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt


class CoreOnly:
    """The minimum: a plain attribute for family, a property for vocab_size, a list of logits."""

    family = "core-only"

    @property
    def vocab_size(self) -> int:
        return 4

    def predict_logits(self, ids: Sequence[int]) -> list[float]:
        return [float(len(ids) % 4 == i) for i in range(4)]


class ThirdPartyRunner:
    """Core plus generate and a cached pair, with its own parameter names."""

    def __init__(self) -> None:
        self.family = "third-party"
        self.vocab_size = 8
        self._last = 0

    def predict_logits(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        row = np.zeros(self.vocab_size, np.float32)
        row[(tokens[-1] + 1) % self.vocab_size] = 1.0
        return row

    def generate(
        self,
        tokens: Sequence[int],
        count: int,
        callback: Callable[[int], bool] | None = None,
    ) -> list[int]:
        out: list[int] = []
        context = list(tokens)
        for _ in range(count):
            out.append(int(np.argmax(self.predict_logits(context))))
            context.append(out[-1])
            if callback is not None and not callback(out[-1]):
                break
        return out

    def prefill_logits(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        self._last = tokens[-1]
        return self.predict_logits(tokens)

    def decode_logits(self, token: int) -> npt.NDArray[np.float32]:
        self._last = token
        return self.predict_logits([token])

    def kv_store_stats(self) -> None:
        return None


# -- usage: the only part that knows rlx_lm ---------------------------------------------

import rlx_lm  # noqa: E402


def takes_runner(runner: rlx_lm.LmRunner) -> list[int]:
    return runner.generate([1, 2], 3)


def takes_core(runner: rlx_lm.LmCore) -> int:
    return runner.vocab_size


def serve(runner: rlx_lm.FullLmRunner) -> npt.NDArray[np.float32] | Sequence[float]:
    return runner.prefill_logits([1])


takes_runner(ThirdPartyRunner())
takes_core(CoreOnly())
pair: rlx_lm.SupportsHostDriven = ThirdPartyRunner()
stats: rlx_lm.SupportsKvStats = ThirdPartyRunner()

wrapped: rlx_lm.HostDriven[ThirdPartyRunner] = rlx_lm.HostDriven(ThirdPartyRunner())
inner: ThirdPartyRunner = wrapped.inner
takes_runner(wrapped)
serve(wrapped)
serve(rlx_lm.HostDriven(CoreOnly()))
serve(rlx_lm.with_defaults(CoreOnly()))
fell_back: bool = wrapped.fell_back()


def narrow(runner: rlx_lm.LmRunner) -> None:
    if rlx_lm.supports_host_driven(runner):
        runner.decode_logits(1)
        runner.generate([1], 1)


@rlx_lm.register_model("third-party", "typing check", matches=rlx_lm.match_architectures("tp"))
def load(builder: rlx_lm.LmRunnerBuilder) -> ThirdPartyRunner:
    assert builder.max_seq() > 0
    return ThirdPartyRunner()


registration = rlx_lm.ModelRegistration("core-only", "", lambda arch, path: True, load)
built: rlx_lm.LmCore = rlx_lm.LmRunnerBuilder().weights("m.gguf").max_seq(64).build()
