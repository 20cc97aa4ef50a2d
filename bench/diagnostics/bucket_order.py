"""Which kernel a GPU bucket's first call starts from, off the card, and what the grid measured there.

A bucket's decision starts from the table's order (`dispatcher.planning.rank_options`), which a
measured per-call floor may change (`dispatcher.cold_shape.floor_order`). Before session 14,
`floor_order` re-sorted the whole order by predicted time wherever the card had any floor, which
undid the table's ties to PyTorch's default (a measured entry whose kernels overlap, a prediction
within the guard's margin). This replays both orders for every shape of recorded `bench.llm_grid`
runs (PyTorch's backend choices and probes as recorded, `bench.offline_card`) and reports:

- the buckets whose first option the re-sort changed, by the kernel it chose, with the paired
  per-round ratio the run measured for a dispatcher column there (`--column`, what ran then);
- each policy's pick priced by the run's recorded medians (a bucket's measuring on its calls
  simulated as in `bench.first_call_check_simulation.measured_choice`: the measured candidates'
  fastest, PyTorch's default unless beaten by `tuning.MIN_WIN_MARGIN`). The kernels' medians were timed through their
  Python runners, so picks other than the default are priced above what the dispatcher's C++
  entries run them at.

    python -m bench.diagnostics.bucket_order bench/results/h200_session14/run1_llm_grid_all_paths.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics

import torch

from attn_dispatch import Dispatcher
from attn_dispatch.dispatcher.cold_shape import costly_setups, floor_order, floor_seconds
from attn_dispatch.dispatcher.measured_candidates import measured_candidates
from attn_dispatch.dispatcher.planning import rank_options
from attn_dispatch.dispatcher.ranking import entry_decides_bucket
from attn_dispatch.kernels.accuracy import LOSSLESS
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.measured import DEFAULT_KERNEL
from attn_dispatch.models.table_io import load_table
from bench.first_call_check_simulation import measured_choice, recorded_times
from bench.grid_measurements import read_grid
from bench.llm_grid import SLOWER_MARGIN, SMALL_Q_ROWS, paired_ratios
from bench.offline_card import card_line, offline_card_for

CUDA = torch.device("cuda")  # a device object only: nothing runs on it
COLD_STORE = "models/tables/cold_shape/nvidia-h200-140gb.json"


def resorted(options: tuple, floors: dict) -> tuple:
    """The order as `floor_order` gave it before session 14: every option by ``max(predicted,
    floor)``, the fastest first, wherever any floor was known."""
    effective = [None if o.predicted_s is None else max(o.predicted_s, floor_seconds(o.kernel, floors) or 0.0)
                 for o in options]
    known = [i for i, s in enumerate(effective) if s is not None]
    if not known or effective[0] is None:
        return options
    best = min(known, key=effective.__getitem__)
    if best == 0 or effective[best] >= effective[0]:
        return options
    return (options[best], *(o for i, o in enumerate(options) if i != best))


def checked_pick(options: tuple, problem: Problem, times: dict, decides: bool, cold: dict) -> str:
    """What a shipped dispatcher's bucket serves with: the first option where an entry decides,
    else the pick of its measuring on calls (`measured_candidates`)."""
    if decides:
        return options[0].kernel.name
    checked = measured_candidates(options, CUDA, problem, sets_up=costly_setups(options, problem, cold))
    return measured_choice([o.kernel.name for o in checked], times) if checked else options[0].kernel.name


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def report(path: str, table, kernels: dict, floors: dict, cold: dict, column: str) -> None:
    moved: dict[str, list[float | None]] = collections.defaultdict(list)
    priced: dict[str, list[tuple[float, bool]]] = collections.defaultdict(list)
    for row in read_grid(path):
        problem, times = Problem.from_dict(row["problem"]), recorded_times(row)
        options = rank_options(problem, kernels, table, {}, policy=LOSSLESS).options
        now, _ = floor_order(options, problem, [o.predicted_s for o in options], floors)
        before = resorted(options, floors)
        if before[0] is not now[0]:
            moved[before[0].kernel.name].append(paired_ratios(row, column))
        entry = table.measured_entry(problem)
        picks = {
            "before: re-sorted, entries decide": checked_pick(before, problem, times, entry is not None, cold),
            "now: table order, entries decide": checked_pick(now, problem, times, entry is not None, cold),
            "now: ties checked (shipped)": checked_pick(now, problem, times,
                                                        entry is not None and entry_decides_bucket(entry, problem),
                                                        cold),
        }
        small_q = SMALL_Q_ROWS[0] <= problem.q_len <= SMALL_Q_ROWS[1]
        for label, pick in picks.items():
            pick = pick if pick in times else DEFAULT_KERNEL
            priced[label].append((times[pick] / times[DEFAULT_KERNEL], small_q))
    print(f"{path}:")
    for kernel, ratios in sorted(moved.items()):
        known = [r for r in ratios if r is not None]
        line = f"  re-sort moved {len(ratios)} buckets from the table's first to {kernel}"
        if known:
            line += (f"; `{column}` measured there, paired: median {statistics.median(known):.3f}, "
                     f"{sum(r > SLOWER_MARGIN for r in known)} >3% slower, "
                     f"{sum(r < 1 / SLOWER_MARGIN for r in known)} >3% faster")
        print(line)
    if not any(label.startswith("kernel:") for row in read_grid(path) for label in row["paths"]):
        print("  (no kernel paths timed in this run: the picks cannot be priced)")
        return
    for label, values in priced.items():
        ratios = [ratio for ratio, _ in values]
        small = [ratio for ratio, small_q in values if small_q]
        print(f"  {label:36s} priced by the medians: {1 / _geomean(ratios):.3f}x PyTorch's default "
              f"(Lq 2-64: {1 / _geomean(small):.3f}x), {sum(r > SLOWER_MARGIN for r in ratios)} >3% slower")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grids", nargs="+", help="recorded `bench.llm_grid` files (every kernel timed)")
    parser.add_argument("--table", default="models/tables/nvidia-h200-140gb.json")
    parser.add_argument("--cold-store", default=COLD_STORE, help="the card's cold-shape costs and floors")
    parser.add_argument("--column", default="shipped", help="the dispatcher column whose paired ratios to show")
    args = parser.parse_args()
    table = load_table(args.table)
    with open(args.cold_store) as handle:
        store = json.load(handle)
    kernels = {kernel.name: kernel for kernel in Dispatcher().kernels}
    card = offline_card_for(table.provenance.identity)
    print(card_line(card))
    with assume_backends_available(card):
        for path in args.grids:
            report(path, table, kernels, store.get("floor_seconds", {}), store.get("seconds", {}), args.column)


if __name__ == "__main__":
    main()
