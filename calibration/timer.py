"""A timer that can be trusted on noisy machines: device events on a GPU, `time.perf_counter` on
a CPU; warm-up, then samples until the IQR is small against the median or the budget is spent. A
sample is a batch of calls lasting about `TARGET_SAMPLE_S` over its size (one sub-millisecond call
mostly measures jitter); callers rotate inputs (`calibration.inputs`) so nothing times from cache.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch

TINY_SECONDS = 1e-12  # a median below this is treated as this in a relative spread
TARGET_SAMPLE_S = 2e-3  # how long one timed sample should last
MAX_CALLS_PER_SAMPLE = 256


@dataclass(frozen=True)
class Timing:
    """Median and interquartile range of repeated runs, in seconds. `stopped`: "stable" (spread
    under target), "budget" (per-point budget spent), "max_reps", or "early" (`should_stop`)."""

    median_s: float
    iqr_s: float
    reps: int
    stopped: str = "stable"


@dataclass(frozen=True)
class TimerSettings:
    """How hard to try for a stable number. Once `budget_s` is spent the timer stops, even before
    `min_reps` (one timed repetition is always kept)."""

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


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_context(device: torch.device):
    """Make `device` current so events and kernels land on it (cuda:1 while cuda:0 is current)."""
    if device.type != "cuda" or device.index is None:  # plain "cuda" is the current device already
        return nullcontext()
    return torch.cuda.device(device)


def time_repetitions(run: Callable[[int], object], device: torch.device, settings: TimerSettings = DEFAULT, *,
                     should_stop: Callable[[list[float]], bool] | None = None) -> Timing:
    """Time ``run(i)`` (i = repetition index, for input rotation; its result is discarded) and
    return its median and IQR. `should_stop` is called with the samples so far after each
    repetition from `min_reps` on; True ends the timing early. Exceptions from `run` propagate."""
    device = torch.device(device)
    started = time.perf_counter()
    with _device_context(device):
        single = math.inf  # no warm-up: no estimate, one call per sample
        for i in range(settings.warmup):
            begin = time.perf_counter()
            run(i)
            synchronize(device)
            single = min(single, time.perf_counter() - begin)
            if time.perf_counter() - started > settings.budget_s:
                break  # a slow kernel is warm after one call; keep the budget for timed runs
        calls = calls_per_sample(single)
        samples: list[float] = []
        stopped = "max_reps"
        while len(samples) < settings.max_reps:
            first = settings.warmup + len(samples) * calls
            samples.append(time_batch(run, first, calls, device))
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


def calls_per_sample(single_call_s: float) -> int:
    """Back-to-back calls per timed sample: enough to last `TARGET_SAMPLE_S`."""
    if not math.isfinite(single_call_s) or single_call_s <= 0:
        return 1
    return int(min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(TARGET_SAMPLE_S / single_call_s))))


def time_batch(run: Callable[[int], object], first: int, calls: int, device: torch.device) -> float:
    """Seconds per call of `calls` back-to-back calls ``run(first) .. run(first + calls - 1)``."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for index in range(first, first + calls):
            run(index)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls  # elapsed_time is in milliseconds
    begin = time.perf_counter()
    for index in range(first, first + calls):
        run(index)
    return (time.perf_counter() - begin) / calls
