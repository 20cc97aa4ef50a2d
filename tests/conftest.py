"""Settings every test shares, loaded before any test module is imported.

Hypothesis: the project profile has no deadline (a pass/fail test never depends on how fast the
machine is; timings belong in benchmarks) and deterministic draws. It must be loaded here, at the
root: ``@given`` captures the profile loaded when its module is imported, and a module can be
imported from another directory's tests (``tests.kernels.test_contract`` from the dispatcher's)
before its own directory's conftest runs. ``HYPOTHESIS_PROFILE=explore`` draws more examples.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Triton's interpreter runs the Triton kernels on CPU tensors, so the CPU suite checks their
# numerics; Triton reads the switch when it decorates a kernel, so it is set before anything imports
# one. Off when the suite runs on a GPU (ATTN_DISPATCH_TEST_DEVICE=cuda).
# The interpreter multiplies blocks with numpy: one BLAS thread (OpenBLAS's spinning workers slowed
# it 2.5x on a shared 2-core CPU), set before anything imports numpy.
if not os.environ.get("ATTN_DISPATCH_TEST_DEVICE", "cpu").startswith("cuda"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest
from hypothesis import HealthCheck, settings

# No test writes into the user's own cache (`~/.cache/attn-dispatch`: probes, tables, measurements) or reads
# what is there: each test process gets a private home, removed when it exits; tests that need one of
# their own set it themselves.
os.environ["ATTN_DISPATCH_HOME"] = tempfile.mkdtemp(prefix="attn-dispatch-test-home-")
atexit.register(shutil.rmtree, os.environ["ATTN_DISPATCH_HOME"], ignore_errors=True)

# Draws per property in CI: enough to cover the case strategies' corners, small enough for 2 cores.
CI_EXAMPLES = 12
EXPLORE_EXAMPLES = 200
# Slow draws and filtered strategies are expected (tensor cases, `assume`); function-scoped
# fixtures (a private cache directory per test) need not be reset between examples.
SUPPRESSED = [HealthCheck.filter_too_much, HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=SUPPRESSED)
settings.register_profile("explore", max_examples=EXPLORE_EXAMPLES, deadline=None, suppress_health_check=SUPPRESSED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Refuse a run where any hypothesis test carries a deadline (a module imported before this
    profile was loaded, or an explicit ``@settings(deadline=...)``)."""
    for item in items:
        chosen = getattr(getattr(item, "obj", None), "_hypothesis_internal_use_settings", None)
        if chosen is not None and chosen.deadline is not None:
            raise pytest.UsageError(
                f"{item.nodeid} runs with a hypothesis deadline of {chosen.deadline}: pass/fail tests must not "
                "depend on speed; drop the deadline (tests/conftest.py loads the project profile)"
            )


@pytest.fixture(autouse=True)
def no_measuring_on_calls(request, monkeypatch):
    """Measuring a bucket's candidates on its calls (`dispatcher.measuring`) picks by the clock,
    which would let machine load decide which kernel a test sees: off in every test but those that
    test it (marked ``measuring``, where the clock is stood in for or only behaviour matters)."""
    if request.node.get_closest_marker("measuring") is None:
        monkeypatch.setenv("ATTN_DISPATCH_MEASURE", "0")
