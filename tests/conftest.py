"""Shared test setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE."""

from __future__ import annotations

import os

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
