"""Shared test setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("fast", max_examples=50, deadline=None, print_blob=True)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# CI's second runs (lowest dependency versions, the aarch64 wheel under emulation): an API
# check on slow ground, so fewer examples and no too-slow health check.
settings.register_profile(
    "ci-fast",
    max_examples=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("deep", max_examples=5000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for every Ray test of the run (loopback only).

    Four logical CPUs on this 2-core machine: two 1-CPU generation actors plus
    the read and repartition tasks that feed them must fit at once, or the
    pipeline waits for a CPU that an actor holds.
    """
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
    )
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        try:
            from ray import serve

            serve.shutdown()
        except Exception:  # serve was never started, or is already down
            pass
        ray.shutdown()
