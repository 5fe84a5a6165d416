"""The kit accepts the reference design's own generate signature and says when a clause is moot."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from conformance_runners import ToyRunner

from rlx_lm.session import SessionSnapshot
from rlx_lm.testing import check_runner

FAST = {"max_examples": 10}


class SeedSignature(ToyRunner):
    """generate(prompt_ids, n_new, on_token) with on_token required, as in the seed's lm.rs."""

    def generate(  # type: ignore[override]
        self, prompt_ids: Sequence[int], n_new: int, on_token: Callable[[int], bool], /
    ) -> list[int]:
        context, out = self._check(prompt_ids), []
        for _ in range(n_new):
            token = int(np.argmax(np.asarray(self.predict_logits(context))))
            out.append(token)
            context.append(token)
            if not on_token(token):
                break
        return out


def test_a_required_on_token_is_the_reference_signature_and_passes() -> None:
    # (The toy's generate_multimodal forwards on_token=None to generate: not this runner's.)
    clauses = ["structure.members", "greedy.stop", "greedy.argmax"]
    report = check_runner(SeedSignature, clauses=clauses, **FAST)
    assert report.ok, report.format()
    passed = {r.clause for r in report.passes}
    assert {"greedy.stop", "greedy.argmax"} <= passed
    assert not any("signature" in r.message for r in report.results)


class Unfingerprinted(ToyRunner):
    """Sessions without a fingerprint: it cannot tell a foreign snapshot from its own."""

    def export_session(self) -> SessionSnapshot | None:
        snap = super().export_session()
        return None if snap is None else SessionSnapshot(snap.kv, snap.tokens, None)

    def _accept(self, snap: Any) -> None:
        return None


def test_foreign_snapshots_are_not_applicable_without_fingerprints() -> None:
    report = check_runner(Unfingerprinted, clauses=["sessions.foreign"], **FAST)
    assert report.ok, report.format()
    result = report["sessions.foreign"]
    assert result in report.skips
    assert "not applicable" in result.message
    assert "fingerprint" in result.message
