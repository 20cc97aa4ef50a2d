"""The analytic prior of the Triton kernels (`triton_flash`, `triton_decode`), per card.

`triton_flash` (FlashAttention-2's forward): max(products over the visited tiles at the card's
Triton rate, memory traffic with K and V read once per wave of a head's query blocks), in waves,
plus its launch. `triton_decode` (flash-decoding): K and V once per block of packed rows, the
splits' fp32 partials written and read back, plus one launch (two with the combine). Without
matrix cores (gfx906) products run on the vector ALUs and the softmax is added, not overlapped.
Every efficiency here is UNMEASURED (placeholders; sources: docs/RESULTS.md#where-the-priors-constants-come-from).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attn_dispatch.kernels._layout import materialised_bytes
from attn_dispatch.kernels.problem import Problem
from attn_dispatch.kernels.triton_flash import padded_dim
from attn_dispatch.models.identity import GFX906_BANDWIDTH, CardSpec
from attn_dispatch.models.rates import (
    BANDWIDTH_EFFICIENCY,
    FUSED_EFFICIENCY,
    MATMUL_EFFICIENCY,
    SOFTMAX_FLOPS_PER_ELEMENT,
    Rates,
    visited_fraction,
)

if TYPE_CHECKING:
    from attn_dispatch.kernels.triton_decode import TritonDecodeKernel
    from attn_dispatch.kernels.triton_flash import TritonFlashKernel

# Sources of these numbers: docs/RESULTS.md#where-the-priors-constants-come-from.
PACKED_HALF_PER_FP32 = 2.0  # fp16 FLOPs per fp32 FLOP of packed half math (gfx906's v_dot2)
MATRIX_CORE_MIN_RATIO = 2 * PACKED_HALF_PER_FP32  # fp16 matrix / fp32 vector rate from which a card has matrix cores
NO_MATRIX_BF16_SLOWDOWN = 2.69  # bf16 against fp16 products without matrix cores (PREDICTED)
TRITON_FLASH_TIME_VS_FLASH = 0.8  # PLACEHOLDER: Triton FA forward time over PyTorch's flash (H100, published)
TRITON_FLASH_EFFICIENCY = FUSED_EFFICIENCY["sdpa_flash"] / TRITON_FLASH_TIME_VS_FLASH
VECTOR_DOT_EFFICIENCY = 0.5  # of the packed-math peak `tl.dot` reaches without matrix cores (PREDICTED)
IEEE_FP32_FLASH_SLOWDOWN = 12.0  # fp32 `triton_flash` products (IEEE precision) on matrix-core cards (H200)
GFX906_MEASURED_BANDWIDTH = 886e9  # public gfx906 copy measurements
GFX906_BANDWIDTH_EFFICIENCY = GFX906_MEASURED_BANDWIDTH / GFX906_BANDWIDTH
TRITON_LAUNCH_OPS = 6.0  # eager-op launch costs of one Triton launch (its Python path; fitted on H200 picks)
FLASH_ALLOCATIONS = 2  # output and log-sum-exp
DECODE_ALLOCATIONS = 2  # output and the splits' partials
MASK_ITEMSIZE = {"none": 0, "bool": 1, "float": 4}  # bytes per mask element read (float as fp32)


def has_matrix_cores(spec: CardSpec) -> bool:
    """fp16 matrix rate past `MATRIX_CORE_MIN_RATIO` x the vector rate (H200 yes, gfx906 no)."""
    return spec.flops("float16") >= MATRIX_CORE_MIN_RATIO * spec.vector_flops


def is_gfx906_class(spec: CardSpec) -> bool:
    """No matrix cores and gfx906's HBM2: its measured bandwidth fraction applies."""
    return not has_matrix_cores(spec) and spec.bandwidth == GFX906_BANDWIDTH


def triton_matrix_flops(spec: CardSpec, dtype: str) -> float:
    """Peak FLOP/s of `tl.dot` on `dtype` (fp32 in IEEE precision): the matrix rate with matrix
    cores; without, fp16 packed, bf16 `NO_MATRIX_BF16_SLOWDOWN` slower, fp32 at the vector rate."""
    if has_matrix_cores(spec):
        return spec.flops(dtype)
    if dtype == "float16":
        return spec.flops("float16")
    if dtype == "bfloat16":
        return spec.flops("float16") / NO_MATRIX_BF16_SLOWDOWN
    return spec.vector_flops


