"""rlx_lm on Ray: batch generation over Ray Data, and the OpenAI server as Ray Serve replicas.

Needs the optional extra ``rlx-lm[ray]``. Importing this package does not start
or connect to a cluster; the first Ray call does (``ray.init()`` to choose one).

    generate(dataset, model=..., opts=...)   a Dataset of prompts -> a Dataset of results
"""

from __future__ import annotations

from rlx_lm.ray.batch import generate, row_sequence_id

__all__ = ["generate", "row_sequence_id"]
