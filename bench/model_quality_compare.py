"""Held-out cost-model variants on the committed H200 calibrations: the model as it was (raw
residual target, learning rate 0.05), the per-problem-normalised model (the default now), the
analytic prior alone and a random pick, over several problem-grouped splits.

Each split holds out 20% of the problems (`models.quality.split_by_problem`, seeds 0..N-1);
the numbers are the mean and standard deviation over splits of: mean slowdown (measured time of
the predicted fastest kernel / measured best - 1, averaged over held-out problems), worst
slowdown, top-1 accuracy, top-1 up to measurement noise, and the median absolute error of the
predicted seconds (|log|, all held-out points) where the variant predicts seconds. The last
column is the paired difference in mean slowdown from the model before on the same splits:
mean ± standard error (splits where the variant was better).

It also prints the same over repeated 5-fold splits by problem (every problem held out once per
repeat), which are less noisy than random hold-outs.

    python -m bench.model_quality_compare                    # run4 (trusted timer): ~1.5 minutes
    python -m bench.model_quality_compare --repeats 10       # the report's numbers: ~4 minutes
    python -m bench.model_quality_compare --runs run4_fixed_timer run1_1gpu --splits 5
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np

import attn_dispatch.models.priors as priors
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import TrainingSet, training_set
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.quality import choice_quality, split_by_problem

RESULTS = Path(__file__).resolve().parent / "results" / "h200_calibrations"
HOLDOUT = 0.2
BEFORE = "model before (raw residual, lr 0.05)"
VARIANTS = {
    BEFORE: CostModel(normalize="none", learning_rate=0.05),
    "raw residual, lr 0.1": CostModel(normalize="none"),
    "problem-normalised, lr 0.05": CostModel(learning_rate=0.05),
    "problem-normalised, lr 0.1 (default)": CostModel(),
    "problem-normalised, lr 0.1, min leaf 10": CostModel(min_samples_leaf=10),
}
FOLDS = 5


def load(run: str) -> tuple[list[Measurement], priors.CardSpec]:
    with gzip.open(RESULTS / f"{run}_measurements.jsonl.gz", "rt") as handle:
        points = [Measurement.from_dict(json.loads(line)) for line in handle]
    with open(RESULTS / f"{run}_summary.json") as handle:
        spec = priors.spec_for(DeviceIdentity.from_dict(json.load(handle)["identity"]), probe=False)
    return points, spec


def random_pick(groups: np.ndarray, seconds: np.ndarray) -> float:
    """Mean over problems of the expected slowdown of a kernel picked at random."""
    return float(np.mean([np.mean(seconds[groups == g] / seconds[groups == g].min() - 1.0) for g in np.unique(groups)]))


def kfold_splits(data: TrainingSet, repeats: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`FOLDS`-fold splits by problem, reshuffled `repeats` times: every problem held out once a repeat."""
    problems = np.unique(data.groups)
    out = []
    for repeat in range(repeats):
        fold = np.empty(len(problems), dtype=np.int64)
        fold[np.random.default_rng(repeat).permutation(len(problems))] = np.arange(len(problems)) % FOLDS
        row_fold = fold[np.searchsorted(problems, data.groups)]
        out += [(np.flatnonzero(row_fold != k), np.flatnonzero(row_fold == k)) for k in range(FOLDS)]
    return out


def _row(held_out: TrainingSet, predicted_log: np.ndarray) -> tuple[float, ...]:
    q = choice_quality(held_out.groups, np.exp(held_out.y), predicted_log, median_error=held_out.median_error)
    return (q.mean_slowdown, q.worst_slowdown, q.top1_accuracy, q.top1_within_noise,
            float(np.median(np.abs(predicted_log - held_out.y))))


def scores(data: TrainingSet, splits: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Variant -> ``[splits, 5]`` (mean slowdown, worst, top-1, top-1 within noise, |log error|)."""
    out: dict[str, list] = {name: [] for name in ("random pick", "prior alone", *VARIANTS)}
    for train, test in splits:
        held_out = data.subset(test)
        out["random pick"].append((random_pick(held_out.groups, np.exp(held_out.y)), *(np.nan,) * 4))
        out["prior alone"].append(_row(held_out, held_out.X[:, CostModel().prior_column]))
        for name, template in VARIANTS.items():
            model = CostModel(**template.get_params()).fit(data.X[train], data.y[train])
            out[name].append(_row(held_out, model.predict(held_out.X)))
    return {name: np.array(rows, dtype=float) for name, rows in out.items()}


def report(run: str, splits: int, repeats: int) -> None:
    points, spec = load(run)
    data = training_set(points, spec)
    print(f"\n{run}: {len(data)} points, {data.n_problems} problems (mean ± std over splits)")
    holdouts = [split_by_problem(data, holdout_fraction=HOLDOUT, seed=seed) for seed in range(splits)]
    for title, chosen in ((f"{splits} random splits holding out {HOLDOUT:.0%} of problems (seeds 0..{splits - 1})", holdouts),
                          (f"{repeats} x {FOLDS}-fold by problem", kfold_splits(data, repeats))):
        print(f"  {title}")
        print(f"  {'variant':42s} {'mean slowdown':>15s} {'worst':>12s} {'top-1':>11s} {'top-1 noise':>11s} "
              f"{'|log err|':>11s}  {'vs before (paired)':>18s}")
        table = scores(data, chosen)
        before = table[BEFORE][:, 0]
        for name, rows in table.items():
            paired = rows[:, 0] - before
            versus = (f"{paired.mean():+.1%} ± {paired.std() / np.sqrt(len(paired)):.1%} ({(paired < 0).sum()}/{len(paired)})"
                      if name not in (BEFORE, "random pick") else "")
            print(f"  {name:42s} " + " ".join(_cell(rows[:, i], w, f) for i, w, f in (
                (0, 15, "{:.1%}"), (1, 12, "{:.0%}"), (2, 11, "{:.0%}"), (3, 11, "{:.0%}"), (4, 11, "{:.2f}")))
                + f"  {versus:>18s}")


def _cell(values: np.ndarray, width: int, fmt: str) -> str:
    if np.isnan(values).all():
        return f"{'-':>{width}s}"
    return f"{fmt.format(values.mean()) + ' ± ' + fmt.format(values.std()):>{width}s}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["run4_fixed_timer"])
    parser.add_argument("--splits", type=int, default=10, help="random 20%% hold-out splits")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the 5-fold split")
    args = parser.parse_args()
    for run in args.runs:
        report(run, args.splits, args.repeats)


if __name__ == "__main__":
    main()
