"""What more measurements of one kind buy a table: refit with a growing share of a recorded grid
file's shapes and score each table on another draw it was not fitted on.

For each fraction (and `--repeats` random draws of that many of the file's shapes), a table is
fitted as `attn-dispatch calibrate` fits one (`bench.table_cv.fitted_table`) on a calibration, the
`--grid` files and those shapes of `--add`, then its first choices are scored on `--score`
against the fastest kernel timed there and against PyTorch's default.

    python -m bench.data_learning_curve bench/results/h200_calibrations/run6_more_problems \\
        --grid <the grid files of bench/regenerate_h200_table.sh but the off-grid draw> \\
        --add bench/results/h200_session9/run2_heldout_grid.jsonl \\
        --score bench/results/h200_session10/run1_heldout_seed1.jsonl --fractions 0 0.5 1 --repeats 2

Off the card it answers PyTorch's backend choice and probes as recorded (`bench.offline_card`).
"""

from __future__ import annotations

import argparse
import random

from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.measurement import Measurement
from bench.grid_measurements import grid_measurements, grid_times
from bench.offline_card import card_line, offline_card_for
from bench.table_cv import fitted_table, read_calibration, scored, shape_group, summary


def shape_share(points: list[Measurement], fraction: float, seed: int) -> list[Measurement]:
    """The points of a random `fraction` of the distinct shapes among `points` (drawn with `seed`)."""
    shapes = sorted({shape_group(m.problem) for m in points}, key=repr)
    random.Random(seed).shuffle(shapes)
    kept = set(shapes[:round(fraction * len(shapes))])
    return [m for m in points if shape_group(m.problem) in kept]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="path prefix of a calibration's <run>_measurements.jsonl.gz and <run>_summary.json")
    parser.add_argument("--grid", nargs="*", default=[], help="grid files every table fits on")
    parser.add_argument("--add", required=True, help="the grid file whose shapes are added a share at a time")
    parser.add_argument("--score", required=True, help="the grid file the tables are scored on (not fitted)")
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.0, 0.5, 1.0])
    parser.add_argument("--repeats", type=int, default=2, help="draws of shapes per fraction strictly between 0 and 1")
    args = parser.parse_args()
    identity, base = read_calibration(args.run)
    base += grid_measurements(args.grid, identity.key)
    added = grid_measurements([args.add], identity.key)
    shapes = grid_times(args.score)
    card = offline_card_for(identity)
    print(card_line(card))
    with assume_backends_available(card):
        for fraction in args.fractions:
            for repeat in range(args.repeats if 0 < fraction < 1 else 1):
                share = shape_share(added, fraction, repeat)
                table = fitted_table(base + share, identity)
                print(f"{fraction:.0%} of {args.add} ({len({shape_group(m.problem) for m in share})} shapes, draw "
                      f"{repeat}), on {args.score}: {summary(scored(table, shapes))}", flush=True)


if __name__ == "__main__":
    main()
