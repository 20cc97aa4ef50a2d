"""Dense points near crossovers: where two measured problems of one class, close in (log2 query
length, log2 KV length), are won by different kernel families, the geometric midpoint is worth
measuring next. Uses the measurements themselves as the model of who wins (the cost model, fitted
later from them, puts its thresholds in the same places).
"""

from __future__ import annotations

import math

from attn_dispatch.calibration.gate import problem_class
from attn_dispatch.calibration.space import resized
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.decision_map import family_of
from attn_dispatch.models.measurement import Measurement

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
