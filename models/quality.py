"""Held-out quality of a cost model, measured the way the dispatcher uses it: does the kernel it
predicts fastest for a problem it never saw equal the measured fastest, and how much slower is it
when not? And the guard a table stores from it (`Guard`, `decide_verdict`): what ranks outside
measured buckets, the table's model, the analytic prior or PyTorch's default, whichever scored
best on held-out problems.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from attn_dispatch.models.dataset import TrainingSet
from attn_dispatch.models.measured import DEFAULT_KERNEL

if TYPE_CHECKING:  # fitting and rank statistics import scikit-learn and scipy where they run, not here
    from attn_dispatch.models.cost_model import CostModel

# Two kernels whose measured medians differ by less than this fraction are a tie whatever the
# noise estimate says: 1% is below what repeated calibrations of one point reproduce.
TIE_TOLERANCE = 0.01
# ... or by less than this many standard errors of their difference (a two-sided ~95% test).
TIE_STANDARD_ERRORS = 2.0


@dataclass(frozen=True)
class ChoiceQuality:
    """How good the predicted-fastest choices are over the problems with two or more timed kernels:
    `top1_within_noise` also counts a choice the measurements cannot tell from the fastest
    (`TIE_TOLERANCE`, `TIE_STANDARD_ERRORS`); slowdowns are time of the choice / fastest - 1;
    `spearman` is the mean per-problem rank correlation."""

    top1_accuracy: float
    top1_within_noise: float
    mean_slowdown: float
    worst_slowdown: float
    spearman: float
    n_problems: int
    geomean_slowdown: float = float("nan")


def choice_quality(
    groups: np.ndarray, measured_s: np.ndarray, predicted_s: np.ndarray, *, median_error: np.ndarray | None = None
) -> ChoiceQuality:
    """Score predicted times (or any monotone transform) against measured ones, per problem id in
    `groups`; `median_error`: each measured median's relative standard error (None: zero)."""
    from scipy.stats import spearmanr  # imported where quality is scored, never on an inference call

    if median_error is None:
        median_error = np.zeros(len(measured_s))
    hits, tie_hits, slowdowns, correlations = [], [], [], []
    for group in np.unique(groups):
        rows = np.flatnonzero(groups == group)
        if len(rows) < 2:
            continue
        measured, predicted, error = measured_s[rows], predicted_s[rows], median_error[rows]
        best_row, chosen_row = np.argmin(measured), np.argmin(predicted)
        best, chosen = measured[best_row], measured[chosen_row]
        slowdown = chosen / best - 1.0
        noise = TIE_STANDARD_ERRORS * float(np.hypot(error[best_row], error[chosen_row]))
        hits.append(float(chosen == best))
        tie_hits.append(float(slowdown <= max(TIE_TOLERANCE, noise)))
        slowdowns.append(slowdown)
        if len(rows) > 2 and np.ptp(predicted) > 0 and np.ptp(measured) > 0:
            correlations.append(spearmanr(predicted, measured).statistic)
    if not hits:
        return ChoiceQuality(float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), 0)
    return ChoiceQuality(
        top1_accuracy=float(np.mean(hits)), top1_within_noise=float(np.mean(tie_hits)),
        mean_slowdown=float(np.mean(slowdowns)), worst_slowdown=float(np.max(slowdowns)),
        spearman=float(np.mean(correlations)) if correlations else float("nan"), n_problems=len(hits),
        geomean_slowdown=float(np.expm1(np.mean(np.log1p(slowdowns)))),
    )


@dataclass(frozen=True)
class Quality:
    """Held-out evaluation (a table's ``quality``): the model's and the analytic prior's choices."""

    model: ChoiceQuality
    prior: ChoiceQuality
    n_points_fit: int
    n_problems_fit: int
    n_points_test: int
    n_problems_test: int
    holdout_fraction: float
    seed: int
    description: str
    table: ChoiceQuality | None = None
    """The threshold table's choices on the same held-out problems, when evaluated."""
    default: ChoiceQuality | None = None
    """"Always PyTorch's default" on the same held-out problems (`models.quality`), when evaluated."""
    guarded: ChoiceQuality | None = None
    """The table after the quality guard (its verdict, no measured entries of the held-out
    problems: they were held out), when evaluated."""
    verdict: str | None = None
    """The quality guard's line (`models.quality.Guard.describe`), when evaluated."""

    def to_dict(self) -> dict:
        """Flat JSON-ready dict (the table's ``quality`` section)."""
        flat = {f"{key}": value for key, value in asdict(self.model).items()}
        flat.update({f"prior_{key}": value for key, value in asdict(self.prior).items()})
        for prefix, part in (("table", self.table), ("default", self.default),
                             ("guarded", self.guarded)):
            if part is not None:
                flat.update({f"{prefix}_{key}": value for key, value in asdict(part).items()})
        flat = {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in flat.items()}
        flat.update(
            n_points_fit=self.n_points_fit, n_problems_fit=self.n_problems_fit,
            n_points_test=self.n_points_test, n_problems_test=self.n_problems_test,
            holdout_fraction=self.holdout_fraction, seed=self.seed, description=self.description,
        )
        return flat

    def summary(self) -> str:
        """The held-out comparison in words (`models.table_summary`), then the quality guard's line."""
        from attn_dispatch.models.table_summary import held_out_lines

        return "\n".join([*held_out_lines(self.to_dict()), *([self.verdict] if self.verdict else [])])


