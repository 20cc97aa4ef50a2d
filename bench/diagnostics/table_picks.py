"""Why a table picks what it picks on recorded grid shapes: the picks furthest from the fastest
kernel, each with what decided it.

For each such shape: the table's first choice and the fastest kernel measured; whether the
shape's exact bucket has a measured entry (`ThresholdTable.rank_measured`: it decides first); the
model's predicted time of the pick, of the fastest and of PyTorch's default against their
measured times; and the guard: the margin (default predicted within it of the best: default
first) or the region (`Cell.keep_default`, with the model's largest miss there,
`Cell.default_yields_at`), naming the region's cell.

    python -m bench.diagnostics.table_picks models/tables/nvidia-h200-140gb.json \\
        bench/results/h200_session10/run1_heldout_seed1.jsonl --over 1.5

Off the card it answers PyTorch's backend choice and probes as recorded (`bench.offline_card`).
"""

from __future__ import annotations

import argparse
import math

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.buckets import bucket_of
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.ranking import kernel_named
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.table_io import load_table
from bench.grid_measurements import grid_times
from bench.offline_card import card_line, offline_card_for

PREDICTED_NAMES = 3
"""How many kernels of the model's own order a line shows (its first three)."""


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}" if math.isfinite(seconds) else "-"


def decided_by(table: ThresholdTable, problem: Problem, times: dict[str, float]) -> str:
    """Which step of `ThresholdTable.rank` put the first choice first, in words."""
    kernels = [kernel_named(name) for name in times]
    if table.rank_measured(problem, kernels):
        return "measured entry of its exact bucket"
    table_class = table.find_class(problem)
    bucket, cell = table_class.nearest_cell(bucket_of(problem)) if table_class is not None else (None, None)
    ranked = table.rank_by_model(problem, kernels, cell)
    predicted = dict(ranked)
    default_s = predicted.get(DEFAULT_KERNEL, math.inf)
    best_name, best_s = ranked[0]
    order = ", ".join(f"{name} {_us(s)} (measured {_us(times[name])})" for name, s in ranked[:PREDICTED_NAMES])
    words = f"model: {order}; default predicted {_us(default_s)} (measured {_us(times.get(DEFAULT_KERNEL, math.nan))})"
    margin = table.guard.default_margin if table.guard is not None else math.inf
    if best_name != DEFAULT_KERNEL and default_s <= best_s * (1.0 + margin):
        return f"{words}; margin: default within {1 + margin:.3g}x of the best"
    if cell is not None and cell.keep_default and best_name != DEFAULT_KERNEL:
        ratio = default_s / best_s
        yields = cell.default_yields_at
        verdict = "kept for the default" if ratio <= yields else "yielded"
        return (f"{words}; region {table_class.key.describe()} cell {bucket}: {verdict} (predicted "
                f"{ratio:.2f}x slower, yields above {yields:.2f}x)")
    return f"{words}; the model's pick"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a table file")
    parser.add_argument("grids", nargs="+", help="recorded `bench.llm_grid` JSON lines (every kernel timed)")
    parser.add_argument("--over", type=float, default=1.5, help="list picks this many times the fastest or more")
    args = parser.parse_args()
    table = load_table(args.table)
    card = offline_card_for(table.provenance.identity)
    print(card_line(card))
    with assume_backends_available(card):
        for path in args.grids:
            lines = []
            for problem, times in grid_times(path):
                choice = table.rank(problem, [kernel_named(name) for name in times])[0][0]
                fastest = min(times, key=times.get)
                ratio = times[choice] / times[fastest]
                if ratio >= args.over:
                    label = (f"B{problem.batch} {problem.q_heads}/{problem.kv_heads} Lq{problem.q_len} "
                             f"Lk{problem.kv_len} D{problem.head_dim} {problem.dtype}")
                    lines.append((ratio, f"{ratio:.2f}x {label}: {choice} ({_us(times[choice])} us), fastest "
                                         f"{fastest} ({_us(times[fastest])} us)\n      "
                                         f"{decided_by(table, problem, times)}"))
            print(f"{path}: {len(lines)} picks at {args.over}x the fastest or more")
            for _, line in sorted(lines, reverse=True):
                print(f"  {line}")


if __name__ == "__main__":
    main()
