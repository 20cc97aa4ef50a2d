"""Build a threshold table from a fitted cost model and the measurements it was fitted on."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models._json_checks import MAX_CANDIDATES
from attn_dispatch.models.features import feature_matrix
from attn_dispatch.models.forest import embed
from attn_dispatch.models.identity import CardSpec, DeviceIdentity
from attn_dispatch.models.measured import (
    DEFAULT_CLASS_FIELDS,
    WORK_STEP,
    ClassKey,
    bucket_of,
    check_class_fields,
    class_key,
    entries_from_measurements,
)
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.paths import software_versions
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.quality import Guard
from attn_dispatch.models.table import (
    EXCLUDING_STATUSES,
    Cell,
    Provenance,
    TableClass,
    Template,
    ThresholdTable,
)
from attn_dispatch.models.thresholds import thresholds_for

if TYPE_CHECKING:  # the fitted model comes from the caller: building a table never imports scikit-learn here
    from attn_dispatch.models.cost_model import CostModel

# Candidates kept per bucket: the winner and enough runners-up for the dispatcher to fall back
# on when the winner does not fit in memory or fails (the prior ranks the rest).
CANDIDATES_PER_CELL = 4
SIGNIFICANT_DIGITS = 4  # predicted times are estimates: 4 significant digits is plenty
# Causal classes cover buckets within this many octaves of the diagonal (causal attention is
# self-attention: Lq = Lk, or Lq a little shorter in chunked prefill); elsewhere the nearest
# bucket decides.
CAUSAL_BAND = 1


def round_seconds(seconds: float) -> float:
    return float(f"{seconds:.{SIGNIFICANT_DIGITS}g}")


def _template(problems: list[Problem]) -> Template:
    """The most common batch / head layout of the class's measured problems."""
    layout = Counter((p.batch, p.q_heads, p.kv_heads, p.head_dim, p.value_dim) for p in problems)
    return Template(*layout.most_common(1)[0][0])


def _grid(problems: Sequence[Problem], causal: bool) -> list[tuple[int, int]]:
    """Every bucket in the range of all measured lengths (the cost model fills those a class was
    not measured at); causal classes only near the diagonal."""
    buckets = [bucket_of(p) for p in problems]
    q_range = range(min(b[0] for b in buckets), max(b[0] for b in buckets) + 1)
    kv_range = range(min(b[1] for b in buckets), max(b[1] for b in buckets) + 1)
    grid = [(q, kv) for q in q_range for kv in kv_range if not causal or abs(q - kv) <= CAUSAL_BAND]
    return grid or [(q, kv) for q in q_range for kv in kv_range]


def _measured_cells(points: list[Measurement]) -> tuple[dict, dict]:
    """(bucket -> kernel -> median measured seconds, bucket -> kernel -> excluding status)."""
    times: dict = defaultdict(lambda: defaultdict(list))
    excluded: dict = defaultdict(dict)
    for m in points:
        bucket = bucket_of(m.problem)
        if m.ok:
            times[bucket][m.kernel].append(m.median_s)
        elif m.status in EXCLUDING_STATUSES:
            excluded[bucket][m.kernel] = m.status
    medians = {b: {k: statistics.median(v) for k, v in per.items()} for b, per in times.items()}
    return medians, excluded


def _fastest_measured(times: dict[str, float]) -> tuple[tuple[str, float], ...]:
    """A bucket's measured medians, fastest first: at most `MAX_CANDIDATES` (a tuned calibration
    can time more kernels in one bucket than a table cell may list)."""
    entries = sorted(((name, round_seconds(seconds)) for name, seconds in times.items()), key=lambda e: (e[1], e[0]))
    return tuple(entries[:MAX_CANDIDATES])


