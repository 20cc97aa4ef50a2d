"""The analytic prior of the Triton kernels (`triton_flash`, `triton_decode`), per card.

`triton_flash` is FlashAttention-2's forward: its time is the larger of its matrix products (the
FLOPs of the key blocks each query block visits, causal blocks above the diagonal skipped, at the
card's Triton matrix rate and an efficiency) and its memory traffic (Q and O once, K and V once
per wave of a head's query blocks, `kv_passes`; the mask tiles it reads), over its programs in waves,
plus its launches. `triton_decode` is flash-decoding: K and V read once per GQA group (per block
of packed rows) at the card's bandwidth, the splits' fp32 partials written and read back by the
combine, the products padded to a block's rows, plus one launch (two with the combine).

The card decides the matrix rate Triton's `tl.dot` reaches (`triton_matrix_flops`): on a card with
matrix cores (NVIDIA since Volta, AMD CDNA) the spec sheet's rate per dtype; on one without
(gfx906: products run as `v_dot2_f32_f16` on the vector ALUs) fp16 at the packed-math rate, bf16
`NO_MATRIX_BF16_SLOWDOWN` times slower, fp32 at the vector rate, and the softmax's arithmetic on
the same ALUs (added, not overlapped).

Every efficiency here is UNMEASURED: the H200's are placeholders derived from a published
Triton-against-flash ratio on an H100, to be replaced by the H200 calibration's numbers; gfx906's
come from its spec sheet and public reports, labelled predicted wherever they surface.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attn_dispatch.kernels._triton_flash_config import padded_dim
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem
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

PACKED_HALF_PER_FP32 = 2.0
"""fp16 FLOPs per fp32 FLOP of vector ALUs with packed half math and no matrix cores: gfx906's
`v_dot2_f32_f16` does two fp16 multiply-adds per lane per cycle (MI50: 26.5 fp16 against 13.3
fp32 TFLOP/s, AMD's datasheet; MI60 29.5 against 14.7)."""
MATRIX_CORE_MIN_RATIO = 2 * PACKED_HALF_PER_FP32
"""A card whose fp16 matrix rate is at least this multiple of its fp32 vector rate has matrix cores
(`has_matrix_cores`): packed half math gives 2x, matrix cores 8x (V100, T4, MI100) to 16x (A100,
H100/H200: 989 against 67 TFLOP/s); 4x is well clear of both, and of datasheet rounding."""
NO_MATRIX_BF16_SLOWDOWN = 2.69
"""bf16 against fp16 products on a card without matrix cores: gfx906 has no bf16 dot instruction;
gfx906 forks of vLLM report fp16 running 2.69x faster than bf16 (issue 32). PREDICTED for our
kernels, unmeasured."""
TRITON_FLASH_TIME_VS_FLASH = 0.8
"""PLACEHOLDER, to be replaced by the H200 measurement: a plain Triton FlashAttention forward ran
at 0.78-0.82x the time of PyTorch's flash backend on an H100 (published, issue 32)."""
TRITON_FLASH_EFFICIENCY = FUSED_EFFICIENCY["sdpa_flash"] / TRITON_FLASH_TIME_VS_FLASH
"""Fraction of the achievable matrix rate `triton_flash` reaches on a card with matrix cores:
PyTorch's flash's (0.6 on the H200 probe, `models.rates.FUSED_EFFICIENCY`) over
`TRITON_FLASH_TIME_VS_FLASH`. A placeholder (0.75) until the H200 calibration."""
VECTOR_DOT_EFFICIENCY = 0.5
"""Fraction of the packed-math (or vector) peak `tl.dot` reaches on a card without matrix cores:
PREDICTED, unmeasured (no gfx906 card here). Half: every `v_dot2` takes its operands from LDS
(64 KiB per CU on gfx906), whose bandwidth just keeps up with one dot per cycle at the register
tiles a 4-warp program holds, and the online softmax's rescaling shares the same ALUs."""
GFX906_MEASURED_BANDWIDTH = 886e9
"""gfx906's HBM2 copy bandwidth as measured publicly (880-892 GB/s of the 1024 GB/s datasheet):
the fraction `GFX906_BANDWIDTH_EFFICIENCY` replaces the H200's measured 0.9 there."""
GFX906_BANDWIDTH_EFFICIENCY = GFX906_MEASURED_BANDWIDTH / GFX906_BANDWIDTH
TRITON_LAUNCH_OPS = 2.0
"""Eager-op launch costs (`CardSpec.launch_overhead_s`) of one Triton kernel launch: Triton binds
its ~40 arguments and looks its compiled kernel up by their specialisation in Python, about two
PyTorch ops' worth (unmeasured; replace with the H200 measurement)."""
FLASH_ALLOCATIONS = 2
"""Allocations of a `triton_flash` call: the output and the log-sum-exp (or its placeholder)."""
DECODE_ALLOCATIONS = 2
"""Allocations of a `triton_decode` call: the output and the splits' partials."""
MASK_ITEMSIZE = {"none": 0, "bool": 1, "float": 4}
"""Bytes per mask element a kernel reads (bool as bytes; float masks counted as fp32, as
`Problem.mask_bytes` does)."""


def has_matrix_cores(spec: CardSpec) -> bool:
    """Whether the card's fp16 matrix rate is well past what packed half math on its vector ALUs
    gives (`MATRIX_CORE_MIN_RATIO`): the H200 has them, gfx906 does not."""
    return spec.flops("float16") >= MATRIX_CORE_MIN_RATIO * spec.vector_flops


def is_gfx906_class(spec: CardSpec) -> bool:
    """A card without matrix cores whose memory is gfx906's HBM2 (`models.identity`): its measured
    bandwidth fraction applies."""
    return not has_matrix_cores(spec) and spec.bandwidth == GFX906_BANDWIDTH


def triton_matrix_flops(spec: CardSpec, dtype: str) -> float:
    """Peak FLOP/s of Triton's `tl.dot` on `dtype` inputs (fp32 in IEEE precision, as our kernels
    ask): the spec sheet's matrix rate on a card with matrix cores; without them fp16 at the
    packed-math rate, bf16 `NO_MATRIX_BF16_SLOWDOWN` times slower, fp32 at the vector rate."""
    if has_matrix_cores(spec):
        return spec.flops(dtype)
    if dtype == "float16":
        return spec.flops("float16")
    if dtype == "bfloat16":
        return spec.flops("float16") / NO_MATRIX_BF16_SLOWDOWN
    return spec.vector_flops


def _bandwidth(spec: CardSpec) -> float:
    efficiency = GFX906_BANDWIDTH_EFFICIENCY if is_gfx906_class(spec) else BANDWIDTH_EFFICIENCY
    return spec.bandwidth * efficiency


def _compute_seconds(spec: CardSpec, dtype: str, product_flops: float, score_elements: float) -> float:
    """Matrix products at the Triton rate (`TRITON_FLASH_EFFICIENCY` of it on matrix cores,
    `VECTOR_DOT_EFFICIENCY` without), and the online softmax's arithmetic: overlapped with the
    products on matrix cores, on the same ALUs (added) without them."""
    matrix_cores = has_matrix_cores(spec)
    efficiency = TRITON_FLASH_EFFICIENCY if matrix_cores else VECTOR_DOT_EFFICIENCY
    products = product_flops / (triton_matrix_flops(spec, dtype) * MATMUL_EFFICIENCY * efficiency)
    softmax = score_elements * SOFTMAX_FLOPS_PER_ELEMENT / spec.vector_flops
    return max(products, softmax) if matrix_cores else products + softmax


def _launches(spec: CardSpec, kernels: int, allocations: int) -> float:
    return (kernels * TRITON_LAUNCH_OPS + allocations) * spec.launch_overhead_s


def kv_passes(query_blocks: int, rates: Rates) -> int:
    """Times one head's keys and values come from memory: every query block reads them, but the
    grid puts a head's query blocks side by side (`_triton_flash_tiles.query_block_of_program`),
    so those running at once (one per compute unit) walk the keys in step and the L2 cache serves
    all but the first reader: once per wave of the head's blocks."""
    return rates.waves(query_blocks)


def triton_flash_seconds(problem: Problem, kernel: TritonFlashKernel, spec: CardSpec) -> float:
    """FlashAttention-2's forward (module docstring): products over the visited ``bm x bn`` tiles
    at padded head dims, K and V re-read by every query block, programs in waves, one launch."""
    config = kernel.config
    rates = Rates(problem, spec)
    L, S = max(problem.q_len, 1), max(problem.kv_len, 1)
    fraction, _, query_blocks = visited_fraction(L, S, config.block_m, config.block_n, problem.causal)
    head_dim, value_dim = padded_dim(problem.head_dim), padded_dim(problem.value_dim)
    rows = query_blocks * config.block_m  # the last block's padding is computed too
    keys = math.ceil(S / config.block_n) * config.block_n * fraction
    heads = problem.batch * problem.q_heads
    scores = heads * rows * keys
    product_flops = 2 * scores * (head_dim + value_dim)
    compute = _compute_seconds(spec, problem.dtype, product_flops, scores)
    seen_keys = S * fraction  # padded keys are masked loads: never read
    kv_reads = heads * kv_passes(query_blocks, rates) * seen_keys * (problem.head_dim + problem.value_dim) * problem.itemsize
    mask_reads = heads * L * seen_keys * MASK_ITEMSIZE[problem.mask_kind]  # every visited tile reads its mask
    streamed = (problem.q_bytes + problem.out_bytes + kv_reads + mask_reads
                + 2 * Kernel.input_copy_bytes(problem))
    programs = heads * query_blocks
    return (max(compute, streamed / _bandwidth(spec)) / rates.wave_occupancy(programs)
            + _launches(spec, 1, FLASH_ALLOCATIONS))


def triton_decode_seconds(problem: Problem, kernel: TritonDecodeKernel, spec: CardSpec) -> float:
    """Flash-decoding (module docstring): the visible keys and values read once per block of
    packed rows (once per GQA group up to 64 rows), the splits' fp32 partials written and read
    back by the combine, over (batch x K/V head, split, row block) programs in waves; one launch,
    two with the combine."""
    rates = Rates(problem, spec)
    layout = kernel.layout(problem)
    programs = problem.batch * problem.kv_heads * layout.splits * layout.row_blocks
    visible = layout.key_count / max(problem.kv_len, 1)
    streamed = (problem.kv_bytes * visible * layout.row_blocks + problem.q_bytes + problem.out_bytes
                + problem.mask_bytes + 2 * layout.partial_bytes(problem) + 2 * Kernel.input_copy_bytes(problem))
    padded_rows = layout.block_m * layout.row_blocks / max(layout.rows, 1)
    scores = problem.batch * problem.q_heads * problem.q_len * layout.key_count * padded_rows
    product_flops = problem.flops * visible * padded_rows
    compute = _compute_seconds(spec, problem.dtype, product_flops, scores)
    launches = 1 if layout.direct else 2
    return (max(compute, streamed / _bandwidth(spec)) / rates.wave_occupancy(programs)
            + _launches(spec, launches, DECODE_ALLOCATIONS))