def split_by_problem(data: TrainingSet, *, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, test): every kernel of a problem lands on the same side."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must lie in (0, 1), got {holdout_fraction}")
    if data.n_problems < 2:
        raise ValueError(
            f"a held-out evaluation needs at least 2 measured problems, got {data.n_problems}; measure more shapes"
        )
    from sklearn.model_selection import GroupShuffleSplit  # fitting only: scoring a table needs numpy alone

    splitter = GroupShuffleSplit(n_splits=1, test_size=holdout_fraction, random_state=seed)
    train, test = next(splitter.split(data.X, data.y, data.groups))
    return train, test


@dataclass(frozen=True)
class HoldoutFit:
    """A held-out evaluation with what produced it: the model fitted on the training rows (so a
    caller evaluating more on the same split need not fit it again) and the split's row indices."""

    quality: Quality
    fitted: CostModel
    train: np.ndarray
    test: np.ndarray


def holdout_fit(data: TrainingSet, model: CostModel, *, holdout_fraction: float = 0.2, seed: int = 0) -> HoldoutFit:
    """`holdout_quality`, also returning the fitted clone and the split."""
    train, test = split_by_problem(data, holdout_fraction=holdout_fraction, seed=seed)
    from sklearn.base import clone  # fitting only

    fitted = clone(model).fit(data.X[train], data.y[train])
    measured = np.exp(data.y[test])
    groups, error = data.groups[test], data.median_error[test]
    prior_column = getattr(model, "prior_column", None)
    prior = data.X[test, prior_column] if prior_column is not None else np.zeros(len(test))
    quality = Quality(
        model=choice_quality(groups, measured, fitted.predict(data.X[test]), median_error=error),
        prior=choice_quality(groups, measured, prior, median_error=error),
        n_points_fit=len(train), n_problems_fit=len(set(data.groups[train].tolist())),
        n_points_test=len(test), n_problems_test=len(set(groups.tolist())),
        holdout_fraction=holdout_fraction, seed=seed, description=model.describe(),
    )
    return HoldoutFit(quality, fitted, train, test)


def holdout_quality(
    data: TrainingSet, model: CostModel, *, holdout_fraction: float = 0.2, seed: int = 0
) -> Quality:
    """Fit a clone of `model` on a problem-grouped split of `data` and score the rest."""
    return holdout_fit(data, model, holdout_fraction=holdout_fraction, seed=seed).quality


VERDICTS = ("table", "prior", "default")
"""table: the table's model ranks; prior: the analytic prior does; default:
PyTorch's default goes first, the prior orders the rest."""

VERDICT_WORDS = {
    "table": "the table's model chooses",
    "default": "PyTorch's default serves, not the table's model",
    "prior": "the analytic prior (an estimate from the card's spec sheet) ranks kernels, not the table's model",
}
"""What each verdict means for the dispatcher, in `Guard.describe`."""

SCORED_REASON = "held-out mean slowdown"
"""How `decide_verdict`'s reason starts (stored tables keep it): the verdict came from the scores."""

@dataclass(frozen=True)
class Guard:
    """A table's verdict and why (one line: the three mean slowdowns it was decided on)."""

    verdict: str
    reason: str

    def describe(self) -> str:
        """One line for `show`, `explain`, `devices` and the calibrate summary: who ranks kernels
        outside measured buckets, and why."""
        why = self.reason
        if SCORED_REASON in why:
            why += "; the lowest average slowdown decides, not how often a pick is the fastest"
        return f"outside measured buckets: {VERDICT_WORDS.get(self.verdict, self.verdict)} ({why})"


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
    names = {"table": "table", "default": "always PyTorch's default", "prior": "analytic prior"}
    reason = ", ".join(f"{names[name]} {value:.1%}" for name, value in scores.items() if np.isfinite(value))
    reason = f"{SCORED_REASON} over the fastest kernel: {reason}" if reason else "not evaluated"
    preference = ("table", "default", "prior")
    best = min(preference, key=lambda name: (scores[name], preference.index(name)))
    return Guard(best if np.isfinite(scores[best]) else "table", reason)
