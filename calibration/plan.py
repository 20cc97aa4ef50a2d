"""Which problems a calibration measures, in which order: the sweep (a fixed, seeded sample ordered
cheapest first within each round), then refinement rounds: midpoints between neighbours won by
different kernel families (crossovers), and active rounds (the problems bootstrap cost models
disagree on most). Every plan is published once through the shared storage (the first worker's
wins; a resumed run reloads it), so all workers follow the same one.
"""

from __future__ import annotations

import math

import numpy as np
from optuna.storages import BaseStorage

from attn_dispatch.calibration.candidates import CostEstimator
from attn_dispatch.calibration.claims import publish_once, published
from attn_dispatch.calibration.finish import problem_class
from attn_dispatch.calibration.results import study_name
from attn_dispatch.calibration.space import SpaceProfile, resized, sample_problems
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import training_set
from attn_dispatch.models.decision_plot import family_of
from attn_dispatch.models.features import feature_matrix
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import kernel_named

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


def build_sweep(profile: SpaceProfile, *, kernels: list[Kernel], estimator: CostEstimator, device_type: str,
                memory_bytes: int, point_budget_s: float, seed: int, count: int | None) -> list[Problem]:
    """The first sweep's problems, ordered (see module docstring)."""
    problems = sample_problems(profile, device_type=device_type, memory_bytes=memory_bytes, seed=seed, count=count,
                               fastest_s=lambda p: estimator.fastest(p, kernels))
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


# Problems at most this far apart (octaves, in log2 length space) are neighbours whose winners
# bracket a crossover; farther pairs say little about where it lies.
NEIGHBOUR_OCTAVES = 4.0
# A midpoint within this distance (octaves) of a measured problem adds nothing.
MIN_GAP_OCTAVES = 0.5


def winners(measurements: list[Measurement]) -> dict[Problem, tuple[str, float]]:
    """problem -> (winning kernel family, its time) among "ok" points."""
    best: dict[Problem, tuple[str, float]] = {}
    for m in measurements:
        if m.ok and (m.problem not in best or m.median_s < best[m.problem][1]):
            best[m.problem] = (family_of(m.kernel), m.median_s)
    return best


def _coords(problem: Problem) -> tuple[float, float]:
    return math.log2(max(problem.q_len, 1)), math.log2(max(problem.kv_len, 1))


def _distance(a: Problem, b: Problem) -> float:
    (qa, ka), (qb, kb) = _coords(a), _coords(b)
    return math.hypot(qa - qb, ka - kb)


def _midpoint(a: Problem, b: Problem) -> Problem:
    q = max(1, round(math.sqrt(a.q_len * b.q_len)))
    kv = q if a.q_len == a.kv_len and b.q_len == b.kv_len else max(1, round(math.sqrt(a.kv_len * b.kv_len)))
    return resized(a, q_len=q, kv_len=kv)


def crossover_problems(measurements: list[Measurement], *, count: int) -> list[Problem]:
    """Up to `count` new problems between neighbours with different winners, widest gaps first
    (deterministic: the same measurements give the same list on every worker)."""
    best = winners(measurements)
    by_class: dict[tuple, list[Problem]] = {}
    for problem in sorted(best, key=lambda p: p.key()):
        by_class.setdefault(problem_class(problem), []).append(problem)
    pairs = []
    for problems in by_class.values():
        for i, a in enumerate(problems):
            for b in problems[i + 1:]:
                distance = _distance(a, b)
                if best[a][0] != best[b][0] and MIN_GAP_OCTAVES * 2 < distance <= NEIGHBOUR_OCTAVES:
                    pairs.append((distance, a.key(), b.key(), a, b))
    pairs.sort(key=lambda item: (-item[0], item[1], item[2]))
    chosen: list[Problem] = []
    measured = list(best)
    for _, _, _, a, b in pairs:
        candidate = _midpoint(a, b)
        near = [p for p in measured + chosen if problem_class(p) == problem_class(candidate)]
        if all(_distance(candidate, p) >= MIN_GAP_OCTAVES for p in near):
            chosen.append(candidate)
            if len(chosen) >= count:
                break
    return chosen


