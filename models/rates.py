"""A card's achievable rates: the fractions of its datasheet peaks that real kernels reach, and one
problem's view of them (its dtype's matrix rate, waves of blocks over the compute units). Shared
by the analytic prior (`models.priors`) and the Triton kernels' costs (`models.triton_costs`);
`visited_fraction` counts the blocks a causal blocked loop visits.
"""

from __future__ import annotations

import math

import numpy as np

from attn_dispatch.kernels.problem import Problem
from attn_dispatch.models.identity import CardSpec

# Achievable fractions of the datasheet peaks, measured on an H200 (docs/RESULTS.md#where-the-priors-constants-come-from).
MATMUL_EFFICIENCY = 0.8
BANDWIDTH_EFFICIENCY = 0.9
# Output tile of a typical GPU matrix-product kernel (cuBLAS / rocBLAS macro tiles are 64-256).
MATMUL_TILE = 128
# Softmax arithmetic per score element: max, subtract, exp (~4 FLOPs), sum. A rough count.
SOFTMAX_FLOPS_PER_ELEMENT = 8
# Fraction of the matrix peak fused kernels reach (H200; docs/RESULTS.md#where-the-priors-constants-come-from).
FUSED_EFFICIENCY = {"sdpa_cudnn": 0.85, "sdpa_flash": 0.6, "sdpa_efficient": 0.27}


class Rates:
    """A card's achievable rates for one problem's dtype."""

    def __init__(self, problem: Problem, spec: CardSpec) -> None:
        self.matmul = spec.flops(problem.dtype) * MATMUL_EFFICIENCY
        self.bandwidth = spec.bandwidth * BANDWIDTH_EFFICIENCY
        self.vector = spec.vector_flops
        self.units = max(spec.compute_units, 1)
        self.launch = spec.launch_overhead_s

    def waves(self, tiles: float) -> int:
        """Rounds in which `tiles` blocks run, one block per compute unit at a time."""
        return math.ceil(max(tiles, 1.0) / self.units)

    def occupancy(self, tiles: float) -> float:
        """Share of the compute units that `tiles` output tiles of a matrix product keep busy."""
        return min(1.0, max(tiles, 1.0) / self.units)

    def wave_occupancy(self, tiles: float) -> float:
        """Share of the compute units' time that `tiles` equal blocks keep busy: fewer blocks than
        units leave units idle, and a last partial wave does too (160 blocks on the H200's 132
        units take two full rounds: 0.61)."""
        return max(tiles, 1.0) / (self.units * self.waves(tiles))

    def product(self, flops: float, operand_bytes: float, tiles: float) -> float:
        """One (batched) matrix product, derated when it has fewer tiles than compute units."""
        return max(flops / self.matmul, operand_bytes / self.bandwidth) / self.occupancy(tiles)


# Above this many query blocks the visited count uses the continuous approximation (the exact
# count costs one numpy pass over the blocks; the approximation is within a block per row).
EXACT_BLOCK_LIMIT = 1 << 16


def visited_fraction(q_len: int, kv_len: int, q_block: int, kv_block: int, causal: bool) -> tuple[float, float, int]:
    """(fraction of score elements computed, key blocks visited, query blocks).

    A block is skipped when every key in it lies after every query in it (kernels/_blocks.py
    `fully_blocked_by_causality`); a visited block is computed whole.
    """
    n_q = max(1, math.ceil(q_len / q_block)) if q_len else 1
    n_kv = max(1, math.ceil(kv_len / kv_block)) if kv_len else 1
    total = n_q * n_kv
    if not causal or q_len == 0 or kv_len == 0:
        return 1.0, float(total), n_q
    if n_q <= EXACT_BLOCK_LIMIT:
        ends = np.minimum(np.arange(1, n_q + 1, dtype=np.int64) * q_block, q_len)
        visited = float(np.minimum(n_kv, (ends - 1) // kv_block + 1).sum())
    else:
        mean_end = (q_len + q_block) / 2
        visited = n_q * min(n_kv, mean_end / kv_block + 0.5)
    return visited / total, visited, n_q
