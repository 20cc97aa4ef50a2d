"""The timer on CPU: median and IQR of a known delay, the spread target, the per-point budget."""

from __future__ import annotations

import time

import torch

from calibration.timer import TimerSettings, Timing, interquartile_range, time_repetitions

CPU = torch.device("cpu")


def _busy(seconds: float):
    def run(_: int) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return run


def test_median_and_iqr_of_a_known_delay():
    settings = TimerSettings(warmup=1, min_reps=5, max_reps=20, target_relative_iqr=0.5, budget_s=2.0)
    timing = time_repetitions(_busy(0.002), CPU, settings)
    # a busy wait can only take longer than asked (a loaded CI machine preempts it)
    assert 0.0019 < timing.median_s < 0.05
    assert 0.0 <= timing.iqr_s < 0.05
    assert settings.min_reps <= timing.reps <= settings.max_reps


def test_rotation_index_and_warmup_calls():
    seen = []
    settings = TimerSettings(warmup=2, min_reps=3, max_reps=3, target_relative_iqr=0.0, budget_s=10.0)
    timing = time_repetitions(seen.append, CPU, settings)
    assert seen == [0, 1, 2, 3, 4] and timing.reps == 3 and timing.stopped == "max_reps"


def test_stops_at_the_budget_before_min_reps():
    settings = TimerSettings(warmup=2, min_reps=10, max_reps=50, target_relative_iqr=0.0, budget_s=0.05)
    started = time.perf_counter()
    timing = time_repetitions(_busy(0.03), CPU, settings)
    assert timing.stopped == "budget"
    assert 1 <= timing.reps <= 2
    assert time.perf_counter() - started < 0.2


def test_stops_when_stable_and_when_told():
    stable = time_repetitions(lambda i: None, CPU, TimerSettings(min_reps=3, target_relative_iqr=float("inf")))
    assert stable.stopped == "stable" and stable.reps == 3
    early = time_repetitions(lambda i: None, CPU, TimerSettings(min_reps=3, target_relative_iqr=0.0), should_stop=lambda s: True)
    assert early.stopped == "early" and early.reps == 3


def test_interquartile_range():
    assert interquartile_range([1.0]) == 0.0
    assert interquartile_range([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
    assert Timing(0.0, 0.0, 1).relative_spread == float("inf")
