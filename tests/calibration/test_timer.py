"""The timer on CPU: median and IQR of a known delay, the spread target, the per-point budget."""

from __future__ import annotations

import math
import time

import torch

from attn_dispatch.calibration.timer import (
    MAX_CALLS_PER_SAMPLE,
    TARGET_SAMPLE_S,
    TimerSettings,
    calls_per_sample,
    interquartile_range,
    time_repetitions,
)

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
    # a busy wait can only take longer than asked; how much longer depends on how loaded the
    # machine is, so no upper bound is asserted
    assert 0.0019 < timing.median_s and math.isfinite(timing.median_s)
    assert 0.0 <= timing.iqr_s and math.isfinite(timing.iqr_s)
    assert settings.min_reps <= timing.reps <= settings.max_reps


def test_rotation_index_and_warmup_calls():
    seen = []
    settings = TimerSettings(warmup=2, min_reps=3, max_reps=3, target_relative_iqr=0.0, budget_s=10.0)
    timing = time_repetitions(seen.append, CPU, settings)
    # Two warm-up calls, then 3 samples of back-to-back calls (a fast call is batched).
    calls = calls_per_sample(1e-6)
    assert seen[:2] == [0, 1] and seen == list(range(len(seen)))
    assert timing.reps == 3 and timing.stopped == "max_reps"
    assert 2 + 3 <= len(seen) <= 2 + 3 * calls


def test_batches_short_calls_to_the_target_sample_length():
    assert calls_per_sample(TARGET_SAMPLE_S * 2) == 1
    assert calls_per_sample(TARGET_SAMPLE_S / 10) == 10
    assert calls_per_sample(1e-9) == MAX_CALLS_PER_SAMPLE
    assert calls_per_sample(float("inf")) == 1
    seen = []
    time_repetitions(seen.append, CPU, TimerSettings(warmup=0, min_reps=2, max_reps=2, target_relative_iqr=0.0))
    assert seen == [0, 1]  # no warm-up: no estimate, one call per sample


def test_stops_at_the_budget_before_min_reps():
    settings = TimerSettings(warmup=2, min_reps=10, max_reps=50, target_relative_iqr=0.0, budget_s=0.05)
    calls = []
    busy = _busy(0.03)

    def run(index: int) -> None:
        calls.append(index)
        busy(index)

    timing = time_repetitions(run, CPU, settings)
    assert timing.stopped == "budget"
    assert 1 <= timing.reps <= 2
    # each sample of a 30 ms call is one call: the budget stopped it after two warm-ups and the samples
    assert len(calls) == settings.warmup + timing.reps


def test_stops_when_stable_and_when_told():
    stable = time_repetitions(lambda i: None, CPU, TimerSettings(min_reps=3, target_relative_iqr=float("inf")))
    assert stable.stopped == "stable" and stable.reps == 3
    early = time_repetitions(lambda i: None, CPU, TimerSettings(min_reps=3, target_relative_iqr=0.0), should_stop=lambda s: True)
    assert early.stopped == "early" and early.reps == 3


def test_interquartile_range():
    assert interquartile_range([1.0]) == 0.0
    assert interquartile_range([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
