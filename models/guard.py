"""The quality guard: a table is used for choosing only where its data says it beats doing nothing.

Two references are scored on the same held-out problems as the table (`models.fit`): the
analytic prior, and "always PyTorch's default" (``sdpa_default``). The table's verdict
(`decide_verdict`) is the one that measured best; a table that loses to either reference is
stored saying so and ranks by that reference (measured entries still come first). Inside a table
that keeps its verdict, two guards keep PyTorch's default where the data says the model's pick
loses to it:
- a margin (`choose_default_margin`): the model's pick replaces the default only when it is
  predicted faster by more than this fraction; chosen per table from out-of-fold predictions;
- regions (`regions_losing_to_default`): every (class, bucket) where the out-of-fold pick, after
  the margin, still measured slower than the default beyond both spreads keeps the default first,
  unless the model predicts the default slower than its pick by more than the model erred by
  there (the region's error factor: a prediction that wrong still leaves the pick faster).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn_dispatch.models.buckets import bucket_of, class_key
from attn_dispatch.models.dataset import TrainingSet
from attn_dispatch.models.measured import DEFAULT_KERNEL, spread_of
from attn_dispatch.models.quality import ChoiceQuality, choice_quality

VERDICTS = ("table", "prior", "default")
"""table: the table's model (or decision map) ranks; prior: the analytic prior does; default:
PyTorch's default goes first, the prior orders the rest."""

VERDICT_WORDS = {
    "table": "the table's choices serve",
    "default": "PyTorch's default serves outside measured buckets, not the table's model",
    "prior": "the analytic prior ranks kernels outside measured buckets, not the table's model",
}
"""What each verdict means for the dispatcher, in `Guard.describe`."""

SCORED_REASON = "held-out mean slowdown"
"""How `decide_verdict`'s reason starts (stored tables keep it): the verdict came from the scores."""

GUARD_FOLDS = 4
"""Folds of the out-of-fold predictions the region guard reads (every measured problem is
predicted by a model that did not see it); 4 fits of ~1-2 s each on the 2-core dev VM for the
160-254 problems of a calibration."""


DEFAULT_MARGINS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
"""Margins `choose_default_margin` tries. 5-fold out-of-fold on the committed 2-core CPU
calibration the best was 0.2 (mean pick / fastest 1.056 -> 1.038, picks slower than the default
20 -> 1 of 160 problems); on the H200's run 6 it was 0 (every margin cost: 1.167 -> 1.207 at 0.2)."""

MARGIN_TIE = 0.002
"""Margins whose out-of-fold mean slowdown is within this of the best count as equal: the larger (more
cautious) one is kept."""


@dataclass(frozen=True)
class Guard:
    """A table's verdict and why (one line: the three mean slowdowns it was decided on), and the
    margin by which the model's pick must beat PyTorch's default's predicted time."""

    verdict: str
    reason: str
    default_margin: float = 0.0

    def describe(self) -> str:
        """One line for `show`, `explain`, `devices` and the calibrate summary: who ranks kernels
        outside measured buckets, and why."""
        why = self.reason
        if SCORED_REASON in why:
            why += "; the lowest average slowdown decides, not how often a pick is the fastest"
        if self.verdict == "table" and self.default_margin:
            why += (f"; the model's pick replaces PyTorch's default only where predicted over "
                    f"{1 + self.default_margin:.3g}x faster")
        return f"quality guard: {VERDICT_WORDS.get(self.verdict, self.verdict)} ({why})"


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


def decide_verdict(table: ChoiceQuality, prior: ChoiceQuality, default: ChoiceQuality | None, *,
                   default_margin: float = 0.0) -> Guard:
    """The reference (or the table) with the lowest held-out mean slowdown; the table keeps the
    verdict on a tie, and PyTorch's default beats the prior on one."""
    scores = {"table": _mean(table), "default": _mean(default), "prior": _mean(prior)}
    names = {"table": "table", "default": "always PyTorch's default", "prior": "analytic prior"}
    reason = ", ".join(f"{names[name]} {value:.1%}" for name, value in scores.items() if np.isfinite(value))
    reason = f"{SCORED_REASON} over the fastest kernel: {reason}" if reason else "not evaluated"
    preference = ("table", "default", "prior")
    best = min(preference, key=lambda name: (scores[name], preference.index(name)))
    return Guard(best if np.isfinite(scores[best]) else "table", reason, default_margin)


