"""How the cost model's held-out quality grows with the number of calibrated problems.

Repeated 5-fold splits by problem on one committed H200 calibration; inside each training fold,
the model (`models.cost_model.CostModel()`, the default) is fit on seeded subsets of 25%, 50%,
75% and 100% of the training problems and scored on the same held-out fold, so the fractions are
compared on identical test problems. Prints, per training size: mean slowdown of the predicted
fastest kernel against the measured fastest, top-1 accuracy, top-1 up to measurement noise (mean
± standard deviation over folds), and a least-squares power law ``slowdown = a * problems^-b``
fitted to the mean slowdowns, with the training size at which that law would reach 2%. The law is
an extrapolation from at most ~200 problems, not a measurement.

    python -m bench.model_learning_curve                             # run 6 (254 problems), ~3 minutes
    python -m bench.model_learning_curve --run run4_fixed_timer --repeats 2
"""

from __future__ import annotations

import argparse

import numpy as np

from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import TrainingSet, training_set
from bench.model_quality_compare import _row, kfold_splits, load

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
TARGET_SLOWDOWN = 0.02  # the bar for mean slowdown


def subsample_problems(data: TrainingSet, rows: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """The rows of `rows` whose problem is in a seeded `fraction` of the problems they cover."""
    problems = np.unique(data.groups[rows])
    keep = np.random.default_rng(seed).permutation(problems)[: max(2, round(fraction * len(problems)))]
    return rows[np.isin(data.groups[rows], keep)]


def curve(data: TrainingSet, repeats: int) -> dict[float, tuple[np.ndarray, list[int]]]:
    """Fraction -> (``[folds, 5]`` quality rows as `_row` gives them, training problems per fold)."""
    out: dict[float, tuple[list, list]] = {f: ([], []) for f in FRACTIONS}
    for index, (train, test) in enumerate(kfold_splits(data, repeats)):
        held_out = data.subset(test)
        for fraction in FRACTIONS:
            rows = subsample_problems(data, train, fraction, seed=index)
            model = CostModel().fit(data.X[rows], data.y[rows])
            out[fraction][0].append(_row(held_out, model.predict(held_out.X)))
            out[fraction][1].append(len(np.unique(data.groups[rows])))
    return {f: (np.array(r, dtype=float), n) for f, (r, n) in out.items()}


def power_law(sizes: np.ndarray, slowdowns: np.ndarray) -> tuple[float, float]:
    """(a, b) of ``slowdown = a * size^-b``, least squares in log-log."""
    slope, intercept = np.polyfit(np.log(sizes), np.log(slowdowns), 1)
    return float(np.exp(intercept)), float(-slope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="run6_more_problems")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the 5-fold split")
    args = parser.parse_args()
    points, spec = load(args.run)
    data = training_set(points, spec)
    print(f"{args.run}: {len(data)} points, {data.n_problems} problems; {args.repeats} x 5-fold by problem")
    print(f"  {'training problems':>17s} {'points':>7s} {'mean slowdown':>16s} {'top-1':>10s} {'top-1 noise':>12s}")
    results = curve(data, args.repeats)
    sizes, means = [], []
    for rows, problems in results.values():
        size = float(np.mean(problems))
        points_used = round(size / data.n_problems * len(data))
        sizes.append(size)
        means.append(rows[:, 0].mean())
        print(f"  {size:17.0f} {points_used:7d} {rows[:, 0].mean():8.1%} ± {rows[:, 0].std():5.1%} "
              f"{rows[:, 2].mean():5.0%} ± {rows[:, 2].std():3.0%} {rows[:, 3].mean():6.0%} ± {rows[:, 3].std():3.0%}")
    a, b = power_law(np.array(sizes), np.array(means))
    reach = (a / TARGET_SLOWDOWN) ** (1 / b) if b > 0 else float("inf")
    print(f"  power law: mean slowdown = {a:.2f} * problems^-{b:.2f}; {TARGET_SLOWDOWN:.0%} at about "
          f"{reach:,.0f} training problems (extrapolated)")


if __name__ == "__main__":
    main()
