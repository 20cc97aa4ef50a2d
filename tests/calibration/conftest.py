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
