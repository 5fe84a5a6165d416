"""The toy family's registration: the one module of this package that imports rlx_lm."""

from __future__ import annotations

from rlx_lm import LmRunnerBuilder, ModelRegistration, match_architectures
from rlx_toy_runner.runner import ARCHITECTURE, ToyRunner


def load(builder: LmRunnerBuilder) -> ToyRunner:
    """Build a `ToyRunner` from the resolved weights path and max_seq."""
    path = builder.weights()
    if path is None:  # build() always resolves it; a direct call might not
        raise ValueError("ToyRunner needs a weights path")
    return ToyRunner(path, max_seq=builder.max_seq())


REGISTRATION = ModelRegistration(
    family=ARCHITECTURE,
    description="bigram toy runner (examples/third_party_runner)",
    matches=match_architectures(ARCHITECTURE),
    load=load,
)
