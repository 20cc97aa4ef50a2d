"""Calibration tests: one torch thread per test process (pytest-xdist runs two on two cores, and
oversubscribed OpenMP threads make CPU timings meaningless), and a private cache directory."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    """Every test gets its own ATTN_DISPATCH_HOME (journals, results, tables)."""
    home = tmp_path / "home"
    monkeypatch.setenv("ATTN_DISPATCH_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The calibration's noise probe says "quiet": a functional test's table must not depend on
    how busy the shared machine is (a too-busy probe gives the table the "default" verdict, and
    the PostgreSQL test's two fits of the same points then differed). Tests of the probe call
    `noise.probe_noise` directly, or set their own verdict on `session.probe_noise`."""
    from attn_dispatch.calibration import session
    from attn_dispatch.calibration.noise import Noise

    monkeypatch.setattr(session, "probe_noise", lambda device: Noise(median_s=1e-3, spread=0.0))
