"""The quality guard: a table is used for choosing only where its data says it beats doing nothing.

Two references are scored on the same held-out problems as the table (`models.fit`): the
analytic prior, and "always PyTorch's default" (``sdpa_default``). The table's verdict
(`decide_verdict`) is the one that measured best; a table that loses to either reference is
stored saying so and ranks by that reference (measured entries still come first).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_dispatch.models.dataset import TrainingSet
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.quality import ChoiceQuality, choice_quality

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
