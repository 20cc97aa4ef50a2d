"""From measurements to a table in one call (what `attn-dispatch calibrate` runs at its end).

Evaluate on a held-out split of problems (the model's choices and the table's), refit on every
point, build the table and record the held-out quality in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from sklearn.base import clone

from attn_dispatch.kernels.assumed_backends import assume_backends_available
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import TrainingSet, training_set
from attn_dispatch.models.identity import CardSpec, DeviceIdentity, spec_for
from attn_dispatch.models.measured import entries_from_measurements
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.quality import (
    Quality,
    choice_quality,
    decide_verdict,
    default_choice_quality,
    holdout_fit,
)
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.table_build import CANDIDATES_PER_CELL, build_table

# Fewer measured problems than this and a held-out split says nothing: the table is built
# without a quality section (and says so in its notes).
MIN_PROBLEMS_FOR_HOLDOUT = 5


def table_choices(table: ThresholdTable, data: TrainingSet) -> np.ndarray:
    """For each row of `data`: its kernel's rank position in the table's ranking of its problem
    among the kernels measured for that problem (0 = the table's first choice)."""
    names_by_group: dict[int, list[str]] = defaultdict(list)
    for group, name in zip(data.groups.tolist(), data.kernels, strict=True):
        names_by_group[group].append(name)
    order: dict[tuple[int, str], int] = {}
    for index, group in enumerate(data.groups.tolist()):
        if (group, data.kernels[index]) in order:
            continue
        ranking = table.rank(data.problems[index], [kernel_named(n) for n in names_by_group[group]])
        for position, (name, _) in enumerate(ranking):
            order[(group, name)] = position
    return np.array([order.get((g, n), len(order)) for g, n in zip(data.groups.tolist(), data.kernels, strict=True)], dtype=float)


def fit_and_build(
    measurements: Sequence[Measurement],
    identity: DeviceIdentity,
    *,
    kernel_names: Sequence[str],
    holdout_fraction: float = 0.2,
    seed: int = 0,
    spec: CardSpec | None = None,
    model: CostModel | None = None,
    candidates: int = CANDIDATES_PER_CELL,
    calibration_wall_s: float | None = None,
) -> tuple[ThresholdTable, CostModel, Quality | None]:
    """Fit the cost model, evaluate it on a problem-grouped held-out split, and build the table.

    Returns (table, model refitted on every usable point, held-out quality or None under
    `MIN_PROBLEMS_FOR_HOLDOUT` problems). `spec` defaults to `spec_for(identity)`, `model` to
    `CostModel()`.
    """
    # The card may not be this machine (a CPU refitting a GPU calibration): its backends ran there.
    with assume_backends_available():
        spec = spec if spec is not None else spec_for(identity)
        template = model if model is not None else CostModel()
        data = training_set(measurements, spec)
        quality, notes, guard = None, [], None
        if data.n_problems >= MIN_PROBLEMS_FOR_HOLDOUT:
            holdout = holdout_fit(data, template, holdout_fraction=holdout_fraction, seed=seed)
            train, test, train_model = holdout.train, holdout.test, holdout.fitted
            train_problems = set(data.subset(train).problems)
            train_points = [m for m in measurements if m.problem in train_problems]
            held_out = data.subset(test)

            def scored(table: ThresholdTable):
                return choice_quality(held_out.groups, np.exp(held_out.y), table_choices(table, held_out),
                                      median_error=held_out.median_error)

            build = dict(kernel_names=kernel_names, candidates=candidates)
            unguarded = build_table(train_model, spec, identity, train_points, measured_entries=False, **build)
            with_entries = unguarded.with_entries(entries_from_measurements(train_points).values())
            default = default_choice_quality(held_out)
            guard = decide_verdict(scored(with_entries), holdout.quality.prior, default)
            quality = replace(
                holdout.quality, table=scored(unguarded), default=default,
                guarded=scored(replace(with_entries, guard=guard)), verdict=guard.describe(),
            )
        else:
            notes.append(f"only {data.n_problems} problems measured: no held-out quality (needs {MIN_PROBLEMS_FOR_HOLDOUT})")
        final = clone(template).fit(data.X, data.y)
        table = build_table(
            final, spec, identity, measurements, kernel_names, quality=quality.to_dict() if quality else None,
            candidates=candidates, calibration_wall_s=calibration_wall_s, notes=notes, guard=guard,
        )
        return table, final, quality
