"""Active against random sampling of calibration problems, simulated on a committed H200 run.

No device time: run 6's measured problems are the pool, and "measuring" a problem reveals its
recorded times. Each seed makes a 5-fold split by problem; in each fold, the held-out fifth is the
test set and the other four fifths the pool. Every strategy starts from the same `--start`
random problems of the pool, then repeatedly fits the cost model (`CostModel()`, the default) on
what it has measured, scores that fit on the test fold, and adds `--step` pool problems chosen by:

- random: a seeded random order (what a space-filling sweep amounts to for the model);
- margin: the smallest predicted log-time gap between a problem's two fastest kernels
  (`calibration.active.top_margins`);
- bagged: the largest mean regret of the consensus pick over `--bags` bootstrap fits
  (`calibration.active.bagged_regret`);
- margin+random, bagged+random: half of each step by that score, half at random (exploration
  keeps covering the space while the score chases the model's doubts);
- bagged+diverse: the bagged score's `--pool-factor` x step best problems, clustered by their
  problem features into step clusters, the best of each (`calibration.active.diverse_batch`).

`--regret linear` scores bagged strategies by the bags' mean slowdown (exp of the log regret,
minus 1) instead of their mean log regret (what `calibrate --active-rounds` uses);
`--bags` and `--bag-iterations` set the bootstrap fits; `--late-step N` adds N problems per
choice from `--late-from` problems on (smaller batches later); `--model-pick` scores the bags' regret
of the fitted model's pick instead of their consensus pick.

The reference is run 6 itself: the model fitted on the whole pool (all of run 6's training
problems), scored on the same test folds. Printed per strategy: mean slowdown of the predicted
fastest kernel against the measured fastest (mean over folds and seeds, ± std over seeds of the
fold average), top-1, and the smallest number of problems whose mean slowdown is at or below the
reference's. Curves stop at `--up-to` of the pool (the target is half), then show the whole
pool's point.

    python -m bench.active_sampling_simulation                   # 3 seeds: ~10 CPU minutes
    python -m bench.active_sampling_simulation --seeds 1 --strategies random margin
    python -m bench.active_sampling_simulation --up-to 0.5 --strategies bagged --regret linear  # ~5 CPU minutes
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from attn_dispatch.calibration.active import (
    bagged_regret,
    diverse_batch,
    most_uncertain,
    problem_descriptors,
    top_margins,
)
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import TrainingSet, training_set
from bench.model_quality_compare import FOLDS, _row, load

STRATEGIES = ("random", "margin", "bagged", "margin+random", "bagged+random", "bagged+diverse")


def fold_splits(problems: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(pool problem ids, test problem ids) of each fold of a seeded `FOLDS`-fold split."""
    fold = np.empty(len(problems), dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(len(problems))] = np.arange(len(problems)) % FOLDS
    return [(problems[fold != k], problems[fold == k]) for k in range(FOLDS)]


def rows_of(data: TrainingSet, problem_ids) -> np.ndarray:
    return np.flatnonzero(np.isin(data.groups, np.asarray(list(problem_ids))))


# Bootstrap fits only rank candidates, so they use a third of the default boosting iterations
# (the default's 300 at learning rate 0.1): three times cheaper.
BAG_ITERATIONS = 100


def fit(data: TrainingSet, rows: np.ndarray, seed: int = 0, max_iter: int = 300) -> CostModel:
    return CostModel(random_state=seed, max_iter=max_iter).fit(data.X[rows], data.y[rows])


