"""How well two H200 calibrations (runs 1 and 2, call-by-call timing) agree on the same points.

    python -m bench.timing_repeatability

For every (problem, kernel) timed "ok" in both runs: |log(time run 1 / time run 2)|, median and
90th percentile, by time range; once over all such points and once over the points both runs
timed with at least 2 samples (single-shot points are suspected losers timed once).
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "h200_calibrations"
RANGES_S = ((0.0, 3e-5), (3e-5, 1e-4), (1e-4, 1e-3), (1e-3, math.inf))
DECILES = 10


def load(run: str) -> dict[tuple[str, str], tuple[float, int]]:
    """(problem JSON, kernel) -> (median seconds, samples) of the run's ok points."""
    points = {}
    with gzip.open(RESULTS / f"{run}_measurements.jsonl.gz", "rt") as handle:
        for line in handle:
            record = json.loads(line)
            if record["status"] == "ok":
                points[(json.dumps(record["problem"], sort_keys=True), record["kernel"])] = (record["median_s"], record["reps"])
    return points


def main() -> None:
    first, second = load("run1_1gpu"), load("run2_2gpu")
    common = [key for key in first if key in second]
    for label, min_reps in (("all points timed ok in both runs", 1), ("points with >= 2 samples in both runs", 2)):
        print(label)
        for low, high in RANGES_S:
            ratios = [abs(math.log(first[k][0] / second[k][0])) for k in common
                      if low <= first[k][0] < high and first[k][1] >= min_reps and second[k][1] >= min_reps]
            if len(ratios) >= DECILES:
                q90 = statistics.quantiles(ratios, n=DECILES)[-1]
                print(f"  {low * 1e6:8.0f} us - {high * 1e6:8.0f} us: {len(ratios):5d} points, median |log ratio| "
                      f"{statistics.median(ratios):.3f}, 90th percentile {q90:.3f}")


if __name__ == "__main__":
    main()
