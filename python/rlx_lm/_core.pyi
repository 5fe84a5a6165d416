"""Types of the compiled module `rlx_lm._core`; import public names from `rlx_lm`."""

from typing import Final

import numpy as np
import numpy.typing as npt

__version__: Final[str]
build_profile: Final[str]

def argmax(logits: npt.NDArray[np.float32], /) -> int:
    """Index of the largest logit in a float32 row (lowest index on ties)."""
