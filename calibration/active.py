"""Where the cost model is least sure: scores that rank unmeasured problems for measuring next.

Two signals, both computed from predictions alone (no measured time of the candidate is needed):

- **margin**: the gap, in predicted natural-log seconds, between a problem's two fastest
  predicted kernels. A small gap means a small prediction error flips the choice; a large one
  means the pick is safe even if the model is off by that much.
- **bagged regret**: fits on bootstrap resamples of the measured problems ("bags") each rank the
  kernels; the score is the mean, over bags, of how much slower (in that bag's log seconds) the
  consensus pick is than that bag's own pick. Zero when every bag agrees. With ``linear`` it is
  the mean of ``exp(regret) - 1``, the slowdown itself (what mean slowdown averages), so one bag
  far off counts more than several bags slightly off.

A batch of the most uncertain problems tends to be many near-copies of one region the model
misjudges; `diverse_batch` spreads it: the best-scored of each k-means cluster of the
highest-scored candidates' problem features.

A problem with fewer than two candidate kernels has nothing to choose: its margin is infinite and
its regret zero, so it is never picked for being uncertain.

Shapes: ``groups [n]`` (int problem id of each candidate row), ``predicted_log [n]`` or
``[bags, n]`` (natural-log seconds of each row).
"""

from __future__ import annotations

import math

import numpy as np

from attn_dispatch.models.features import PROBLEM_COLUMNS


def _rows_by_group(groups: np.ndarray) -> dict[int, np.ndarray]:
    order = np.argsort(groups, kind="stable")
    values, starts = np.unique(groups[order], return_index=True)
    return {int(g): rows for g, rows in zip(values, np.split(order, starts[1:]), strict=True)}


def top_margins(groups: np.ndarray, predicted_log: np.ndarray) -> dict[int, float]:
    """Problem id -> predicted log-time gap between its fastest and second-fastest kernel."""
    out = {}
    for group, rows in _rows_by_group(np.asarray(groups)).items():
        if len(rows) < 2:
            out[group] = math.inf
            continue
        two = np.partition(predicted_log[rows], 1)[:2]
        out[group] = float(two[1] - two[0])
    return out


def bagged_regret(groups: np.ndarray, predicted_log: np.ndarray, *, linear: bool = False,
                  pick_log: np.ndarray | None = None) -> dict[int, float]:
    """Problem id -> mean over bags of (bag's log time of the consensus pick - bag's best), or of
    ``exp`` of it minus 1 with ``linear``.

    ``predicted_log`` is ``[bags, n]``; the consensus pick minimises the bags' mean prediction, or
    ``pick_log [n]`` when given (the pick of the model that will be used).
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
    """The `count` problem ids the model is least sure of (ties: smaller id first).

    ``higher_is_less_sure`` is False for margins (smallest first), True for regrets.
    """
    sign = -1.0 if higher_is_less_sure else 1.0
    ranked = sorted(scores, key=lambda group: (sign * scores[group], group))
    return ranked[:max(0, count)]


def problem_descriptors(groups: np.ndarray, X: np.ndarray) -> dict[int, np.ndarray]:
    """Problem id -> its problem-only feature columns (`models.features.PROBLEM_COLUMNS`, equal on
    every row of a problem), from ``X [n, n_features]`` feature rows grouped by ``groups [n]``."""
    return {group: X[rows[0], list(PROBLEM_COLUMNS)] for group, rows in _rows_by_group(np.asarray(groups)).items()}


# Lloyd iterations of `diverse_batch`'s k-means: a few dozen points in a dozen dimensions settle
# in well under this.
KMEANS_ITERATIONS = 25


def diverse_batch(scores: dict[int, float], descriptors: dict[int, np.ndarray], count: int, *,
                  pool_factor: int) -> list[int]:
    """Up to `count` problem ids, higher scores first, spread over the feature space.

    The ``pool_factor * count`` highest-scored problems are clustered by k-means into `count`
    clusters on their standardised descriptors (``[n_features]`` each; the clusters start at the
    `count` highest-scored, so the result is deterministic); each cluster gives its highest-scored
    problem. Empty clusters leave room for the next-best problems not yet taken.
    """
    top = most_uncertain(scores, pool_factor * count, higher_is_less_sure=True)
    if len(top) <= count:
        return top
    points = np.array([descriptors[group] for group in top], dtype=np.float64)
    spread = points.std(axis=0)
    points = (points - points.mean(axis=0)) / np.where(spread > 0, spread, 1.0)
    centres = points[:count].copy()
    labels = np.zeros(len(points), dtype=np.int64)
    for _ in range(KMEANS_ITERATIONS):
        distances = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)  # [points, count]
        labels = np.argmin(distances, axis=1)
        moved = np.array([points[labels == k].mean(axis=0) if np.any(labels == k) else centres[k] for k in range(count)])
        if np.allclose(moved, centres):
            break
        centres = moved
    picked, taken_clusters = [], set()
    for index, group in enumerate(top):  # `top` is in score order: the first of a cluster is its best
        if int(labels[index]) not in taken_clusters:
            taken_clusters.add(int(labels[index]))
            picked.append(group)
    return picked + [group for group in top if group not in set(picked)][:count - len(picked)]
