"""What first-call tuning would buy, simulated on a recorded calibration (no GPU needed).

    python -m bench.tuning_simulation bench/results/h200_calibrations/run4_fixed_timer

For several held-out splits by problem: fit the cost model on the training problems, then for each
held-out problem take the contenders `dispatcher.tuning.contenders` would time (predicted within
the margin of the best, at most K, plus ``sdpa_default``) and score the measured fastest of them
against the measured fastest of all. The untuned row is the model's own pick. Margins and K are
swept to choose `TUNE_MARGIN` and `MAX_TUNED`.
"""

from __future__ import annotations

import argparse
import gzip
import json

import numpy as np
from sklearn.base import clone

from attn_dispatch.dispatcher import tuning
from attn_dispatch.dispatcher.planning import Option
from attn_dispatch.kernels import kernel_from_name
from attn_dispatch.models.cards import spec_for
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import training_set
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.quality import split_by_problem

SEEDS = 5
HOLDOUT = 0.2
NEAR_BEST = 0.02  # a pick within 2% of the fastest counts as a hit
GRID = ((1.25, 4), (1.5, 4), (1.5, 6), (2.0, 4), (2.0, 6), (3.0, 8))


def simulate(data, margin: float, cap: int) -> dict:
    slowdowns, untuned, timed = [], [], []
    kernels = {}
    for seed in range(SEEDS):
        train, test = split_by_problem(data, holdout_fraction=HOLDOUT, seed=seed)
        model = clone(CostModel()).fit(data.X[train], data.y[train])
        predicted, measured, groups = model.predict(data.X[test]), data.y[test], data.groups[test]
        for problem in np.unique(groups):
            rows = test[groups == problem]
            local = np.where(groups == problem)[0]
            if len(rows) < 2:
                continue
            order = local[np.argsort(predicted[local])]
            options = []
            for i in order:
                name = data.kernels[test[i]]
                kernel = kernels.get(name) or kernels.setdefault(name, _kernel(name))
                options.append(Option(kernel, float(np.exp(predicted[i])), 0))
            with _limits(margin, cap):
                chosen = tuning.contenders(tuple(options))
            names = {o.kernel.name for o in chosen}
            picked = [i for i in order if data.kernels[test[i]] in names]
            best = measured[local].min()
            slowdowns.append(np.exp(min(measured[i] for i in picked) - best) - 1)
            untuned.append(np.exp(measured[order[0]] - best) - 1)
            timed.append(len(picked))
    return {"mean": float(np.mean(slowdowns)), "worst": float(np.max(slowdowns)),
            "hit": float(np.mean(np.array(slowdowns) <= NEAR_BEST)), "timed": float(np.mean(timed)),
            "untuned_mean": float(np.mean(untuned)), "untuned_worst": float(np.max(untuned)),
            "untuned_hit": float(np.mean(np.array(untuned) <= NEAR_BEST)), "problems": len(slowdowns)}


def _kernel(name: str):
    from attn_dispatch.kernels import AccuracyPolicy

    return kernel_from_name(name, policy=AccuracyPolicy.allowing("any"))


class _limits:
    """Temporarily set `tuning.TUNE_MARGIN` and `tuning.MAX_TUNED`."""

    def __init__(self, margin: float, cap: int) -> None:
        self.values = (margin, cap)

    def __enter__(self):
        self.saved = (tuning.TUNE_MARGIN, tuning.MAX_TUNED)
        tuning.TUNE_MARGIN, tuning.MAX_TUNED = self.values

    def __exit__(self, *exc):
        tuning.TUNE_MARGIN, tuning.MAX_TUNED = self.saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="path prefix of <run>_measurements.jsonl.gz and <run>_summary.json")
    args = parser.parse_args()
    identity = DeviceIdentity.from_dict(json.load(open(f"{args.run}_summary.json"))["identity"])
    with gzip.open(f"{args.run}_measurements.jsonl.gz", "rt") as handle:
        points = [Measurement.from_dict(json.loads(line)) for line in handle]
    data = training_set(points, spec_for(identity))
    print(f"{data.n_problems} problems, {len(data)} timed points; {SEEDS} splits holding out {HOLDOUT:.0%} of problems")
    print("| margin | K | kernels timed (mean) | mean slowdown | worst | within 2% of fastest |")
    print("|---|---|---|---|---|---|")
    for margin, cap in GRID:
        r = simulate(data, margin, cap)
        print(f"| {margin:g} | {cap} | {r['timed']:.1f} | {r['mean']:.1%} | {r['worst']:.0%} | {r['hit']:.0%} |")
    print(f"| untuned (the model's pick) | | 1 | {r['untuned_mean']:.1%} | {r['untuned_worst']:.0%} | {r['untuned_hit']:.0%} |")


if __name__ == "__main__":
    main()
