"""Does a calibration split over two GPUs give the same table as one GPU, where the timings agree?

    python -m bench.two_gpu_agreement bench/results/h200_calibrations/run1_1gpu bench/results/h200_calibrations/run2_2gpu

Fits a table from each run's measurements (`calibration.finish.fit_and_write`, as calibrate does)
and compares, on every problem both runs measured:
- the measured winners (the same kernel, or within `TIE` of each other in both runs: timings agree);
- the two tables' first choices for that problem, among the kernels both runs measured on it,
  on the problems whose timings agree.
Both tables are refit on this machine, so both carry the same off-card feature skew
(`bench/refit_table.py`): a fair comparison of the two runs with each other.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
from collections import defaultdict

from attn_dispatch.calibration.finish import fit_and_write
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.ranking import kernel_named
from attn_dispatch.models.table_io import load_table

TIE = 0.05  # two kernels within 5% are a tie: above the noise of repeated points (docs/RESULTS.md)


def load(run: str) -> tuple[list[Measurement], DeviceIdentity, float]:
    with open(f"{run}_summary.json") as handle:
        summary = json.load(handle)
    with gzip.open(f"{run}_measurements.jsonl.gz", "rt") as handle:
        points = [Measurement.from_dict(json.loads(line)) for line in handle]
    return points, DeviceIdentity.from_dict(summary["identity"]), summary["wall_s"]


def times_by_problem(points: list[Measurement]) -> dict:
    out: dict = defaultdict(dict)
    for m in points:
        if m.ok:
            out[m.problem][m.kernel] = m.median_s
    return out


def fitted_table(points, identity, wall_s):
    with tempfile.TemporaryDirectory() as home:
        os.environ["ATTN_DISPATCH_HOME"] = home
        outcome = fit_and_write(points, identity, out=None, seed=0, wall_s=wall_s)
        return load_table(outcome.table_paths[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("one_gpu")
    parser.add_argument("two_gpus")
    args = parser.parse_args()
    runs = [load(args.one_gpu), load(args.two_gpus)]
    times = [times_by_problem(points) for points, _, _ in runs]
    tables = [fitted_table(*run) for run in runs]
    common = [p for p in times[0] if p in times[1]]
    same_winner = agree = table_same = 0
    disagreements = []
    for problem in common:
        shared = sorted(set(times[0][problem]) & set(times[1][problem]))
        if len(shared) < 2:
            continue
        winners = [min(shared, key=t[problem].get) for t in times]
        tie = all(t[problem][winners[1 - i]] <= (1 + TIE) * t[problem][winners[i]] for i, t in enumerate(times))
        same_winner += winners[0] == winners[1]
        if winners[0] != winners[1] and not tie:
            continue
        agree += 1
        kernels = [kernel_named(name) for name in shared]
        picks = [table.rank(problem, kernels)[0][0] for table in tables]
        if picks[0] == picks[1]:
            table_same += 1
        else:
            slower = max(times[0][problem][picks[1]] / times[0][problem][picks[0]],
                         times[0][problem][picks[0]] / times[0][problem][picks[1]])
            disagreements.append((slower, picks, problem))
    print(f"problems measured by both runs: {len(common)}; same measured winner: {same_winner}; "
          f"timings agree (same winner or a {TIE:.0%} tie): {agree}")
    print(f"on those, the two tables choose the same kernel for {table_same} of {agree}")
    within = sum(1 for slower, _, _ in disagreements if slower <= 1 + TIE)
    print(f"the other {len(disagreements)}: {within} pick kernels within {TIE:.0%} of each other (measured, one-GPU run)")
    for slower, picks, problem in sorted(disagreements, key=lambda d: d[0], reverse=True)[:5]:
        print(f"  {slower:.2f}x apart: {picks[0]} vs {picks[1]} on {problem}")


if __name__ == "__main__":
    main()
