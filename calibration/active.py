"""Where the cost model is least sure: scores that rank unmeasured problems for measuring next.

Two signals, both computed from predictions alone (no measured time of the candidate is needed):

- **margin**: the gap, in predicted natural-log seconds, between a problem's two fastest
  predicted kernels. A small gap means a small prediction error flips the choice; a large one
  means the pick is safe even if the model is off by that much.
- **bagged regret**: fits on bootstrap resamples of the measured problems ("bags") each rank the
  kernels; the score is the mean, over bags, of how much slower (in that bag's log seconds) the
  consensus pick is than that bag's own pick. Zero when every bag agrees.

A problem with fewer than two candidate kernels has nothing to choose: its margin is infinite and
its regret zero, so it is never picked for being uncertain.

Shapes: ``groups [n]`` (int problem id of each candidate row), ``predicted_log [n]`` or
``[bags, n]`` (natural-log seconds of each row).
"""

from __future__ import annotations

import math

import numpy as np


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


def bagged_regret(groups: np.ndarray, predicted_log: np.ndarray) -> dict[int, float]:
    """Problem id -> mean over bags of (bag's log time of the consensus pick - bag's best).

    ``predicted_log`` is ``[bags, n]``; the consensus pick minimises the bags' mean prediction.
    """
    predicted_log = np.atleast_2d(predicted_log)
    out = {}
    for group, rows in _rows_by_group(np.asarray(groups)).items():
        block = predicted_log[:, rows]  # [bags, kernels of this problem]
        consensus = int(np.argmin(block.mean(axis=0)))
        out[group] = float(np.mean(block[:, consensus] - block.min(axis=1)))
    return out


def most_uncertain(scores: dict[int, float], count: int, *, higher_is_less_sure: bool) -> list[int]:
    """The `count` problem ids the model is least sure of (ties: smaller id first).

    ``higher_is_less_sure`` is False for margins (smallest first), True for regrets.
    """
    sign = -1.0 if higher_is_less_sure else 1.0
    ranked = sorted(scores, key=lambda group: (sign * scores[group], group))
    return ranked[:max(0, count)]
