"""A timer that can be trusted on noisy machines.

GPU: device events around each repetition; CPU: `time.perf_counter`. Warm-up first, then
repetitions until the interquartile range is small relative to the median or the per-point budget
is spent. Inputs are rotated between repetitions (see `calibration.inputs`) so that a problem that
fits in cache is not timed from cache.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Median and interquartile range of repeated runs, in seconds."""

    median_s: float
    iqr_s: float
    reps: int

    @property
    def relative_spread(self) -> float:
        return self.iqr_s / self.median_s if self.median_s > 0 else math.inf


@dataclass(frozen=True)
class TimerSettings:
    """How hard to try for a stable number.

    The defaults come from METHOD.md's advice (warm-up, median of many) and from CPU runs on this
    project's 2-core CI machines, where 5 repetitions already gave a relative IQR under 5% for
    problems above ~1 ms; `budget_s` caps slow points.
    """

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 50
    target_relative_iqr: float = 0.05
    budget_s: float = 1.0


QUICK = TimerSettings(warmup=1, min_reps=3, max_reps=10, target_relative_iqr=0.10, budget_s=0.25)


def interquartile_range(samples: list[float]) -> float:
    if len(samples) < 2:
        return 0.0
    quartiles = statistics.quantiles(samples, n=4, method="inclusive")
    return quartiles[2] - quartiles[0]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repetitions(run: Callable[[int], object], device: torch.device, settings: TimerSettings = TimerSettings()) -> Timing:
    """Time ``run(i)`` (i = repetition index, for input rotation) and return its median and IQR.

    Exceptions from `run` propagate (the caller records them as infeasible points).
    """
    for i in range(settings.warmup):
        run(i)
    _synchronize(device)
    samples: list[float] = []
    started = time.perf_counter()
    rep = 0
    while rep < settings.max_reps:
        samples.append(_time_once(run, settings.warmup + rep, device))
        rep += 1
        if rep >= settings.min_reps:
            spread = interquartile_range(samples) / max(statistics.median(samples), 1e-12)
            if spread <= settings.target_relative_iqr or time.perf_counter() - started > settings.budget_s:
                break
    return Timing(statistics.median(samples), interquartile_range(samples), len(samples))


def _time_once(run: Callable[[int], object], index: int, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(index)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    run(index)
    return time.perf_counter() - begin
