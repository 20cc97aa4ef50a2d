"""Held-out cost-model quality on the committed H200 calibrations, on all points and on the
reliably timed ones only (>= 3 timed samples; suspected losers were timed once, cold).

The two subsets are not equally hard: the reliable one keeps few, mostly near-tied kernels per
problem. A random pick's mean slowdown on the same held-out problems is printed beside each score
so they can be compared.

    python -m bench.model_quality_reliable                 # the prior as shipped
    python -m bench.model_quality_reliable --forced-backend-factor 1.0   # the prior before the fix
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

import attn_dispatch.models.priors as priors
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import training_set
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.quality import choice_quality, split_by_problem

RESULTS = Path(__file__).resolve().parent / "results" / "h200_calibrations"
RUNS = ("run1_1gpu", "run2_2gpu", "run3_batched")
RELIABLE_REPS = 3
SPLITS = 5
HOLDOUT = 0.2


def load(run: str) -> list[Measurement]:
    with gzip.open(RESULTS / f"{run}_measurements.jsonl.gz", "rt") as handle:
        return [Measurement.from_dict(json.loads(line)) for line in handle]


def random_pick_slowdown(groups: np.ndarray, seconds: np.ndarray) -> float:
    """Mean over problems of the expected slowdown of a kernel picked at random."""
    per_problem = []
    for group in np.unique(groups):
        times = seconds[groups == group]
        per_problem.append(float(np.mean(times / times.min() - 1.0)))
    return float(np.mean(per_problem))


def quality(points: list[Measurement], spec) -> tuple[float, float, float, float, int, int]:
    """(model top-1, model / prior / random-pick mean slowdown, points, problems), mean of splits."""
    data = training_set(points, spec)
    scores = []
    for seed in range(SPLITS):
        train, test = split_by_problem(data, holdout_fraction=HOLDOUT, seed=seed)
        model = CostModel().fit(data.X[train], data.y[train])
        measured, groups = np.exp(data.y[test]), data.groups[test]
        learned = choice_quality(groups, measured, np.exp(model.predict(data.X[test])))
        prior = choice_quality(groups, measured, np.exp(data.X[test, model.prior_column]))
        scores.append((learned.top1_accuracy, learned.mean_slowdown, prior.mean_slowdown,
                       random_pick_slowdown(groups, measured)))
    top1, slowdown, prior_slowdown, random_slowdown = np.mean(scores, axis=0)
    return top1, slowdown, prior_slowdown, random_slowdown, len(data), data.n_problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forced-backend-factor", type=float, default=priors.FORCED_BACKEND_FACTOR)
    args = parser.parse_args()
    priors.FORCED_BACKEND_FACTOR = args.forced_backend_factor
    with open(RESULTS / "run1_1gpu_summary.json") as handle:
        spec = priors.spec_for(DeviceIdentity.from_dict(json.load(handle)["identity"]), probe=False)
    for run in RUNS:
        points = load(run)
        for name, subset in (("all points", points), (f">= {RELIABLE_REPS} samples", [m for m in points if m.reps >= RELIABLE_REPS])):
            top1, slowdown, prior_slowdown, random_slowdown, n_points, n_problems = quality(subset, spec)
            print(f"{run} {name}: {n_points} points, {n_problems} problems; model top-1 {top1:.2f}, "
                  f"mean slowdown {slowdown:.3f}; prior {prior_slowdown:.3f}; random pick {random_slowdown:.3f}")


if __name__ == "__main__":
    main()
