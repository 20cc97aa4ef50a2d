"""Ablations of the decision mechanisms, off the card: the shipped dispatcher's pick simulated on the
recorded H200 grids and held-out draws, with one mechanism taken out at a time.

For every recorded shape (every kernel timed there, `bench.grid_measurements.grid_times`) the pick
follows `dispatcher.device_planner.DevicePlanner.decide` on an H200 with the bundled table: the table ranks
the kernels timed there (PyTorch's backends answering as recorded on the card, `bench.offline_card`);
where a measured entry
of the card decides the bucket (`device_ranking.entry_decides_bucket`) its first choice runs, else the
bucket measures its candidates on its calls (`measured_candidates.measured_candidates`), simulated as
an exact measurement: the fastest candidate that beats PyTorch's default by `tuning.MIN_WIN_MARGIN`.
Dispatch overhead is not counted.

Variants: each removes one mechanism (`VARIANTS`; the guard margin and region default were ablated
at e5f849f and removed after, as were the per-call floor order and ranking by the decision map where a
table has no usable model). Printed per file: geomean over PyTorch's default,
geomean over the fastest kernel, and the shapes whose pick moved by more than 3% against the shipped
pick. Usage::

    python -m bench.ablations [--table models/tables/nvidia-h200-140gb.json] [FILE ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import replace

import torch

from attn_dispatch.dispatcher import device_ranking as ranking_module
from attn_dispatch.dispatcher.selection import (
    MIN_WIN_MARGIN,
    Option,
    costly_setups,
    measured_candidates,
)
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.cold_shape_store import load_cold_costs
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.ranking import kernel_named
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.table_io import load_table
from bench.grid_measurements import grid_times
from bench.offline_card import offline_card_for

R = "bench/results"
FILES = (
    f"{R}/h200_session14/run1_llm_grid_all_paths.jsonl.gz",
    f"{R}/h200_session16/run3_grid_every_path.jsonl.gz",
    f"{R}/h200_session14/run2_heldout_seed4.jsonl.gz",
    f"{R}/h200_session15/run4_heldout_seed5.jsonl.gz",
    f"{R}/h200_session16/run2_heldout_seed6.jsonl.gz",
)
MOVED = 0.03
"""A shape whose pick's time moved by more than this fraction against the shipped pick is listed."""
CUDA = torch.device("cuda")
CPU_CALIBRATION = "tests/models/data/cpu_measurements"
"""The committed CPU calibration (160 problems, every kernel timed; 2-core VM, 1 thread): ``--cpu``
fits a table on 3 of 4 folds of its problems and simulates the picks on the fourth."""
CPU_FOLDS = 4


class Rules:
    """The mechanisms a simulated pick follows (each on unless a variant turns it off)."""

    def __init__(self, *, alignment: bool = True, tie: bool = True, floors: bool = True, measuring: bool = True,
                 table: Callable[[ThresholdTable], object] | None = None) -> None:
        self.alignment, self.tie, self.floors, self.measuring, self.table = alignment, tie, floors, measuring, table


VARIANTS: dict[str, Rules] = {
    "shipped": Rules(),
    "no key-alignment split": Rules(alignment=False),
    "no tie rule": Rules(tie=False),
    "no measuring on calls": Rules(measuring=False),
    "table without its models (the analytic prior ranks)": Rules(table=lambda t: replace(t, models=())),
}


def entry_decides(table, problem: Problem, rules: Rules) -> bool:
    """`device_ranking.DeviceRanking.entry_decides` with the key-alignment and tie rules switchable."""
    entry = table.measured_entry(problem) if hasattr(table, "measured_entry") else None
    if entry is None:
        return False
    if rules.alignment and not ranking_module.measured_alignment_carries(entry, problem):
        return False
    if not rules.tie or not entry.default_by_tie:
        return True
    own = ranking_module.default_backend_choice(problem)
    return all(name == own for name in entry.faster_than_default())


def measured_choice(candidates: list[str], times: dict[str, float]) -> str:
    """The fastest candidate, one other than PyTorch's default only beating it by the margin."""
    default = times[DEFAULT_KERNEL]
    best, best_s = DEFAULT_KERNEL, default
    for name in candidates:
        seconds = times.get(name)
        if name != DEFAULT_KERNEL and seconds is not None and seconds * (1 + MIN_WIN_MARGIN) < default and seconds < best_s:
            best, best_s = name, seconds
    return best


