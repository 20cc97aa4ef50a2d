from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Deterministic examples in CI (no flaky draws); set HYPOTHESIS_PROFILE=explore locally for more.
settings.register_profile(
    "ci", max_examples=12, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
settings.register_profile("explore", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

