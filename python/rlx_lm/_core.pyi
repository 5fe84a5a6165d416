"""Types of the compiled module `rlx_lm._core`; import public names from `rlx_lm`."""

from collections.abc import Sequence
from typing import Any, Final, Literal, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

__version__: Final[str]
build_profile: Final[str]

def argmax(logits: npt.NDArray[np.float32], /) -> int:
    """Index of the largest logit in a float32 row (lowest index on ties)."""

# --- sampler chain (rust/py/sampling.rs) ------------------------------------

_History = Sequence[int] | npt.NDArray[np.integer[Any]] | None

@final
class SampleResult:
    """A sampled token with its log-probability and the most likely alternatives."""

    @property
    def token(self) -> int:
        """The sampled token id."""
    @property
    def logprob(self) -> float:
        """Its natural-log probability under the chosen distribution."""
    @property
    def top(self) -> list[tuple[int, float]]:
        """The `top_n` most likely tokens as (token, logprob), best first."""
    @property
    def mode(self) -> Literal["raw", "penalized", "final"]:
        """Which distribution the log-probabilities describe."""

@final
class SamplerChain:
    """A sampler chain built from `SampleOpts`: stages, order and per-sequence state."""

    def __init__(
        self, opts: Any, order: str | Sequence[str] | None = None, sequence_id: int = 0
    ) -> None: ...
    def sample(
        self,
        logits: npt.NDArray[np.float32],
        history: _History = None,
        *,
        uniform: float | None = None,
    ) -> int:
        """Sample one token from a float32 logits row given the history so far."""
    def sample_with_logprobs(
        self,
        logits: npt.NDArray[np.float32],
        history: _History = None,
        top_n: int = 0,
        *,
        mode: Literal["raw", "penalized", "final"] = "raw",
        uniform: float | None = None,
    ) -> SampleResult:
        """Sample one token and report log-probabilities under `mode`'s distribution."""
    def sample_batch(
        self,
        logits: npt.NDArray[np.float32],
        histories: Sequence[_History] | None = None,
        *,
        sequence_ids: Sequence[int] | None = None,
        uniforms: Sequence[float] | None = None,
    ) -> npt.NDArray[np.int64]:
        """Sample every row of a 2-D float32 array (rows in parallel, GIL released)."""
    def accept(self, token: int, /) -> None:
        """Record the emitted token: advances the step and mirostat's mu."""
    def reset(self) -> None:
        """Return to step 0 and the initial mirostat mu (same seed, same tokens)."""
    def clone(self) -> Self:
        """An independent copy with the same knobs, seed and state."""
    def __copy__(self) -> Self: ...
    def __deepcopy__(self, memo: dict[int, Any], /) -> Self: ...
    @property
    def step(self) -> int:
        """Tokens accepted since construction or the last reset."""
    @property
    def seed(self) -> int:
        """The seed of the draw (chosen at random when the options had none)."""
    @property
    def sequence_id(self) -> int:
        """The sequence id keyed into the draw."""
    @property
    def mu(self) -> float | None:
        """Mirostat's current mu, or None without mirostat."""
    @property
    def stages(self) -> list[str]:
        """The stages that run, in order, ending with the selector."""
    @property
    def order(self) -> str:
        """The order's name: "default", a preset, or "custom"."""
    @property
    def is_greedy(self) -> bool:
        """Whether the chain is a plain argmax (no RNG)."""
