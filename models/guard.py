"""The quality guard: a table is used for choosing only where its data says it beats doing nothing.

Two references are scored on the same held-out problems as the table (`models.fit`): the
analytic prior, and "always PyTorch's default" (``sdpa_default``). The table's verdict
(`decide_verdict`) is the one that measured best; a table that loses to either reference is
stored saying so and ranks by that reference (measured entries still come first). Inside a table
that keeps its verdict, every (class, bucket) region where the model's out-of-fold pick for a
measured problem was slower than PyTorch's default beyond the measurements' spread keeps the
default first (`regions_losing_to_default`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.base import clone
from sklearn.model_selection import GroupKFold

from attn_dispatch.models.buckets import bucket_of, class_key
from attn_dispatch.models.dataset import TrainingSet
from attn_dispatch.models.measured import DEFAULT_KERNEL, spread_of
from attn_dispatch.models.quality import ChoiceQuality, choice_quality

VERDICTS = ("table", "prior", "default")
"""table: the table's model (or decision map) ranks; prior: the analytic prior does; default:
PyTorch's default goes first, the prior orders the rest."""

GUARD_FOLDS = 4
"""Folds of the out-of-fold predictions the region guard reads (every measured problem is
predicted by a model that did not see it); 4 fits of ~1-2 s each on the 2-core dev VM for the
160-254 problems of a calibration."""


@dataclass(frozen=True)
class Guard:
    """A table's verdict and why (one line: the three mean slowdowns it was decided on)."""

    verdict: str
    reason: str

    def describe(self) -> str:
        """One line for `show`, `explain`, `devices` and the calibrate summary."""
        if self.verdict == "table":
            return f"quality guard: the table's choices serve ({self.reason})"
        who = "PyTorch's default" if self.verdict == "default" else "the analytic prior"
        return f"quality guard: the table's model lost on its held-out data, {who} serves outside measured buckets ({self.reason})"


def default_choice_quality(data: TrainingSet) -> ChoiceQuality:
    """The choices of "always PyTorch's default" on `data` (problems without a timed
    ``sdpa_default`` are left out: there the reference does not exist)."""
    is_default = np.array([name == DEFAULT_KERNEL for name in data.kernels])
    with_default = np.isin(data.groups, np.unique(data.groups[is_default]))
    rows = np.flatnonzero(with_default)
    return choice_quality(data.groups[rows], np.exp(data.y[rows]), np.where(is_default[rows], 0.0, 1.0),
                          median_error=data.median_error[rows])


def _mean(quality: ChoiceQuality | None) -> float:
    value = quality.mean_slowdown if quality is not None and quality.n_problems else float("nan")
    return value if np.isfinite(value) else float("inf")


def decide_verdict(table: ChoiceQuality, prior: ChoiceQuality, default: ChoiceQuality | None) -> Guard:
    """The reference (or the table) with the lowest held-out mean slowdown; the table keeps the
    verdict on a tie, and PyTorch's default beats the prior on one."""
    scores = {"table": _mean(table), "default": _mean(default), "prior": _mean(prior)}
    reason = ", ".join(f"{name} {value:.1%}" for name, value in scores.items() if np.isfinite(value))
    reason = f"held-out mean slowdown: {reason}" if reason else "not evaluated"
    preference = ("table", "default", "prior")
    best = min(preference, key=lambda name: (scores[name], preference.index(name)))
    return Guard(best if np.isfinite(scores[best]) else "table", reason)


def out_of_fold_predictions(data: TrainingSet, template, *, folds: int = GUARD_FOLDS) -> np.ndarray:
    """``[n]`` predicted log seconds of each row by a clone of `template` fitted on the other
    folds (grouped by problem). Rows of a data set with fewer problems than folds get NaN."""
    predicted = np.full(len(data.y), np.nan)
    if data.n_problems < folds:
        return predicted
    for train, test in GroupKFold(n_splits=folds).split(data.X, data.y, data.groups):
        predicted[test] = clone(template).fit(data.X[train], data.y[train]).predict(data.X[test])
    return predicted


def regions_losing_to_default(
    data: TrainingSet, predicted: np.ndarray, *, class_fields: Sequence[str], work_step: int
) -> set[tuple]:
    """``{(ClassKey, (q bucket, kv bucket))}`` where, for some measured problem, the kernel with
    the lowest `predicted` time measured slower than ``sdpa_default`` beyond both spreads
    (`models.measured.spread_of`). Rows whose prediction is NaN are skipped."""
    regions: set[tuple] = set()
    fields = tuple(class_fields)
    for group in np.unique(data.groups):
        rows = np.flatnonzero((data.groups == group) & np.isfinite(predicted))
        names = [data.kernels[i] for i in rows]
        if DEFAULT_KERNEL not in names or len(rows) < 2:
            continue
        chosen = rows[int(np.argmin(predicted[rows]))]
        default = rows[names.index(DEFAULT_KERNEL)]
        chosen_low, _ = spread_of(float(np.exp(data.y[chosen])), float(data.median_error[chosen]))
        _, default_high = spread_of(float(np.exp(data.y[default])), float(data.median_error[default]))
        if chosen_low > default_high:
            problem = data.problems[chosen]
            regions.add((class_key(problem, fields=fields, work_step=work_step), bucket_of(problem)))
    return regions
