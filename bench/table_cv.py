"""Table-only quality on grid shapes it was not fitted on: grouped K-fold over recorded LLM grids.

Each fold fits a table the way `attn-dispatch calibrate` does (`models.fit.fit_and_build`: gate,
cost model, quality guard, measured entries) on a recorded calibration plus the grid points of the
other folds (`bench.grid_measurements`), then scores its first choice on the fold's shapes against
the fastest kernel timed there and against PyTorch's default, as `bench.guard_rescore` scores a
table on a bench. No point of a scored shape is in its fold's fit, from any grid file. ``--group
family`` holds out whole families (dtype, head dim, GQA ratio) instead of shapes: extrapolation
rather than interpolation; ``--group file`` holds out each scored file's shapes in turn (a whole
draw unlike the rest, e.g. session 9's off-grid shapes or session 10's batch-4 grid). The tables given with ``--table`` (e.g. the bundled one) are scored on
the same shapes.

    python -m bench.table_cv bench/results/h200_calibrations/run6_more_problems \\
        --grid bench/results/h200_session6/run1_llm_grid.jsonl.gz bench/results/h200_session7/run1_llm_grid.jsonl.gz \\
        --score bench/results/h200_session8/run3_llm_grid.jsonl.gz --table models/tables/nvidia-h200-140gb.json

Off the card PyTorch's backends are assumed available (`kernels.sdpa_default`); `sdpa_default`'s
workspace feature then follows what this machine computes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from collections.abc import Callable, Sequence

from attn_dispatch.calibration.finish import HOLDOUT_FRACTION, apply_numerics_gate
from attn_dispatch.kernels.assumed_backends import assume_backends_available
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.table_io import load_table
from bench.grid_measurements import grid_measurements, grid_times
from bench.offline_card import card_line, offline_card_for

SLOW_PICK = 1.5
"""A pick this many times the fastest counts as a bad one (issue 15's "worst <= 1.5")."""
DEFAULT_TOLERANCE = 1.03
"""A pick slower than PyTorch's default by more than this counts against it (issue 14's 3%)."""


def shape_group(problem: Problem) -> tuple:
    return (problem.batch, problem.q_heads, problem.kv_heads, problem.q_len, problem.kv_len, problem.head_dim,
            problem.dtype, problem.causal, problem.mask_kind)


def family_group(problem: Problem) -> tuple:
    return (problem.dtype, problem.head_dim, problem.q_heads // max(problem.kv_heads, 1))


GROUPINGS: dict[str, Callable[[Problem], tuple]] = {"shape": shape_group, "family": family_group}
BY_FILE = "file"


def read_calibration(run: str) -> tuple[DeviceIdentity, list[Measurement]]:
    """The card and the points of a recorded calibration (<run>_summary.json, <run>_measurements.jsonl.gz)."""
    with open(f"{run}_summary.json") as handle:
        identity = DeviceIdentity.from_dict(json.load(handle)["identity"])
    with gzip.open(f"{run}_measurements.jsonl.gz", "rt") as handle:
        return identity, [Measurement.from_dict(json.loads(line)) for line in handle]


def fitted_table(points: list[Measurement], identity: DeviceIdentity, seed: int = 0,
                 model: CostModel | None = None) -> ThresholdTable:
    """The table `attn-dispatch calibrate` fits on `points` (numerics gate, fit, guard, entries);
    `model`: an unfitted cost model with other settings than the default's."""
    gated, _ = apply_numerics_gate(points)
    names = sorted({m.kernel for m in gated if m.ok})
    table, _, _ = fit_and_build([m for m in gated if m.status != "unsupported"], identity, kernel_names=names,
                                holdout_fraction=HOLDOUT_FRACTION, seed=seed, model=model)
    return table


def first_choice(table: ThresholdTable, problem: Problem, times: dict[str, float]) -> str:
    """The table's first choice among the kernels timed for `problem`."""
    return table.rank(problem, [kernel_named(name) for name in times])[0][0]


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def summary(ratios: list[tuple[float, float | None, str]]) -> str:
    """(pick / fastest, pick / default, label) per shape -> one line."""
    to_best = [r for r, _, _ in ratios]
    to_default = [d for _, d, _ in ratios if d is not None]
    worst = max(ratios, default=(float("nan"), None, ""))
    return (f"{len(ratios)} shapes: vs fastest geomean {geomean(to_best):.3f}x, worst {worst[0]:.2f}x ({worst[2]}), "
            f"{sum(r > SLOW_PICK for r in to_best)} over {SLOW_PICK}x; vs PyTorch's default geomean "
            f"{geomean(to_default):.3f}x, {sum(d > DEFAULT_TOLERANCE for d in to_default)} over {DEFAULT_TOLERANCE}x")


def scored(table: ThresholdTable, shapes) -> list[tuple[float, float | None, str]]:
    out = []
    for problem, times in shapes:
        choice = first_choice(table, problem, times)
        picked, default = times[choice], times.get(DEFAULT_KERNEL)
        fastest = min(times, key=times.get)
        label = (f"B{problem.batch} {problem.q_heads}/{problem.kv_heads} Lq{problem.q_len} Lk{problem.kv_len} "
                 f"D{problem.head_dim} {problem.dtype}: {choice} ({picked * 1e6:.0f} us), fastest {fastest} "
                 f"({times[fastest] * 1e6:.0f} us)")
        out.append((picked / min(times.values()), None if default is None else picked / default, label))
    return out


def print_worst(ratios: list[tuple[float, float | None, str]], count: int) -> None:
    """The `count` picks furthest from the fastest kernel, one line each."""
    for ratio, to_default, label in sorted(ratios, reverse=True)[:count]:
        print(f"    {ratio:.2f}x the fastest, {to_default or float('nan'):.2f}x the default: {label}")


def folds_of(groups: list[tuple], k: int, seed: int) -> list[set]:
    distinct = sorted(set(groups), key=repr)
    random.Random(seed).shuffle(distinct)
    return [set(distinct[i::k]) for i in range(k)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="path prefix of a calibration's <run>_measurements.jsonl.gz and <run>_summary.json")
    parser.add_argument("--grid", nargs="*", default=[], help="grid files (JSON lines) whose points the folds fit on")
    parser.add_argument("--score", nargs="+", default=None, help="grid files scored (default: the --grid files)")
    parser.add_argument("--table", nargs="*", default=[], help="tables to score on the same shapes")
    parser.add_argument("--folds", type=int, default=5, help="0: only score the --table tables")
    parser.add_argument("--group", choices=sorted(GROUPINGS) + [BY_FILE], default="shape",
                        help=f"{BY_FILE}: one fold per --score file (its shapes, from every file, held out; "
                             "--folds then only needs to be non-zero)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=json.loads, default={}, metavar="JSON",
                        help='the folds\' cost model settings, e.g. \'{"min_samples_leaf": 8}\' (models.cost_model.CostModel)')
    parser.add_argument("--worst", type=int, default=0, help="also list this many worst picks per table and file")
    parser.add_argument("--no-offline-card", action="store_true",
                        help="do not answer PyTorch's backend choice and probes as recorded on the card (bench.offline_card)")
    args = parser.parse_args()
    if args.folds and not args.grid:
        parser.error("--grid: the folds fit on grid files; give some, or --folds 0 to only score --table tables")
    identity, calibration = read_calibration(args.run)
    grid_points = grid_measurements(args.grid, identity.key)
    group = GROUPINGS.get(args.group, shape_group)
    score_files = args.score or args.grid
    shapes_by_file = {path: grid_times(path) for path in score_files}
    if not args.folds:
        folds = []
    elif args.group == BY_FILE:
        folds = [{group(p) for p, _ in shapes_by_file[path]} for path in score_files]
    else:
        folds = folds_of([group(p) for shapes in shapes_by_file.values() for p, _ in shapes], args.folds, args.seed)
    print(f"{args.run} + {len(grid_points)} grid points from {len(args.grid)} files; {len(folds)} folds by {args.group}")
    card = None if args.no_offline_card else offline_card_for(identity)
    print(card_line(card))
    with assume_backends_available(card):
        for path in args.table:
            table = load_table(path)
            for score_path, shapes in shapes_by_file.items():
                ratios = scored(table, shapes)
                print(f"table {path} on {score_path}: {summary(ratios)}")
                print_worst(ratios, args.worst)
        results: dict[tuple[str, str], list] = {}
        for index, fold in enumerate(folds):
            started = time.perf_counter()
            table = fitted_table(calibration + [m for m in grid_points if group(m.problem) not in fold], identity,
                                 args.seed, CostModel(**args.model))
            fit_s = time.perf_counter() - started
            variants = [("as fitted", table)]
            for score_path, shapes in shapes_by_file.items():
                if args.group == BY_FILE and score_path != score_files[index]:
                    continue
                held = [(p, t) for p, t in shapes if group(p) in fold]
                for label, variant in variants:
                    results.setdefault((score_path, label), []).extend(scored(variant, held))
            print(f"  fold {index + 1}/{len(folds)}: {len(fold)} groups held out, fit {fit_s:.0f} s")
        for (score_path, label), ratios in results.items():
            print(f"refit with the other folds' grid points, {label}, on {score_path}: {summary(ratios)}")
            print_worst(ratios, args.worst)


if __name__ == "__main__":
    main()
