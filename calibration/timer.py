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
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch

# A median below this is treated as this when computing a relative spread (avoids dividing by 0).
TINY_SECONDS = 1e-12


@dataclass(frozen=True)
class Timing:
    """Median and interquartile range of repeated runs, in seconds.

    `stopped` says why the repetitions ended: "stable" (spread under target), "budget" (per-point
    budget spent), "max_reps", or "early" (the caller's `should_stop` said so, e.g. a pruned
    optuna trial).
    """

    median_s: float
    iqr_s: float
    reps: int
    stopped: str = "stable"

    @property
    def relative_spread(self) -> float:
        return self.iqr_s / self.median_s if self.median_s > 0 else math.inf


@dataclass(frozen=True)
class TimerSettings:
    """How hard to try for a stable number.

    The defaults come from METHOD.md's advice (warm-up, median of many) and from CPU runs on this
    project's 2-core CI machines, where 5 repetitions already gave a relative IQR under 5% for
    problems above ~1 ms; `budget_s` caps slow points: once it is spent the timer stops even
    before `min_reps` (at least one timed repetition is always kept), so one slow kernel cannot
    eat a calibration run.
    """

    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 50
    target_relative_iqr: float = 0.05
    budget_s: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT = TimerSettings()
QUICK = TimerSettings(warmup=1, min_reps=3, max_reps=10, target_relative_iqr=0.10, budget_s=0.25)


def interquartile_range(samples: list[float]) -> float:
    """Q3 - Q1 of `samples` (0 for fewer than two samples)."""
    if len(samples) < 2:
        return 0.0
    quartiles = statistics.quantiles(samples, n=4, method="inclusive")
    return quartiles[2] - quartiles[0]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_context(device: torch.device):
    """Make `device` current so events and kernels land on it (cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def time_repetitions(
    run: Callable[[int], object],
    device: torch.device,
    settings: TimerSettings = DEFAULT,
    *,
    should_stop: Callable[[list[float]], bool] | None = None,
) -> Timing:
    """Time ``run(i)`` (i = repetition index, for input rotation) and return its median and IQR.

    Parameters
    ----------
    run: one call of the kernel under test; its result is discarded.
    device: where it runs (events on GPU, perf_counter on CPU).
    settings: warm-up, repetition counts, spread target and per-point budget.
    should_stop: called with the samples so far after each repetition from `min_reps` on; True
        ends the timing early (``Timing.stopped == "early"``).

    Exceptions from `run` propagate (the caller records them as infeasible points).
    """
    device = torch.device(device)
    started = time.perf_counter()
    with _device_context(device):
        for i in range(settings.warmup):
            run(i)
            _synchronize(device)
            if time.perf_counter() - started > settings.budget_s:
                break  # a slow kernel is warm after one call; keep the budget for timed runs
        samples: list[float] = []
        stopped = "max_reps"
        while len(samples) < settings.max_reps:
            samples.append(_time_once(run, settings.warmup + len(samples), device))
            over_budget = time.perf_counter() - started > settings.budget_s
            if len(samples) >= settings.min_reps:
                if should_stop is not None and should_stop(samples):
                    stopped = "early"
                    break
                spread = interquartile_range(samples) / max(statistics.median(samples), TINY_SECONDS)
                if spread <= settings.target_relative_iqr:
                    stopped = "stable"
                    break
            if over_budget:
                stopped = "budget"
                break
    return Timing(statistics.median(samples), interquartile_range(samples), len(samples), stopped)


def _time_once(run: Callable[[int], object], index: int, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(index)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
    begin = time.perf_counter()
    run(index)
    return time.perf_counter() - begin
