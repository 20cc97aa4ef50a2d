"""An active refinement round inside a real (tiny, CPU) calibration: after the sweep it measures
sample points that were not in the sweep, chosen by bootstrap disagreement."""

from __future__ import annotations

from collections import Counter

import attn_dispatch.calibration.plan as active_round
from attn_dispatch.calibration.session import calibrate
from attn_dispatch.kernels.chunked import ChunkedKernel
from attn_dispatch.kernels.math_kernel import MathKernel
from attn_dispatch.kernels.small_q import SmallQKernel
from tests.calibration.helpers import small_config

KERNELS = [MathKernel(), ChunkedKernel(q=128, kv=1024), SmallQKernel(splits=8)]


def test_an_active_round_measures_new_sample_points(tmp_path, monkeypatch):
    monkeypatch.setattr(active_round, "MIN_PROBLEMS", 3)  # a CI-sized sweep
    config = small_config(tmp_path, problems=4, active_rounds=1)
    summary = calibrate(config, show_progress=False, kernels=KERNELS, fit=False)
    phases = {m.problem: m.extra.get("phase") for m in summary.measurements}
    sweep = {p for p, phase in phases.items() if phase == "sweep"}
    active = {p for p, phase in phases.items() if phase == "active1"}
    assert len(sweep) == 4 and len(active) == 1 and not active & sweep
    assert Counter(phases.values())["active1"] == 1


def test_too_few_measured_problems_choose_nothing():
    assert active_round.uncertain_problems([], [], KERNELS, spec=None, count=3, seed=0) == []
