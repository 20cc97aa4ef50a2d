"""Everything a worker does for one problem it has claimed: triage the kernels, time the ones
left cheapest first, then tune the competitive families' parameters with optuna. Every point is
recorded as soon as it is measured; points already recorded (a resumed run) are skipped.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attn_dispatch.calibration.candidates import CostEstimator, triage
from attn_dispatch.calibration.inputs import InputCache
from attn_dispatch.calibration.measure import empty_cache, measure
from attn_dispatch.calibration.recorder import Recorder
from attn_dispatch.calibration.results import problem_id
from attn_dispatch.calibration.storage import study_name
from attn_dispatch.calibration.timer import TimerSettings
from attn_dispatch.calibration.tuning import PRUNE_RATIO, TUNABLE_FAMILIES, TUNE_WITHIN, tune_family
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measurement import Measurement

# A kernel whose first (untimed) call takes this many times the problem's best time so far is a
# clear loser: one timed call records it (cheapest-predicted kernels run first, so the best is
# usually known early). The same ratio as optuna's pruning of tuning trials.
LOSER_FACTOR = PRUNE_RATIO


@dataclass
class ProblemContext:
    """What stays the same across a worker's problems."""

    device: torch.device
    kernels: list[Kernel]
    estimator: CostEstimator
    settings: TimerSettings
    memory_budget: int | None
    device_key: str
    recorder: Recorder
    calibration_id: str
    tune_trials: int
    seed: int
    heartbeat: Callable[[], None] = field(default=lambda: None)


class DeadlineReached(Exception):
    """The calibration's time budget ran out in the middle of a problem."""


def _best(known: dict[str, Measurement]) -> float:
    return min((m.median_s for m in known.values() if m.ok), default=math.inf)


def run_problem(problem: Problem, context: ProblemContext, *, deadline: float, phase: str) -> int:
    """Measure `problem`; returns the number of points timed now.

    Raises
    ------
    DeadlineReached: when `deadline` (epoch seconds) passes between two points; the points
        measured so far are recorded.
    """
    recorder = context.recorder
    recorder.sync_problem(problem)
    known = recorder.known(problem)
    plan = triage(
        problem, context.kernels, estimator=context.estimator, memory_budget=context.memory_budget,
        point_budget_s=context.settings.budget_s, device_key=context.device_key,
    )
    recorder.record_decided([m for m in plan.decided if m.kernel not in known])
    known.update({m.kernel: m for m in plan.decided})
    cache = InputCache()
    timed = 0

    def timed_measure(kernel: Kernel, should_stop=None, extra: dict | None = None) -> Measurement:
        nonlocal timed
        if time.time() > deadline:
            raise DeadlineReached
        extra = {"phase": phase, "predicted_s": plan.predicted.get(kernel.name), **(extra or {})}
        best = _best(known)
        point = measure(
            kernel, problem, context.device, settings=context.settings, memory_budget=context.memory_budget,
            device_key=context.device_key, seed=context.seed, cache=cache, should_stop=should_stop, extra=extra,
            single_shot_above_s=LOSER_FACTOR * best if math.isfinite(best) else None,
        )
        if point.status == "infeasible":
            empty_cache(context.device)
        recorder.record(point)
        context.heartbeat()
        timed += 1
        return point

    try:
        for kernel in plan.to_time:
            if kernel.name not in known:
                known[kernel.name] = timed_measure(kernel)
        _tune(problem, context, known, timed_measure)
    finally:
        cache.clear()
        recorder.flush(problem)
    return timed


def _tune(problem: Problem, context: ProblemContext, known: dict[str, Measurement], timed_measure) -> None:
    """optuna search for each competitive tunable family of the kernel set."""
    best = _best(known)
    if not math.isfinite(best) or context.tune_trials < 1:
        return
    families = {k.family for k in context.kernels}
    for family in TUNABLE_FAMILIES:
        if family not in families:
            continue
        family_best = min((m.median_s for name, m in known.items() if m.ok and name.startswith(family + "[")), default=math.inf)
        if family_best > TUNE_WITHIN * best:
            continue
        pid = problem_id(problem)
        tune_family(
            problem, family, storage=context.recorder.storage,
            study_name=study_name(context.calibration_id, "tune", family, pid), trials=context.tune_trials,
            known=known, best_s=best, seed=context.seed + zlib.crc32(pid.encode()),
            measure=lambda kernel, hook: timed_measure(kernel, hook, {"phase": "tune"}),
        )
