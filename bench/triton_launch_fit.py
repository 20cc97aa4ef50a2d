"""One-off (recorded in docs/RESULTS.md#where-the-priors-constants-come-from, then removed; git keeps it): how the
prior's launch cost of a Triton call (`models.triton_costs.TRITON_LAUNCH_OPS`) ranks kernels on recorded H200
problems where the Triton kernels were timed. For each value: the prior's first pick against the problem's fastest
kernel (geomean, worst), over every timed kernel and over the portable set (no `sdpa_*`: what gfx906 has).

    python -m bench.triton_launch_fit FILE.jsonl.gz ...   (calibrate --results or bench.llm_grid files)
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

from attn_dispatch.kernels import Problem, kernel_from_name, triton_decode, triton_flash  # noqa: E402
from attn_dispatch.kernels import _triton_support as support  # noqa: E402
from attn_dispatch.kernels.assumed_backends import assume_backends_available  # noqa: E402
from attn_dispatch.models import triton_costs  # noqa: E402
from attn_dispatch.models.identity import H200  # noqa: E402
from attn_dispatch.models.priors import PriorRanker  # noqa: E402
from bench.offline_card import H200_TORCH_2_11  # noqa: E402

LAUNCH_OPS = (2.0, 3.0, 4.0, 6.0, 8.0, 10.0)
HOPPER_SHARED_MEMORY = 227 * 1024


def timed_kernels(paths: list[str]) -> dict[str, dict[str, float]]:
    """Seconds by kernel name, by problem (its JSON), from calibration points and grid rows."""
    times: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for path in paths:
        for row in map(json.loads, gzip.open(path, "rt")):
            if "problem" not in row:
                continue
            key = json.dumps(row["problem"], sort_keys=True)
            if "kernel" in row and row.get("median_s"):
                times[key][row["kernel"]] = row["median_s"]
            for name, timing in row.get("paths", {}).items():
                seconds = timing.get("median_s") or timing.get("once_s")
                if name.startswith("kernel:") and seconds:
                    times[key][name.removeprefix("kernel:")] = seconds
    return {key: by_kernel for key, by_kernel in times.items() if any(n.startswith("triton") for n in by_kernel)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> None:
    support.gpu_architecture = lambda device_index=None: ("sm_90", (9, 0))
    support.triton_version = lambda: (3, 6)
    for module in (triton_flash, triton_decode):
        module.shared_memory_limit = lambda device_index=None: HOPPER_SHARED_MEMORY
    problems, ranker = timed_kernels(sys.argv[1:]), PriorRanker(H200)
    for ops in LAUNCH_OPS:
        triton_costs.TRITON_LAUNCH_OPS = ops
        every, portable, triton_first = [], [], 0
        with assume_backends_available(H200_TORCH_2_11):
            for key, times in problems.items():
                problem = Problem.from_dict(json.loads(key))
                ranked = [name for name, _ in ranker.rank(problem, [kernel_from_name(n) for n in times])]
                every.append(times[ranked[0]] / min(times.values()))
                triton_first += ranked[0].startswith("triton")
                ours = [name for name in ranked if not name.startswith("sdpa")]
                portable.append(times[ours[0]] / min(times[name] for name in ours))
        print(f"TRITON_LAUNCH_OPS {ops:g}: {len(problems)} problems; the prior's first pick x the fastest, every kernel "
              f"{geomean(every):.3f} (worst {max(every):.2f}, Triton first on {triton_first}); portable set "
              f"{geomean(portable):.3f} (worst {max(portable):.2f})")


if __name__ == "__main__":
    main()
