"""A third-party model family for rlx_lm, used by rlx_lm's tests as a real plugin.

`ToyRunner` (in ``runner.py``) imports nothing from rlx_lm: it meets the runner
protocol by shape alone. ``registration.py`` is the only module that knows about
rlx_lm; the package's ``rlx_lm.runners`` entry point names its `REGISTRATION`.
"""

from rlx_toy_runner.runner import ARCHITECTURE, ToyRunner, write_toy_gguf

__all__ = ["ARCHITECTURE", "ToyRunner", "write_toy_gguf"]
