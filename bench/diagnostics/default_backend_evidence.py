"""Which backend PyTorch's default ran, per kind of problem, read off recorded grid timings.

For every grid shape with a timed ``sdpa_default``, the forced backend whose median is nearest
to the default's; it counts as the one the default ran when within `SAME_TIME` of it. Printed
per kind of problem as `kernels.sdpa_probe.default_backend_choice` keys them (dtype, head dim,
causality, mask kind, GQA, decode): the evidence behind `bench.offline_card`.

    python -m bench.diagnostics.default_backend_evidence bench/results/h200_session*/*llm_grid*.jsonl \\
        bench/results/h200_session9/run2_heldout_grid.jsonl bench/results/h200_session10/run1_heldout_seed1.jsonl
"""

from __future__ import annotations

import argparse
import math
from collections import Counter, defaultdict

from attn_dispatch.kernels.problem import Problem
from bench.grid_measurements import grid_times

FORCED_BACKENDS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math")
SAME_TIME = 0.03
"""Medians within 3% count as the same kernel (a grid median's spread is ~1% on the H200)."""


def kind_of(problem: Problem) -> tuple:
    """The key `default_backend_choice` caches its answer under (switches aside)."""
    return (problem.dtype, problem.head_dim, problem.causal, problem.mask_kind, problem.gqa_ratio > 1,
            problem.q_len == 1)


def matching_backend(times: dict[str, float]) -> str | None:
    """The forced backend whose time equals the default's within `SAME_TIME`, else None."""
    default = times.get("sdpa_default")
    if default is None:
        return None
    timed = [(abs(math.log(default / times[name])), name) for name in FORCED_BACKENDS if name in times]
    if not timed:
        return None
    gap, name = min(timed)
    return name if gap <= math.log1p(SAME_TIME) else None


def evidence(paths: list[str]) -> dict[tuple, Counter]:
    """kind -> Counter of matching backends ("none" where no forced backend matched)."""
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for path in paths:
        for problem, times in grid_times(path):
            if "sdpa_default" in times:
                counts[kind_of(problem)][matching_backend(times) or "none"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grids", nargs="+", help="recorded `bench.llm_grid` JSON lines")
    args = parser.parse_args()
    counts = evidence(args.grids)
    total = Counter()
    for kind in sorted(counts, key=repr):
        total.update(counts[kind])
        dtype, head_dim, causal, mask, gqa, decode = kind
        print(f"{dtype} D{head_dim} causal={causal} mask={mask} gqa={gqa} decode={decode}: "
              + ", ".join(f"{name} {n}" for name, n in counts[kind].most_common()))
    print("all kinds: " + ", ".join(f"{name} {n}" for name, n in total.most_common()))


if __name__ == "__main__":
    main()
