"""How close is the analytic prior to measured times, and how good are its picks, on recorded
all-path runs of `bench.llm_grid` (the H200's, read with its recorded backend answers)?

Per fused kernel and query-length band: the median and the mean absolute value of
log(prior / measured) (forced backends without `FORCED_BACKEND_FACTOR`, the prior's bias against
them). Per file: the prior's pick among the recorded kernels against the fastest of them (geomean,
picks over 1.5x, the worst three).

    python -m bench.diagnostics.prior_accuracy bench/results/h200_session14/run1_llm_grid_all_paths.jsonl.gz \\
        bench/results/h200_session14/run2_heldout_seed4.jsonl.gz
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict

from attn_dispatch.kernels import Problem, kernel_from_name
from attn_dispatch.kernels.sdpa_probe import assume_backends_available
from attn_dispatch.models.cards import H200
from attn_dispatch.models.priors import FORCED_BACKEND_FACTOR, PRIOR_VERSION, prior_seconds
from bench.grid_measurements import read_grid
from bench.offline_card import H200_TORCH_2_11

FUSED_PATHS = {"pytorch": "sdpa_default", "kernel:sdpa_cudnn": "sdpa_cudnn", "kernel:sdpa_flash": "sdpa_flash",
               "kernel:sdpa_efficient": "sdpa_efficient"}
WORST_SHOWN = 3
SLOW_PICK = 1.5


def band(problem: Problem) -> str:
    return "Lq 1" if problem.q_len == 1 else "Lq 2-64" if problem.q_len <= 64 else "Lq > 64"


def shape_text(problem: Problem) -> str:
    return (f"B{problem.batch} {problem.q_heads}/{problem.kv_heads} Lq{problem.q_len} Lk{problem.kv_len} "
            f"D{problem.head_dim} {problem.dtype}{' causal' if problem.causal else ''}")


def recorded(path: str):
    """(problem, {kernel name: median seconds}) per shape of a recorded run."""
    for row in read_grid(path):
        times = {}
        for label, timing in row["paths"].items():
            name = FUSED_PATHS.get(label) or (label[len("kernel:"):] if label.startswith("kernel:") else None)
            if name and (timing or {}).get("median_s"):
                times[name] = timing["median_s"]
        if "sdpa_default" in times:
            yield Problem.from_dict(row["problem"]), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="recorded `bench.llm_grid` files (.jsonl or .jsonl.gz) with every path timed")
    args = parser.parse_args()
    errors = defaultdict(list)
    print(f"prior version {PRIOR_VERSION}, H200 spec, torch 2.11's recorded backend answers")
    with assume_backends_available(H200_TORCH_2_11):
        for path in args.runs:
            picks = []
            for problem, times in recorded(path):
                for name in FUSED_PATHS.values():
                    if name in times:
                        prior = prior_seconds(problem, kernel_from_name(name), H200)
                        prior /= 1.0 if name == "sdpa_default" else FORCED_BACKEND_FACTOR
                        errors[(name, band(problem))].append(math.log(prior / times[name]))
                pick = min(times, key=lambda name: (prior_seconds(problem, kernel_from_name(name), H200), name))
                picks.append((times[pick] / min(times.values()), pick, shape_text(problem)))
            geomean = math.exp(statistics.mean(math.log(ratio) for ratio, _, _ in picks))
            print(f"{path}: prior's pick vs the fastest recorded: geomean {geomean:.3f}x, "
                  f"{sum(ratio > SLOW_PICK for ratio, _, _ in picks)} of {len(picks)} over {SLOW_PICK}x; worst:")
            for ratio, pick, shape in sorted(picks)[-WORST_SHOWN:]:
                print(f"    {ratio:.2f}x {pick}: {shape}")
    print("log(prior / measured) per kernel and band: median, mean |.|")
    for (name, where), values in sorted(errors.items()):
        print(f"  {name:15s} {where:8s} n={len(values):4d}  median {statistics.median(values):+.2f}  "
              f"mean |err| {statistics.mean(abs(v) for v in values):.2f}")


if __name__ == "__main__":
    main()
