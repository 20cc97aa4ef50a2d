"""Per-dtype error tolerances against a float64 reference.

Error metric: relative L2 error ``||out - ref|| / ||ref||`` over the whole output, and the largest
element error relative to the largest reference element (catches a few wrong rows that the L2
norm would average away).

Where the numbers come from: the error of PyTorch's own SDPA and of our kernels on random inputs
in the contract suite (tests/kernels; `HYPOTHESIS_PROFILE=explore` draws 200 problems per kernel),
seen 2026-11-30 on CPU with torch 2.13: fp32 ~3e-7, fp16 ~5e-4, bf16 ~4e-3 relative L2. Each tolerance leaves about a
10x margin over the worst observed kernel error; the H200 probe (shared/reference/h200-probe.md)
saw the same orders of magnitude on GPU (fp16 2.8e-4..1.5e-3, bf16 2.2e-3..5.9e-3).
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