def _rows_by_group(groups: np.ndarray) -> dict[int, np.ndarray]:
    order = np.argsort(groups, kind="stable")
    values, starts = np.unique(groups[order], return_index=True)
    return {int(g): rows for g, rows in zip(values, np.split(order, starts[1:]), strict=True)}


def bagged_regret(groups: np.ndarray, predicted_log: np.ndarray, *, linear: bool = False,
                  pick_log: np.ndarray | None = None) -> dict[int, float]:
    """Problem id -> mean over bags of (bag's log time of the consensus pick - bag's best), or of
    ``exp`` of it minus 1 (the slowdown) with ``linear``. Zero when every bag agrees.

    ``groups [n]``: the problem id of each candidate row; ``predicted_log [bags, n]``: natural-log
    seconds. The consensus pick minimises the bags' mean prediction, or ``pick_log [n]`` if given.
    """
    predicted_log = np.atleast_2d(predicted_log)
    out = {}
    for group, rows in _rows_by_group(np.asarray(groups)).items():
        block = predicted_log[:, rows]  # [bags, kernels of this problem]
        consensus = int(np.argmin(block.mean(axis=0) if pick_log is None else pick_log[rows]))
        regret = block[:, consensus] - block.min(axis=1)
        out[group] = float(np.mean(np.expm1(regret) if linear else regret))
    return out


def most_uncertain(scores: dict[int, float], count: int, *, higher_is_less_sure: bool) -> list[int]:
    """The `count` problem ids the model is least sure of (ties: smaller id first)."""
    sign = -1.0 if higher_is_less_sure else 1.0
    ranked = sorted(scores, key=lambda group: (sign * scores[group], group))
    return ranked[:max(0, count)]


# Bootstrap fits per active round and their boosting iterations.
BAGS = 4
BAG_ITERATIONS = 100
# Score the bags' mean slowdown of their consensus pick rather than their mean log regret.
LINEAR_REGRET = True
# At least this many measured problems before an active round is worth fitting.
MIN_PROBLEMS = 16


def _registry_names(kernels: list[Kernel]) -> list[str]:
    """Names of `kernels` the cost model can featurise (a test's own kernels are left out)."""
    names = []
    for kernel in kernels:
        try:
            kernel_named(kernel.name)
        except ValueError:
            continue
        names.append(kernel.name)
    return names


def uncertain_problems(measurements: list[Measurement], candidates: list[Problem], kernels: list[Kernel],
                       spec: CardSpec, *, count: int, seed: int) -> list[Problem]:
    """Up to `count` of `candidates` ranked by bagged regret (deterministic for a seed); [] when
    fewer than `MIN_PROBLEMS` problems were measured or nothing can be featurised."""
    names = set(_registry_names(kernels))
    usable = [m for m in measurements if m.kernel in names]
    if not candidates or len({m.problem for m in usable if m.ok}) < MIN_PROBLEMS:
        return []
    data = training_set(usable, spec)
    pairs = [(i, kernel.name) for i, problem in enumerate(candidates) for kernel in kernels
             if kernel.name in names and not kernel.reasons(problem)]
    if not pairs:
        return []
    groups = np.array([i for i, _ in pairs])
    X = feature_matrix([candidates[i] for i, _ in pairs], [name for _, name in pairs], spec)
    rng = np.random.default_rng(seed)
    problems = np.unique(data.groups)
    predictions = []
    for bag in range(BAGS):
        resample = rng.choice(problems, size=len(problems), replace=True)
        rows = np.concatenate([np.flatnonzero(data.groups == g) for g in resample])
        model = CostModel(random_state=bag, max_iter=BAG_ITERATIONS).fit(data.X[rows], data.y[rows])
        predictions.append(model.predict(X))
    regrets = bagged_regret(groups, np.array(predictions), linear=LINEAR_REGRET)
    return [candidates[i] for i in most_uncertain(regrets, count, higher_is_less_sure=True)]