def out_of_fold_predictions(data: TrainingSet, template, *, folds: int = GUARD_FOLDS) -> np.ndarray:
    """``[n]`` predicted log seconds of each row by a clone of `template` fitted on the other
    folds (grouped by problem). Rows of a data set with fewer problems than folds get NaN."""
    predicted = np.full(len(data.y), np.nan)
    if data.n_problems < folds:
        return predicted
    from sklearn.base import clone  # fitting only: a table's guard is read without scikit-learn
    from sklearn.model_selection import GroupKFold

    for train, test in GroupKFold(n_splits=folds).split(data.X, data.y, data.groups):
        predicted[test] = clone(template).fit(data.X[train], data.y[train]).predict(data.X[test])
    return predicted


def _guarded_row(rows: np.ndarray, names: list[str], predicted: np.ndarray, margin: float) -> int:
    """The row the guarded model picks among `rows`: its fastest prediction, unless PyTorch's
    default is predicted within `margin` of it."""
    chosen = rows[int(np.argmin(predicted[rows]))]
    if DEFAULT_KERNEL in names:
        default = rows[names.index(DEFAULT_KERNEL)]
        if predicted[default] <= predicted[chosen] + np.log1p(margin):
            return default
    return chosen


def _groups_with_default(data: TrainingSet, predicted: np.ndarray):
    """(rows, kernel names) of each problem with a timed default, at least two predicted rows."""
    for group in np.unique(data.groups):
        rows = np.flatnonzero((data.groups == group) & np.isfinite(predicted))
        names = [data.kernels[i] for i in rows]
        if DEFAULT_KERNEL in names and len(rows) >= 2:
            yield rows, names


def choose_default_margin(data: TrainingSet, predicted: np.ndarray, margins: Sequence[float] = DEFAULT_MARGINS) -> float:
    """The margin of `margins` whose guarded out-of-fold picks (`predicted`: log seconds) have the
    lowest mean slowdown over the fastest (the verdict's measure); within `MARGIN_TIE`, the larger. 0 when no
    problem has a timed default."""
    groups = list(_groups_with_default(data, predicted))
    if not groups:
        return 0.0
    scores = []
    for margin in margins:
        logs = [data.y[_guarded_row(rows, names, predicted, margin)] - data.y[rows].min() for rows, names in groups]
        scores.append(float(np.mean(np.expm1(logs))))
    best = min(scores)
    return max(m for m, score in zip(margins, scores, strict=True) if score <= best + MARGIN_TIE)


def regions_losing_to_default(
    data: TrainingSet, predicted: np.ndarray, *, class_fields: Sequence[str], work_step: int, margin: float = 0.0,
) -> dict[tuple, float]:
    """``{(ClassKey, (q bucket, kv bucket)): error factor}`` where, for some measured problem, the
    guarded pick (the lowest `predicted` time, unless PyTorch's default is within `margin` of it)
    measured slower than ``sdpa_default`` beyond both spreads (`models.measured.spread_of`). The
    error factor is the largest such miss in the region: how many times faster than the default
    the model predicted its pick, times how many times slower the pick measured (> 1). Rows whose
    prediction is NaN are skipped."""
    regions: dict[tuple, float] = {}
    fields = tuple(class_fields)
    for rows, names in _groups_with_default(data, predicted):
        chosen = _guarded_row(rows, names, predicted, margin)
        default = rows[names.index(DEFAULT_KERNEL)]
        chosen_low, _ = spread_of(float(np.exp(data.y[chosen])), float(data.median_error[chosen]))
        _, default_high = spread_of(float(np.exp(data.y[default])), float(data.median_error[default]))
        if chosen_low > default_high:
            problem = data.problems[chosen]
            region = (class_key(problem, fields=fields, work_step=work_step), bucket_of(problem))
            error = float(np.exp((predicted[default] - predicted[chosen]) + (data.y[chosen] - data.y[default])))
            regions[region] = max(regions.get(region, 1.0), error)
    return regions
