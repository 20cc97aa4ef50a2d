"""The problem plan every worker of a calibration follows: a fixed, seeded sample, published once
through the shared storage (the first worker's plan wins; a resumed run reloads it, so the sample
never changes under a calibration), ordered so each round of the sample is measured cheapest first.
"""

from __future__ import annotations

import math

from optuna.storages import BaseStorage

from attn_dispatch.calibration.candidates import CostEstimator
from attn_dispatch.calibration.claims import publish_once, published
from attn_dispatch.calibration.space import SpaceProfile, sample_problems
from attn_dispatch.calibration.storage import study_name
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem

# Problems per round: each round is a contiguous slice of the space-filling sample (so a run cut
# short has covered the space) and is measured cheapest first.
ROUND_SIZE = 16


def problem_cost(problem: Problem, kernels: list[Kernel], estimator: CostEstimator, point_budget_s: float) -> float:
    """Predicted seconds to decide `problem`: its supported kernels' predictions, each capped at the
    per-point budget (unknown predictions count as one budget)."""
    total = 0.0
    for kernel in kernels:
        if kernel.reasons(problem):
            continue
        guess = estimator.seconds(problem, kernel)
        total += min(guess, point_budget_s) if math.isfinite(guess) else point_budget_s
    return total


def order_rounds(problems: list[Problem], cost) -> list[Problem]:
    """Sample order kept between rounds of `ROUND_SIZE`; cheapest first inside each round."""
    ordered = []
    for start in range(0, len(problems), ROUND_SIZE):
        ordered += sorted(problems[start:start + ROUND_SIZE], key=cost)
    return ordered


def build_sweep(
    profile: SpaceProfile,
    *,
    kernels: list[Kernel],
    estimator: CostEstimator,
    device_type: str,
    memory_bytes: int,
    point_budget_s: float,
    seed: int,
    count: int | None,
) -> list[Problem]:
    """The first sweep's problems, ordered (see module docstring)."""
    problems = sample_problems(
        profile, device_type=device_type, memory_bytes=memory_bytes, seed=seed, count=count,
        fastest_s=lambda p: estimator.fastest(p, kernels),
    )
    return order_rounds(problems, lambda p: problem_cost(p, kernels, estimator, point_budget_s))


def plan_name(calibration_id: str, stage: str) -> str:
    return study_name(calibration_id, "plan", stage)


def agree_on(storage: BaseStorage, calibration_id: str, stage: str, problems: list[Problem]) -> list[Problem]:
    """Publish `problems` as stage `stage`'s plan unless one is there; return the agreed plan."""
    value = publish_once(storage, plan_name(calibration_id, stage), {"problems": [p.to_dict() for p in problems]})
    return [Problem.from_dict(p) for p in value["problems"]]


def agreed(storage: BaseStorage, calibration_id: str, stage: str) -> list[Problem] | None:
    """Stage `stage`'s plan if one was published."""
    value = published(storage, plan_name(calibration_id, stage))
    return None if value is None else [Problem.from_dict(p) for p in value["problems"]]
