"""From measurements to a training set: feature rows, log-second targets and problem groups."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.features import feature_matrix
from attn_dispatch.models.identity import CardSpec
from attn_dispatch.models.measured import median_standard_error
from attn_dispatch.models.measurement import Measurement


@dataclass(frozen=True)
class TrainingSet:
    """Timed (problem, kernel) points for the cost model: `X` feature rows, `y` log median seconds,
    `groups` each row's problem index (held-out splits keep a problem whole), `median_error` each
    median's relative standard error (`median_standard_error`)."""

    problems: tuple[Problem, ...]
    kernels: tuple[str, ...]
    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    median_error: np.ndarray

    def __len__(self) -> int:
        return len(self.kernels)

    @property
    def n_problems(self) -> int:
        return len(set(self.groups.tolist()))

    def subset(self, rows: np.ndarray) -> TrainingSet:
        return TrainingSet(
            tuple(self.problems[i] for i in rows), tuple(self.kernels[i] for i in rows),
            self.X[rows], self.y[rows], self.groups[rows], self.median_error[rows],
        )


def usable(measurements: Iterable[Measurement]) -> list[Measurement]:
    """The points a cost model can learn from: status ok, finite positive time."""
    return [m for m in measurements if m.ok and m.median_s > 0]


def training_set(measurements: Iterable[Measurement], spec: CardSpec) -> TrainingSet:
    """Feature rows of the usable points, repeated (problem, kernel) points merged (median);
    ValueError when no point is usable."""
    times: dict[tuple[Problem, str], list[Measurement]] = defaultdict(list)
    for point in usable(measurements):
        times[(point.problem, point.kernel)].append(point)
    if not times:
        raise ValueError(
            "no usable measurements (status 'ok' with a finite time): run `attn-dispatch calibrate` "
            "and check its log for kernels that failed"
        )
    group_of: dict[Problem, int] = {}
    problems, kernels, y, noise = [], [], [], []
    for (problem, kernel), points in times.items():
        median = statistics.median(p.median_s for p in points)
        group_of.setdefault(problem, len(group_of))
        problems.append(problem)
        kernels.append(kernel)
        y.append(math.log(median))
        noise.append(min(median_standard_error(p.median_s, p.iqr_s, p.reps) for p in points))
    X = feature_matrix(problems, kernels, spec)
    groups = np.array([group_of[p] for p in problems], dtype=np.int64)
    return TrainingSet(tuple(problems), tuple(kernels), X, np.array(y), groups, np.array(noise))