def flash_product_slowdown(spec: CardSpec, dtype: str) -> float:
    """How much slower `triton_flash`'s fp32 products run than the card's fp32 rate on a card with
    matrix cores: IEEE precision keeps them off the tensor cores (`IEEE_FP32_FLASH_SLOWDOWN`); 1 elsewhere."""
    return IEEE_FP32_FLASH_SLOWDOWN if dtype == "float32" and has_matrix_cores(spec) else 1.0


def _bandwidth(spec: CardSpec) -> float:
    efficiency = GFX906_BANDWIDTH_EFFICIENCY if is_gfx906_class(spec) else BANDWIDTH_EFFICIENCY
    return spec.bandwidth * efficiency


def _compute_seconds(spec: CardSpec, dtype: str, product_flops: float, score_elements: float) -> float:
    """Products at the Triton rate times its efficiency, plus the softmax's arithmetic: overlapped
    on matrix cores, added without them."""
    matrix_cores = has_matrix_cores(spec)
    efficiency = TRITON_FLASH_EFFICIENCY if matrix_cores else VECTOR_DOT_EFFICIENCY
    products = product_flops / (triton_matrix_flops(spec, dtype) * MATMUL_EFFICIENCY * efficiency)
    softmax = score_elements * SOFTMAX_FLOPS_PER_ELEMENT / spec.vector_flops
    return max(products, softmax) if matrix_cores else products + softmax


def _launches(spec: CardSpec, kernels: int, allocations: int) -> float:
    return (kernels * TRITON_LAUNCH_OPS + allocations) * spec.launch_overhead_s


def triton_flash_seconds(problem: Problem, kernel: TritonFlashKernel, spec: CardSpec) -> float:
    """FlashAttention-2's forward (module docstring), at padded head dims."""
    config = kernel.config
    rates = Rates(problem, spec)
    L, S = max(problem.q_len, 1), max(problem.kv_len, 1)
    fraction, _, query_blocks = visited_fraction(L, S, config.block_m, config.block_n, problem.causal)
    head_dim, value_dim = padded_dim(problem.head_dim), padded_dim(problem.value_dim)
    rows = query_blocks * config.block_m  # the last block's padding is computed too
    keys = math.ceil(S / config.block_n) * config.block_n * fraction
    heads = problem.batch * problem.q_heads
    scores = heads * rows * keys
    product_flops = 2 * scores * (head_dim + value_dim) * flash_product_slowdown(spec, problem.dtype)
    compute = _compute_seconds(spec, problem.dtype, product_flops, scores)
    seen_keys = S * fraction  # padded keys are masked loads: never read
    # K and V come from memory once per wave of a head's query blocks (L2 serves the rest: RESULTS)
    kv_reads = heads * rates.waves(query_blocks) * seen_keys * (problem.head_dim + problem.value_dim) * problem.itemsize
    mask_reads = heads * L * seen_keys * MASK_ITEMSIZE[problem.mask_kind]  # every visited tile reads its mask
    streamed = (problem.q_bytes + problem.out_bytes + kv_reads + mask_reads
                + 2 * materialised_bytes(problem))
    programs = heads * query_blocks
    return (max(compute, streamed / _bandwidth(spec)) / rates.wave_occupancy(programs)
            + _launches(spec, 1, FLASH_ALLOCATIONS))


def triton_decode_seconds(problem: Problem, kernel: TritonDecodeKernel, spec: CardSpec) -> float:
    """Flash-decoding (module docstring): programs are (batch x K/V head, split, row block)."""
    rates = Rates(problem, spec)
    layout = kernel.layout(problem)
    programs = problem.batch * problem.kv_heads * layout.splits * layout.row_blocks
    visible = layout.key_count / max(problem.kv_len, 1)
    streamed = (problem.kv_bytes * visible * layout.row_blocks + problem.q_bytes + problem.out_bytes
                + problem.mask_bytes + 2 * layout.partial_bytes(problem) + 2 * materialised_bytes(problem))
    padded_rows = layout.block_m * layout.row_blocks / max(layout.rows, 1)
    scores = problem.batch * problem.q_heads * problem.q_len * layout.key_count * padded_rows
    product_flops = problem.flops * visible * padded_rows
    compute = _compute_seconds(spec, problem.dtype, product_flops, scores)
    launches = 1 if layout.direct else 2
    return (max(compute, streamed / _bandwidth(spec)) / rates.wave_occupancy(programs)
            + _launches(spec, launches, DECODE_ALLOCATIONS))
