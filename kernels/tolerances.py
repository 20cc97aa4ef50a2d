"""Per-dtype error tolerances against a float64 reference.

Error metric: relative L2 error ``||out - ref|| / ||ref||`` over the whole output, and the largest
element error relative to the largest reference element (catches a few wrong rows that the L2
norm would average away).

Where the numbers come from: each tolerance leaves about a 10x margin over the largest error of
PyTorch's own SDPA and of our kernels on random inputs in the contract suite (tests/kernels;
`HYPOTHESIS_PROFILE=explore` draws 200 problems per kernel), on a CPU and on the H200: fp32 ~3e-7,
fp16 ~3e-4 to 1.5e-3, bf16 ~2e-3 to 6e-3 relative L2 (docs/RESULTS.md#kernels-per-call).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    relative_l2: float
    relative_max: float

    def accepts(self, relative_l2: float, relative_max: float) -> bool:
        return relative_l2 <= self.relative_l2 and relative_max <= self.relative_max


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(relative_l2=1e-10, relative_max=1e-9),
    "float32": Tolerance(relative_l2=2e-5, relative_max=1e-4),
    "float16": Tolerance(relative_l2=5e-3, relative_max=2e-2),
    "bfloat16": Tolerance(relative_l2=3e-2, relative_max=1e-1),
}


def looser(a: Tolerance, b: Tolerance) -> Tolerance:
    return Tolerance(max(a.relative_l2, b.relative_l2), max(a.relative_max, b.relative_max))
