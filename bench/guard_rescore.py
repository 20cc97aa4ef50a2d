"""Table-only quality before and after the quality guard and measured entries, off the card.

Refits a recorded calibration (plus, with ``--grid``, the points of recorded LLM grid runs:
`bench.grid_measurements`) the way `attn-dispatch calibrate` does (`models.fit.fit_and_build`)
and prints, on its held-out problems (seed 0, 20%), the choices of the table as it was built
before issue 15 (the model alone) and of the guarded table (measured entries of the
training problems, the verdict). Then it scores whole tables
on recorded `attn-dispatch bench` runs (every kernel timed per shape): the table's first choice
among the kernels timed there, against the fastest of them and against PyTorch's default.

    python -m bench.guard_rescore bench/results/h200_calibrations/run6_more_problems \\
        --bench bench/results/h200_session3/bench_heldout.json.gz bench/results/h200_session3/bench_all.json.gz \\
        --before models/tables/nvidia-h200-140gb.json --out /tmp/run6_guarded.json

No GPU is needed: PyTorch's backends are assumed available (`kernels.sdpa_default`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from dataclasses import replace

from attn_dispatch.calibration.finish import HOLDOUT_FRACTION, apply_numerics_gate
from attn_dispatch.kernels.assumed_backends import assume_backends_available
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.priors import kernel_named
from attn_dispatch.models.quality import ChoiceQuality
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.table_io import load_table, save_table
from bench.grid_measurements import grid_measurements
from bench.offline_card import card_line, offline_card_for


def _line(label: str, q: ChoiceQuality | None) -> str:
    if q is None:
        return f"  {label:34s} not evaluated"
    return (f"  {label:34s} geomean {1 + q.geomean_slowdown:.3f}x, mean {1 + q.mean_slowdown:.3f}x, worst "
            f"{1 + q.worst_slowdown:.2f}x, top-1 {q.top1_accuracy:.0%} ({q.n_problems} problems)")


def bench_shapes(path: str) -> list[tuple[str, Problem, dict[str, float]]]:
    """(label, problem, kernel -> median seconds) of every shape of a recorded bench run."""
    with gzip.open(path, "rt") as handle:
        data = json.load(handle)
    shapes = []
    for shape in data["shapes"]:
        times = {p["path"]: p["median_s"] for p in shape["paths"]
                 if p["role"] == "kernel" and p["status"] == "ok" and p["median_s"]}
        if len(times) >= 2:
            shapes.append((shape["label"], Problem.from_dict(shape["problem"]), times))
    return shapes


def score_on_bench(table: ThresholdTable, shapes) -> str:
    """Geomean and worst of the table's pick over the fastest timed kernel, and over PyTorch's default."""
    to_best, to_default, worst = [], [], (0.0, "")
    for label, problem, times in shapes:
        ranked = table.rank(problem, [kernel_named(name) for name in times])
        picked = times[ranked[0][0]]
        ratio = picked / min(times.values())
        to_best.append(ratio)
        worst = max(worst, (ratio, label))
        if DEFAULT_KERNEL in times:
            to_default.append(picked / times[DEFAULT_KERNEL])

    def geomean(values):
        return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")

    slower = sum(r > 1.0 for r in to_default)
    return (f"vs fastest: geomean {geomean(to_best):.3f}x, worst {worst[0]:.2f}x ({worst[1]}); vs PyTorch's default: "
            f"geomean {geomean(to_default):.3f}x, worst {max(to_default, default=float('nan')):.2f}x, slower on {slower} "
            f"of {len(to_default)} shapes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="path prefix of <run>_measurements.jsonl.gz and <run>_summary.json")
    parser.add_argument("--bench", nargs="*", default=[], help="recorded bench runs (.json.gz) to score the tables on")
    parser.add_argument("--before", default=None, help="a table to compare on the bench runs (e.g. the bundled one)")
    parser.add_argument("--out", default=None, help="write the refitted table here")
    parser.add_argument("--grid", nargs="*", default=[],
                        help="recorded LLM grid runs (`bench.llm_grid` JSON lines) whose points join the calibration's")
    parser.add_argument("--calibrations", nargs="*", default=[], metavar="FILE",
                        help="more calibration results (`calibrate --results`, JSON lines, .gz or not) of the same card "
                             "whose points join the calibration's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=json.loads, default={}, metavar="JSON",
                        help='cost model settings other than the default\'s, e.g. \'{"max_leaf_nodes": 31}\'')
    parser.add_argument("--note", action="append", default=[], help="add this note to the table's provenance")
    parser.add_argument("--no-offline-card", action="store_true",
                        help="do not answer PyTorch's backend choice and probes as recorded on the card (bench.offline_card)")
    args = parser.parse_args()
    with open(f"{args.run}_summary.json") as handle:
        summary = json.load(handle)
    points = []
    for path in (f"{args.run}_measurements.jsonl.gz", *args.calibrations):
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as handle:
            points += [Measurement.from_dict(json.loads(line)) for line in handle if line.strip()]
    identity = DeviceIdentity.from_dict(summary["identity"])
    foreign = {m.device_key for m in points} - {identity.key}
    if foreign:
        parser.error(f"--calibrations: points of another card or software stack ({', '.join(sorted(foreign))})")
    points += grid_measurements(args.grid, identity.key)
    before = load_table(args.before) if args.before else None  # read before --out may replace it
    gated, _ = apply_numerics_gate(points)  # calibrate's own steps (`calibration.finish.fit_and_write`)
    names = sorted({m.kernel for m in gated if m.ok})
    card = None if args.no_offline_card else offline_card_for(identity)
    print(card_line(card))
    with assume_backends_available(card):
        table, _, quality = fit_and_build([m for m in gated if m.status != "unsupported"], identity, kernel_names=names,
                                          holdout_fraction=HOLDOUT_FRACTION, seed=args.seed,
                                          calibration_wall_s=summary.get("wall_s"), model=CostModel(**args.model))
        if args.note:
            table = replace(table, provenance=replace(table.provenance, notes=(*table.provenance.notes, *args.note)))
        print(f"{args.run}: held-out problems (seed {args.seed}), choice / fastest measured")
        print(_line("before (the model alone)", quality.table))
        print(_line("analytic prior", quality.prior))
        print(_line("always PyTorch's default", quality.default))
        print(_line("after (guard + measured entries)", quality.guarded))
        print(f"  {quality.verdict}")
        if args.out:
            print(f"refitted table: {save_table(table, args.out)}")
        print(f"refitted table: {len(table.entries)} measured entries")
        unguarded = replace(table, entries={}, guard=None)
        tables = ([("before", before)] if before is not None else []) + [
            ("refit, no guard or entries", unguarded), ("refit, guard only", replace(table, entries={})),
            ("refit, entries only", replace(unguarded, entries=table.entries)), ("after", table)]
        for path in args.bench:
            shapes = bench_shapes(path)
            for label, candidate in tables:
                print(f"{path} ({len(shapes)} shapes), {label}: {score_on_bench(candidate, shapes)}")


if __name__ == "__main__":
    main()