def pick(table, problem: Problem, times: dict[str, float], rules: Rules, floors, cold, device=CUDA) -> str:
    """The simulated dispatcher's kernel for `problem` (module docstring)."""
    kernels = [kernel_named(name) for name in times]
    ranked = table.rank(problem, kernels)
    options = tuple(Option(kernel_named(name), seconds, 0) for name, seconds in ranked)
    if not rules.measuring or entry_decides(table, problem, rules):
        return options[0].kernel.name
    candidates = measured_candidates(options, device, problem, sets_up=costly_setups(options, problem, cold))
    if not candidates:
        return options[0].kernel.name
    return measured_choice([o.kernel.name for o in candidates], times)


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def report(label: str, shapes, chosen: list[float], shipped: list[float]) -> None:
    over_default = geomean([t[DEFAULT_KERNEL] / c for (_, t), c in zip(shapes, chosen, strict=True)])
    to_fastest = geomean([c / min(t.values()) for (_, t), c in zip(shapes, chosen, strict=True)])
    slower = sum(c > s * (1 + MOVED) for c, s in zip(chosen, shipped, strict=True))
    faster = sum(c < s * (1 - MOVED) for c, s in zip(chosen, shipped, strict=True))
    worst = max((c / s for c, s in zip(chosen, shipped, strict=True)), default=1.0)
    print(f"  {label:42s} over default {over_default:.4f}x  / fastest {to_fastest:.4f}  "
          f"vs shipped: {slower} shapes >3% slower (worst {worst:.2f}x), {faster} >3% faster")


def cpu_ablations(variants: list[str]) -> None:
    """The variants on the committed CPU calibration: grouped folds by problem (`CPU_CALIBRATION`)."""
    import gzip
    import json
    import random

    from attn_dispatch.models.identity import DeviceIdentity
    from attn_dispatch.models.measurement import Measurement
    from bench.table_cv import fitted_table

    with open(f"{CPU_CALIBRATION}.conditions.json") as handle:
        identity = DeviceIdentity.from_dict(json.load(handle)["identity"])
    with gzip.open(f"{CPU_CALIBRATION}.jsonl.gz", "rt") as handle:
        points = [Measurement.from_dict(json.loads(line)) for line in handle]
    problems = sorted({m.problem for m in points}, key=repr)
    random.Random(0).shuffle(problems)
    cpu = torch.device("cpu")
    shapes, picks = [], {label: [] for label in variants}
    for fold in range(CPU_FOLDS):
        held = set(problems[fold::CPU_FOLDS])
        table = fitted_table([m for m in points if m.problem not in held], identity)
        for problem in sorted(held, key=repr):
            times = {m.kernel: m.median_s for m in points if m.problem == problem and m.ok}
            if DEFAULT_KERNEL not in times or len(times) < 2:
                continue
            shapes.append((problem, times))
            for label in variants:
                rules = VARIANTS[label]
                ranker = rules.table(table) if rules.table is not None else table
                picks[label].append(times[pick(ranker, problem, times, rules, {}, {}, cpu)])
        print(f"  fold {fold + 1}/{CPU_FOLDS} done", flush=True)
    print(f"\n{CPU_CALIBRATION} ({CPU_FOLDS} folds by problem): {len(shapes)} held-out problems")
    for label in variants:
        report(label, shapes, picks[label], picks["shipped"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(FILES))
    parser.add_argument("--table", default="models/tables/nvidia-h200-140gb.json")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--cpu", action="store_true", help="the committed CPU calibration instead (`CPU_CALIBRATION`)")
    args = parser.parse_args()
    if args.cpu:
        cpu_ablations(args.variants)
        return
    table = load_table(args.table)
    floors = load_cold_costs(table.identity, field="floor_seconds")
    cold = load_cold_costs(table.identity)
    card = offline_card_for(table.identity)
    print(f"table {args.table}; floors for {sorted(floors)}; offline card {card.name if card else None}")
    with assume_backends_available(card):
        for path in args.files:
            shapes = grid_times(path)
            shapes = [(p, t) for p, t in shapes if DEFAULT_KERNEL in t]
            picks: dict[str, list[float]] = {}
            for label in args.variants:
                rules = VARIANTS[label]
                ranker = rules.table(table) if rules.table is not None else table
                picks[label] = [times[pick(ranker, p, times, rules, floors, cold)] for p, times in shapes]
            print(f"\n{path}: {len(shapes)} shapes")
            for label, chosen in picks.items():
                report(label, shapes, chosen, picks["shipped"])


if __name__ == "__main__":
    main()
