"""The stateful machines' PRNG campaign driver (``tests/stateful_campaign.py``)."""

from __future__ import annotations

import stateful_campaign as campaign
import test_kv_stateful as machines


def test_the_stateful_campaign_runs_every_machine() -> None:
    """Each machine runs under the PRNG driver (one run, a handful of steps), and the
    driver draws every argument kind the machines declare."""
    for name in campaign.MACHINES:
        assert campaign.campaign(name, 0.0, seed=7, steps=12) == 0
    assert machines.st is not campaign.PrngStrategies
