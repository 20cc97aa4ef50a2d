"""Re-score a bench report's measured kernel times with the analytic prior (no GPU needed).

    python -m bench.prior_vs_bench bench/results/bench_h200.json.gz \
        --identity bench/results/h200_calibrations/run3_batched_summary.json

For each shape: the kernel the prior ranks first among those the bench timed, and its measured
time over the fastest of them; geometric mean and worst over all shapes. `--rounds-only` leaves
out paths timed once (cold single calls, so no median); that also drops the prior's pick when it
was a clear loser, so the two scores bracket the truth rather than give it.
`--forced-backend-factor 1.0` scores the prior as it was before `FORCED_BACKEND_FACTOR`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math

import attn_dispatch.models.priors as priors
from attn_dispatch.kernels import AccuracyPolicy, Problem, kernel_from_name
from attn_dispatch.models.cards import CardSpec
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.priors import prior_seconds, spec_for


def prior_choice_ratios(report: dict, spec: CardSpec, *, rounds_only: bool = False) -> list[tuple[str, str, float]]:
    """(shape label, prior's pick, measured pick / measured fastest) per shape."""
    policy = AccuracyPolicy.allowing("any")
    out = []
    for shape in report["shapes"]:
        problem = Problem.from_dict(shape["problem"])
        times = {p["path"]: p["median_s"] for p in shape["paths"]
                 if p["status"] == "ok" and p["role"] == "kernel" and p["median_s"]
                 and not (rounds_only and p.get("timed_once"))}
        if not times:
            continue
        predicted = {name: prior_seconds(problem, kernel_from_name(name, policy=policy), spec) for name in times}
        pick = min(predicted, key=predicted.get)
        out.append((shape["label"], pick, times[pick] / min(times.values())))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="bench --json output (optionally .gz)")
    parser.add_argument("--identity", required=True, help="a calibrate --summary-json file of the same card")
    parser.add_argument("--rounds-only", action="store_true", help="leave out paths timed once")
    parser.add_argument("--forced-backend-factor", type=float, default=priors.FORCED_BACKEND_FACTOR)
    args = parser.parse_args()
    priors.FORCED_BACKEND_FACTOR = args.forced_backend_factor
    opener = gzip.open if args.report.endswith(".gz") else open
    with opener(args.report, "rt") as handle:
        report = json.load(handle)
    with open(args.identity) as handle:
        spec = spec_for(DeviceIdentity.from_dict(json.load(handle)["identity"]), probe=False)
    ratios = prior_choice_ratios(report, spec, rounds_only=args.rounds_only)
    for label, pick, ratio in ratios:
        print(f"{label:55s} prior picks {pick:30s} {ratio:5.2f}x the fastest measured")
    logs = [math.log(r) for _, _, r in ratios]
    print(f"prior: geomean {math.exp(sum(logs) / len(logs)):.2f}x, worst {max(r for _, _, r in ratios):.2f}x over {len(ratios)} shapes")


if __name__ == "__main__":
    main()
