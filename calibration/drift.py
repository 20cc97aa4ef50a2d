"""Has a table gone stale? Re-measure a sample of its buckets on this card and compare.

Each sampled bucket's problem (`TableClass.problem_at`) is timed with every kernel it ranks: per
kernel, the median measured / predicted ratio is the drift; a bucket's decision has *changed* when
its first choice is measurably slower than the fastest there, confirmed by timing both again.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from attn_dispatch.calibration.finish import ANY_LOSSY
from attn_dispatch.calibration.inputs import InputCache
from attn_dispatch.calibration.measure import measure
from attn_dispatch.calibration.results import ResultsStore
from attn_dispatch.calibration.timer import QUICK, TimerSettings
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.registry import kernel_from_name
from attn_dispatch.models.measured import ClassKey
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.paths import journals_dir
from attn_dispatch.models.table import ThresholdTable

# The table's winner may be this much slower than the measured best before a decision counts
# as changed (twice the timer's spread target).
DECISION_TOLERANCE = 0.10
# A kernel's times have drifted when its median measured / predicted ratio leaves
# [1 / DRIFT_FACTOR, DRIFT_FACTOR] (the model's own error is of this order).
DRIFT_FACTOR = 1.5
MAX_POINT_SECONDS = 0.25  # buckets whose predicted winner takes longer are not re-measured


@dataclass
class PointCheck:
    """One re-measured bucket: predicted and measured seconds of each kernel it ranks."""

    key: ClassKey
    bucket: tuple[int, int]
    predicted: dict[str, float]
    measured: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)

    @property
    def table_winner(self) -> str:
        return min(self.predicted, key=self.predicted.get)

    @property
    def measured_winner(self) -> str | None:
        return min(self.measured, key=self.measured.get) if self.measured else None

    @property
    def changed(self) -> bool:
        """The table's first choice is over `DECISION_TOLERANCE` slower than the measured best
        (or no longer runs while another kernel does)."""
        best = self.measured_winner
        if best is None:
            return False
        mine = self.measured.get(self.table_winner, math.inf)
        return mine > self.measured[best] * (1 + DECISION_TOLERANCE)


@dataclass
class DriftReport:
    """Every re-measured bucket and the raw measurements (for a refit)."""

    points: list[PointCheck]
    measurements: list[Measurement]

    @property
    def changed(self) -> list[PointCheck]:
        return [point for point in self.points if point.changed]

    def per_kernel(self) -> dict[str, dict]:
        """Per kernel: points, median / min / max of measured / predicted, and whether it drifted."""
        ratios: dict[str, list[float]] = defaultdict(list)
        for point in self.points:
            for name, seconds in point.measured.items():
                ratios[name].append(seconds / point.predicted[name])
        out = {}
        for name, values in sorted(ratios.items()):
            median = statistics.median(values)
            out[name] = {"points": len(values), "median_ratio": median, "min_ratio": min(values),
                         "max_ratio": max(values), "drifted": not (1 / DRIFT_FACTOR <= median <= DRIFT_FACTOR)}
        return out


def sample_buckets(table: ThresholdTable, count: int, *, seed: int = 0,
                   max_seconds: float = MAX_POINT_SECONDS) -> list[tuple[ClassKey, tuple[int, int]]]:
    """Up to `count` buckets, spread over the classes: buckets that were measured first, then
    any; only buckets whose predicted winner runs within `max_seconds`; seeded."""
    rng = np.random.default_rng(seed)
    per_class: list[list[tuple[ClassKey, tuple[int, int]]]] = []
    for key in sorted(table.classes):
        cells = table.classes[key].cells
        quick = [b for b, c in sorted(cells.items()) if c.ranking and c.ranking[0][1] <= max_seconds]
        measured = [b for b in quick if cells[b].measured]
        rest = [b for b in quick if not cells[b].measured]
        order = [measured[i] for i in rng.permutation(len(measured))] + [rest[i] for i in rng.permutation(len(rest))]
        per_class.append([(key, bucket) for bucket in order])
    layers = itertools.zip_longest(*per_class)  # each class's first bucket, then each one's second...
    return [bucket for layer in layers for bucket in layer if bucket is not None][:max(count, 0)]


def check_table(table: ThresholdTable, device: torch.device | str, *, points: int, seed: int = 0,
                settings: TimerSettings = QUICK, memory_budget: int | None = None, device_key: str = "",
                max_seconds: float = MAX_POINT_SECONDS) -> DriftReport:
    """Re-measure `points` buckets of `table` on `device` (see module docstring). Raises
    ValueError for a table of another kind of device."""
    device = torch.device(device)
    if table.identity.device_type != device.type:
        raise ValueError(
            f"this table was calibrated on a {table.identity.device_type} device ({table.identity.model_key}); "
            f"check it on one (--device), not on {device}"
        )
    report = DriftReport(points=[], measurements=[])
    cache = InputCache()

    def measure_into(point: PointCheck, name: str, problem: Problem) -> None:
        """Measure one kernel of a bucket; a repeated kernel keeps its faster run (interference on
        a shared machine only ever slows a run down)."""
        m = measure(kernel_from_name(name, policy=ANY_LOSSY), problem, device, settings=settings,
                    memory_budget=memory_budget, device_key=device_key, seed=seed, cache=cache,
                    extra={"phase": "check"})
        earlier = next((i for i, e in enumerate(report.measurements) if e.problem == problem and e.kernel == name),
                       None)
        if earlier is None:
            report.measurements.append(m)
        elif m.ok and m.median_s < report.measurements[earlier].median_s:
            report.measurements[earlier] = m
        point.statuses[name] = m.status
        if m.ok:
            point.measured[name] = min(m.median_s, point.measured.get(name, math.inf))

    for key, bucket in sample_buckets(table, points, seed=seed, max_seconds=max_seconds):
        table_class = table.classes[key]
        problem = table_class.problem_at(bucket, device.type)
        point = PointCheck(key, bucket, predicted=dict(table_class.cells[bucket].ranking))
        for name in point.predicted:
            measure_into(point, name, problem)
        if point.changed:  # confirm: time both kernels again, keep each one's faster run
            for name in {point.table_winner, point.measured_winner}:
                measure_into(point, name, problem)
        cache.clear()
        report.points.append(point)
    return report


def table_points(table: ThresholdTable) -> list[Measurement]:
    """The table's own predictions as points (every ranked kernel of every bucket, at the class's
    representative problem)."""
    points = []
    for table_class in table.classes.values():
        for bucket, cell in table_class.cells.items():
            problem = table_class.problem_at(bucket, table.identity.device_type)
            points += [Measurement(problem, name, median_s=seconds, reps=1, device_key=table.identity.key,
                                   extra={"phase": "table prediction"}) for name, seconds in cell.ranking]
    return points


def base_points(table: ThresholdTable) -> tuple[list[Measurement], str]:
    """What a refit starts from: the calibration journals of the table's card and stack when this
    machine has them, else the table's own predictions. Returns (points, where they came from)."""
    journals = sorted(journals_dir().glob(f"*{table.identity.key}*.jsonl"))
    points = [m for path in journals for m in ResultsStore(path).measurements() if m.status != "unsupported"]
    if points:
        return points, f"{len(points)} points of {len(journals)} calibration journal(s) in {journals_dir()}"
    return table_points(table), "the table's own predictions (no calibration journal of it on this machine)"