def _build_class(
    key: ClassKey, points: list[Measurement], grid: list[tuple[int, int]], model: CostModel, spec: CardSpec,
    kernel_names: Sequence[str], device_type: str, candidates: int,
) -> tuple[TableClass, np.ndarray]:
    shell = TableClass(key=key, template=_template([m.problem for m in points]), cells={})
    measured, excluded = _measured_cells(points)
    rows: list[tuple[tuple[int, int], str, Problem]] = []
    for bucket in grid:
        problem = shell.problem_at(bucket, device_type)
        for name in kernel_names:
            if name not in excluded.get(bucket, {}) and not kernel_named(name).reasons(problem):
                rows.append((bucket, name, problem))
    X = feature_matrix([r[2] for r in rows], [r[1] for r in rows], spec)
    seconds = model.predict_seconds(X) if rows else []
    ranked: dict = defaultdict(list)
    for (bucket, name, _), predicted in zip(rows, seconds, strict=True):
        ranked[bucket].append((name, round_seconds(float(predicted))))
    cells = {}
    for bucket, entries in ranked.items():
        entries.sort(key=lambda item: (item[1], item[0]))
        cells[bucket] = Cell(
            ranking=tuple(entries[:candidates]),
            measured=_fastest_measured(measured.get(bucket, {})),
            excluded=tuple(sorted(excluded.get(bucket, {}).items())),
        )
    if not cells:
        raise ValueError(
            f"no kernel of {list(kernel_names)[:5]}... supports class {key.describe()}; pass the kernel names "
            "that were calibrated"
        )
    return TableClass(key=key, template=shell.template, cells=cells, thresholds=thresholds_for(cells)), X


def build_table(
    cost_model: CostModel,
    spec: CardSpec,
    identity: DeviceIdentity,
    measurements: Sequence[Measurement],
    kernel_names: Sequence[str],
    *,
    quality: dict | None = None,
    candidates: int = CANDIDATES_PER_CELL,
    class_fields: Sequence[str] = DEFAULT_CLASS_FIELDS,
    work_step: int = WORK_STEP,
    calibration_wall_s: float | None = None,
    notes: Sequence[str] = (),
    measured_entries: bool = True,
    guard: Guard | None = None,
) -> ThresholdTable:
    """A decision map for every measured problem class, from `cost_model` (fitted on `spec`'s
    features) and `measurements` (any status; unsupported ones are not counted as measured).
    `measured_entries`: keep each measured problem as an exact entry; `guard`: the verdict or None.
    """
    if not measurements:
        raise ValueError("build_table needs the measurements calibration made; got none (run `attn-dispatch calibrate`)")
    if not 1 <= candidates <= MAX_CANDIDATES:
        raise ValueError(f"candidates must lie in [1, {MAX_CANDIDATES}] (what a table cell may list), got {candidates}")
    for name in kernel_names:
        kernel_named(name)  # ValueError for names that are not ours
    fields = check_class_fields(tuple(class_fields))
    by_class: dict[ClassKey, list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_class[class_key(m.problem, fields=fields, work_step=work_step)].append(m)
    problems = [m.problem for m in measurements]
    built = {
        key: _build_class(key, points, _grid(problems, key.causal), cost_model, spec, kernel_names,
                          identity.device_type, candidates)
        for key, points in sorted(by_class.items())
    }
    classes = {key: table_class for key, (table_class, _) in built.items()}
    embedded = embed(cost_model, spec, _check_rows(np.vstack([X for _, X in built.values()])))
    if embedded is None:
        notes = (*notes, "the cost model could not be embedded (its export did not reproduce it): the analytic prior ranks")
    provenance = Provenance(
        identity=identity, created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        points_measured=sum(m.status != "unsupported" for m in measurements), calibration_wall_s=calibration_wall_s,
        software=software_versions(), notes=tuple(notes),
    )
    return ThresholdTable(provenance=provenance, spec=spec, quality=dict(quality or {}), classes=classes,
                          models=(embedded,) if embedded else (), class_fields=fields, work_step=work_step,
                          entries=entries_from_measurements(measurements) if measured_entries else {}, guard=guard)


# The embedded trees are checked against the estimator on at most this many grid rows (evenly
# spread): a wrong export shows on any row.
EXPORT_CHECK_ROWS = 2000


def _check_rows(X: np.ndarray) -> np.ndarray:
    if len(X) <= EXPORT_CHECK_ROWS:
        return X
    return X[np.linspace(0, len(X) - 1, EXPORT_CHECK_ROWS).astype(np.int64)]


