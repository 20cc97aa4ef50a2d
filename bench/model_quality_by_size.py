"""Where the cost model's held-out losses are: its quality by how long a problem's fastest kernel takes.

Repeated 5-fold splits by problem on committed H200 calibrations (the current model,
`models.cost_model.CostModel()`); every held-out problem is scored once per repeat and put in a
band by its measured fastest time. Per band: problems per repeat, mean slowdown of the model's pick
(the issue's metric: every problem counts alike), top-1, and the time-weighted slowdown (the
extra time of the model's picks over the fastest, summed, divided by the fastest times summed:
what a workload running each problem once would lose).

    python -m bench.model_quality_by_size                    # runs 6 and 4, ~1 minute
    python -m bench.model_quality_by_size --runs run6_more_problems --repeats 10
"""

from __future__ import annotations

import argparse

import numpy as np

from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import TrainingSet, training_set
from bench.model_quality_compare import kfold_splits, load

BANDS_S = ((0.0, 1e-4, "< 0.1 ms"), (1e-4, 1e-3, "0.1-1 ms"), (1e-3, float("inf"), "> 1 ms"))


def held_out_choices(data: TrainingSet, repeats: int) -> np.ndarray:
    """``[problems x repeats, 3]``: fastest measured seconds, slowdown of the model's pick, pick == fastest."""
    rows = []
    for train, test in kfold_splits(data, repeats):
        predicted = CostModel().fit(data.X[train], data.y[train]).predict(data.X[test])
        measured, groups = data.y[test], data.groups[test]
        for problem in np.unique(groups):
            idx = np.flatnonzero(groups == problem)
            fastest, picked = idx[np.argmin(measured[idx])], idx[np.argmin(predicted[idx])]
            rows.append((np.exp(measured[fastest]), np.exp(measured[picked] - measured[fastest]) - 1, picked == fastest))
    return np.array(rows, dtype=float)


def time_weighted(rows: np.ndarray) -> float:
    return float(np.sum(rows[:, 0] * rows[:, 1]) / np.sum(rows[:, 0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["run6_more_problems", "run4_fixed_timer"])
    parser.add_argument("--repeats", type=int, default=4, help="repeats of the 5-fold split")
    args = parser.parse_args()
    for run in args.runs:
        points, spec = load(run)
        rows = held_out_choices(training_set(points, spec), args.repeats)
        print(f"{run}: {args.repeats} x 5-fold by problem")
        for low, high, label in BANDS_S:
            band = rows[(rows[:, 0] >= low) & (rows[:, 0] < high)]
            print(f"  fastest {label:9s} {len(band) / args.repeats:5.0f} problems: mean slowdown {band[:, 1].mean():6.1%}, "
                  f"top-1 {band[:, 2].mean():4.0%}, time-weighted slowdown {time_weighted(band):6.1%}")
        print(f"  all {len(rows) / args.repeats:15.0f} problems: mean slowdown {rows[:, 1].mean():6.1%}, "
              f"top-1 {rows[:, 2].mean():4.0%}, time-weighted slowdown {time_weighted(rows):6.1%}")


if __name__ == "__main__":
    main()
