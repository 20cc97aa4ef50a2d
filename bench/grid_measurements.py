"""Calibration points from a recorded LLM grid run (`bench.llm_grid`'s JSON lines).

Every grid shape times PyTorch's default and each kernel of the grid's set on the card, the way
calibration does (warm medians over rounds; a kernel more than `loser_factor` slower than the best
timed once). Those are measurements of the card like any other: `grid_measurements` turns them
into `models.measurement.Measurement` records that a table can be fitted on and whose buckets
become measured entries (issue 15: a workload's buckets measured first).

Names: the grid's ``pytorch`` path is ``sdpa_default``; ``kernel:<name>`` is ``<name>``. Paths the
grid could not run (``failed``: out of memory) become ``infeasible`` points, as calibration
records them; the dispatcher's own columns (``table``, ``shipped``, ``tuned``) are not kernels
and are left out.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.measurement import Measurement

PYTORCH_PATH = "pytorch"
KERNEL_PREFIX = "kernel:"
GRID_SOURCE = "llm_grid"
"""``Measurement.extra["source"]`` of points made here (tells them from calibration's own)."""


def kernel_of_path(path: str) -> str | None:
    """The canonical kernel name behind a grid path, or None for the dispatcher's own columns."""
    if path == PYTORCH_PATH:
        return DEFAULT_KERNEL
    if path.startswith(KERNEL_PREFIX):
        return path[len(KERNEL_PREFIX):]
    return None


def grid_lines(path: str) -> Iterator[dict]:
    """Every JSON line of a grid file, plain or gzipped (a name ending in ``.gz``), in file order."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def read_grid(path: str) -> list[dict]:
    """The shape rows of a grid file (the lines holding the run's conditions left out)."""
    return [row for row in grid_lines(path) if "problem" in row]


def row_measurements(row: dict, device_key: str = "", source: str = "") -> list[Measurement]:
    """One grid row -> a point per kernel path it timed (or failed to run)."""
    problem = Problem.from_dict(row["problem"])
    extra = {"source": GRID_SOURCE, "file": source}
    points = []
    for path, timing in row["paths"].items():
        name = kernel_of_path(path)
        if name is None:
            continue
        median, reps = timing.get("median_s"), timing.get("samples") or 0
        if median is None and timing.get("once_s") is not None:
            median, reps = timing["once_s"], 1
        if median is None or not math.isfinite(median) or median <= 0:
            continue
        points.append(Measurement(problem, name, median_s=float(median), iqr_s=float(timing.get("iqr_s") or 0.0),
                                  reps=int(reps), device_key=device_key, extra=extra))
    for path, error in row.get("failed", {}).items():
        name = kernel_of_path(path)
        if name is not None:
            status = "infeasible" if "OutOfMemory" in error else "failed"
            points.append(Measurement(problem, name, status=status, reason=error[:200], device_key=device_key,
                                      extra=extra))
    return points


def grid_measurements(paths: Iterable[str], device_key: str = "") -> list[Measurement]:
    """Every point of the grid files at `paths`, in file order."""
    return [point for path in paths for row in read_grid(path) for point in row_measurements(row, device_key, path)]


def grid_times(path: str) -> list[tuple[Problem, dict[str, float]]]:
    """(problem, kernel -> seconds) per shape of a grid file: what a table's pick is scored on."""
    shapes = []
    for row in read_grid(path):
        times = {m.kernel: m.median_s for m in row_measurements(row) if m.ok}
        if len(times) >= 2:
            shapes.append((Problem.from_dict(row["problem"]), times))
    return shapes