def next_problems(strategy: str, data: TrainingSet, chosen: list[int], left: list[int], count: int,
                  model: CostModel, rng: np.random.Generator, bags: int, *, linear: bool = False,
                  pool_factor: int = 3, bag_iterations: int = BAG_ITERATIONS, model_pick: bool = False) -> list[int]:
    """`count` problems of `left` to measure next (the random order is `left`'s own, pre-shuffled)."""
    if strategy == "random":
        return left[:count]
    candidates = rows_of(data, left)
    if strategy.startswith("bagged"):
        predictions = []
        for bag in range(bags):
            resample = rng.choice(chosen, size=len(chosen), replace=True)
            rows = np.concatenate([np.flatnonzero(data.groups == g) for g in resample])
            predictions.append(fit(data, rows, seed=bag, max_iter=bag_iterations).predict(data.X[candidates]))
        pick_log = model.predict(data.X[candidates]) if model_pick else None
        regrets = bagged_regret(data.groups[candidates], np.array(predictions), linear=linear, pick_log=pick_log)
        if strategy == "bagged+diverse":
            descriptors = problem_descriptors(data.groups[candidates], data.X[candidates])
            return diverse_batch(regrets, descriptors, count, pool_factor=pool_factor)
        if strategy == "bagged":
            return most_uncertain(regrets, count, higher_is_less_sure=True)
        return with_random(most_uncertain(regrets, count // 2, higher_is_less_sure=True), left, count)
    margins = top_margins(data.groups[candidates], model.predict(data.X[candidates]))
    if strategy == "margin":
        return most_uncertain(margins, count, higher_is_less_sure=False)
    return with_random(most_uncertain(margins, count // 2, higher_is_less_sure=False), left, count)


def with_random(scored: list[int], left: list[int], count: int) -> list[int]:
    """`scored`, then the first problems of `left`'s random order up to `count` in all."""
    return scored + [g for g in left if g not in scored][:count - len(scored)]


def learning_curve(strategy: str, data: TrainingSet, pool: np.ndarray, test: np.ndarray, *,
                   seed: int, start: int, step: int, bags: int, up_to: int, late_step: int = 0,
                   late_from: int = 0, **choice: object) -> list[tuple[int, float, float]]:
    """[(problems measured, mean slowdown, top-1 on the test fold)] from `start` to `up_to`
    problems (the whole pool's point is the reference, computed once per fold by the caller)."""
    rng = np.random.default_rng(seed)
    order = [int(g) for g in rng.permutation(pool)]
    chosen, left = order[:start], order[start:]
    held_out = data.subset(rows_of(data, test))
    curve = []
    while True:
        model = fit(data, rows_of(data, chosen))
        quality = _row(held_out, model.predict(held_out.X))
        curve.append((len(chosen), quality[0], quality[2]))
        if not left or len(chosen) >= up_to:
            return curve
        size = late_step if late_step and len(chosen) >= late_from else step
        picked = next_problems(strategy, data, chosen, left, min(size, len(left), up_to - len(chosen)), model, rng, bags,
                               **choice)
        chosen += picked
        left = [g for g in left if g not in set(picked)]


def whole_pool(data: TrainingSet, pool: np.ndarray, test: np.ndarray) -> tuple[int, float, float]:
    """The reference point: the model fitted on the whole pool, scored on the test fold."""
    quality = _row(data.subset(rows_of(data, test)), fit(data, rows_of(data, pool)).predict(data.subset(rows_of(data, test)).X))
    return len(pool), quality[0], quality[2]


def summarise(curves: dict[str, list[list[tuple[int, float, float]]]], references: list[tuple[int, float, float]],
              pool_size: float) -> dict:
    """Per strategy: sizes, mean slowdown and top-1 averaged over folds, std over seeds, and the
    smallest size at or below the reference (the whole pool's mean slowdown, last on each curve)."""
    reference = float(np.mean([r[1] for r in references]))
    curves = {name: [run + [ref] for run, ref in zip(runs, references, strict=True)] for name, runs in curves.items()}
    out = {"reference_mean_slowdown": reference, "reference_top1": float(np.mean([r[2] for r in references])),
           "pool_problems": pool_size, "strategies": {}}
    for strategy, runs in curves.items():
        sizes = [size for size, _, _ in runs[0]]
        slow = np.array([[point[1] for point in run] for run in runs])  # [seeds * folds, sizes]
        top1 = np.array([[point[2] for point in run] for run in runs])
        per_seed = slow.reshape(-1, FOLDS, len(sizes)).mean(axis=1)
        mean = slow.mean(axis=0)
        reached = next((size for size, value in zip(sizes, mean, strict=True) if value <= reference), None)
        out["strategies"][strategy] = {
            "sizes": sizes, "mean_slowdown": mean.tolist(), "std_over_seeds": per_seed.std(axis=0).tolist(),
            "top1": top1.mean(axis=0).tolist(), "reaches_reference_at": reached,
        }
    return out


def print_report(result: dict, header: str) -> None:
    print(header)
    print(f"reference (model on the whole pool of {result['pool_problems']:.0f} problems): "
          f"mean slowdown {result['reference_mean_slowdown']:.1%}, top-1 {result['reference_top1']:.0%}")
    strategies = result["strategies"]
    sizes = next(iter(strategies.values()))["sizes"]
    print(f"{'problems':>8s} " + " ".join(f"{name:>22s}" for name in strategies))
    for i, size in enumerate(sizes):
        cells = [f"{s['mean_slowdown'][i]:6.1%} ±{s['std_over_seeds'][i]:5.1%} top1 {s['top1'][i]:3.0%}"
                 for s in strategies.values()]
        print(f"{size:8d} " + " ".join(f"{c:>22s}" for c in cells))
    for name, s in strategies.items():
        at = s["reaches_reference_at"]
        if at is None or at >= s["sizes"][-1]:
            print(f"  {name}: reaches the reference only with the whole pool")
        else:
            print(f"  {name}: reaches the reference at {at} problems ({at / result['pool_problems']:.0%} of the pool)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="run6_more_problems")
    parser.add_argument("--seeds", type=int, default=3, help="seeded 5-fold splits (and start sets)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1")
    parser.add_argument("--start", type=int, default=16, help="random problems before the first choice")
    parser.add_argument("--step", type=int, default=16, help="problems added per choice")
    parser.add_argument("--late-step", type=int, default=0, help="problems added per choice from --late-from "
                        "problems on (0: --step throughout)")
    parser.add_argument("--late-from", type=int, default=64)
    parser.add_argument("--bags", type=int, default=4, help="bootstrap fits of the bagged strategy")
    parser.add_argument("--up-to", type=float, default=0.6, help="curves stop at this share of the pool, "
                        "rounded down (then the whole pool's point, the reference)")
    parser.add_argument("--bag-iterations", type=int, default=BAG_ITERATIONS, help="boosting iterations of each bootstrap fit")
    parser.add_argument("--model-pick", action="store_true", help="bagged regret of the fitted model's pick "
                        "(the one a table would use) instead of the bags' consensus pick")
    parser.add_argument("--regret", choices=("log", "linear"), default="log",
                        help="bagged score: mean log regret or mean slowdown over the bags")
    parser.add_argument("--pool-factor", type=int, default=3,
                        help="bagged+diverse: clusters the pool-factor x step best-scored problems")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the curves as JSON")
    args = parser.parse_args()
    began = time.time()
    points, spec = load(args.run)
    data = training_set(points, spec)
    problems = np.unique(data.groups)
    curves: dict[str, list] = {name: [] for name in args.strategies}
    references = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for pool, test in fold_splits(problems, seed):
            references.append(whole_pool(data, pool, test))
            up_to = int(args.up_to * len(pool))
            for strategy in curves:
                curves[strategy].append(learning_curve(
                    strategy, data, pool, test, seed=seed, start=args.start, step=args.step, bags=args.bags, up_to=up_to,
                    late_step=args.late_step, late_from=args.late_from, linear=args.regret == "linear", pool_factor=args.pool_factor,
                    bag_iterations=args.bag_iterations, model_pick=args.model_pick))
    result = summarise(curves, references, pool_size=float(np.mean([r[0] for r in references])))
    result.update(run=args.run, seeds=list(range(args.first_seed, args.first_seed + args.seeds)), start=args.start, step=args.step, bags=args.bags,
                  late_step=args.late_step, late_from=args.late_from, regret=args.regret, bag_iterations=args.bag_iterations, model_pick=args.model_pick, pool_factor=args.pool_factor, wall_s=round(time.time() - began, 1))
    print_report(result, f"{args.run}: {data.n_problems} problems, {len(data)} points; {args.seeds} seeds x "
                 f"{FOLDS} folds; start {args.start}, step {args.step}; {result['wall_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
