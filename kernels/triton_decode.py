"""`triton_decode[splits=P,bn=N,w=W,s=T]`: split-KV attention in Triton (flash-decoding), the fused
twin of `small_q`, for a few query rows (decode, speculative decoding) against a deep key/value
cache.

The GQA group's query heads and their query rows are packed into the rows of one block, so K and V
are read once per group, never repeated. The keys are cut into at most ``P`` splits of whole
``N``-key blocks; one program per (batch x K/V head, split) reduces its keys with an online softmax
in fp32 (``W`` warps, ``T`` pipeline stages) and a second small program merges the splits exactly
by their row maxima and sums. Exact SDPA semantics on the canonical views, read through their strides
(a sliced KV cache is never copied): bool and float masks with broadcast dimensions, causal
top-left and bottom-right, ``scale``, zeros for rows with every key blocked, head dims up to 256
(value dim may differ), fp16/bf16/fp32 (fp32 products in IEEE precision).

Inference only (no backward). The Triton code lives in private modules imported on the first run:
importing this module never imports Triton.
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._triton_support import (
    compile_seconds,
    mark_compiled,
    shared_memory_limit,
    triton_reasons,
    triton_variant_key,
)
from attn_dispatch.kernels.base import NO_TRITON_ON_CPU, Kernel, checked_parameter, interpreting
from attn_dispatch.kernels.problem import Problem

MIN_DOT_SIZE = 16
"""Smallest block side `tl.dot` takes on every Triton >= 3.0 target (M, N and K of 16)."""
MAX_BLOCK_ROWS = 64
"""Packed query rows per program. 64 rows of a 256-wide head keep 128 fp32 accumulators per thread
at 4 warps; more would spill registers. Larger row counts take several row blocks."""
MAX_PACKED_ROWS = 256
"""Most packed rows (GQA group size x query length) the kernel takes: K and V are read once per
row block of `MAX_BLOCK_ROWS`, so past 4 blocks a prefill kernel that tiles the queries reads them
as often and parallelises better."""
MAX_HEAD_DIM = 256
"""Largest head dim (query/key and value) the kernel takes, as PyTorch's fused kernels."""
MAX_SPLITS = 1024
"""Most key splits a name may ask for (a grid dimension; more never pays for one group's rows)."""
MAX_BLOCK_KEYS = 256
"""Largest key block a name may ask for (a 256-key block of a 256-wide head is already 128 KiB)."""
MAX_WARPS = 16
"""Largest warp count a name may ask for (Triton's limit for a CUDA block of 512 threads)."""
MAX_STAGES = 8
"""Largest pipeline depth a name may ask for (each stage holds one more key and value block)."""


class TritonDecodeKernel(Kernel):
    """Flash-decoding in Triton: split-KV attention with the GQA group packed into rows.

    Parameters
    ----------
    splits: most splits of the keys (``splits=`` in the name); each split is a whole number of
        key blocks, so short caches use fewer.
    bn: keys per inner step (``bn=``), a power of two from 16 to 256.
    w: warps per program (``w=``), a power of two up to 16.
    s: software-pipeline stages of the key loop (``s=``), 1 to 8.
    """

    family = "triton_decode"
    PARAM_SPACE = {"splits": [1, 2, 4, 8, 16, 32, 64, 128], "bn": [16, 32, 64, 128], "w": [1, 2, 4, 8], "s": [1, 2, 3, 4]}

    def __init__(self, splits: int = 16, bn: int = 64, w: int = 4, s: int = 2) -> None:
        self.splits = checked_parameter("splits (key splits)", splits, 1, MAX_SPLITS)
        self.block_n = checked_parameter("bn (keys per block)", bn, MIN_DOT_SIZE, MAX_BLOCK_KEYS, power_of_two=True)
        self.warps = checked_parameter("w (warps)", w, 1, MAX_WARPS, power_of_two=True)
        self.stages = checked_parameter("s (pipeline stages)", s, 1, MAX_STAGES)

    @property
    def params(self) -> dict[str, object]:
        return {"splits": self.splits, "bn": self.block_n, "w": self.warps, "s": self.stages}

    def layout(self, problem: Problem):
        """How `problem` is laid out on the programs (`_triton_decode_layout.DecodeLayout`: splits
        actually used, block sizes)."""
        from attn_dispatch.kernels._triton_decode_layout import DecodeLayout

        return DecodeLayout.of(problem, self.splits, self.block_n)

    # ------------------------------------------------------------------ capabilities
    def _own_reasons(self, problem: Problem) -> list[str]:
        if problem.device_type == "cpu" and not interpreting():
            why = [NO_TRITON_ON_CPU]  # what `triton_reasons` says, without running it
        else:
            why = triton_reasons(problem.device_type, problem.dtype)
        rows = problem.gqa_ratio * problem.q_len
        if rows > MAX_PACKED_ROWS:
            why.append(f"packs GQA group x query rows ({problem.gqa_ratio} x {problem.q_len} = {rows}) up to "
                       f"{MAX_PACKED_ROWS}: K/V would be read once per {MAX_BLOCK_ROWS} rows; a prefill kernel "
                       "(triton_flash, chunked) serves longer queries")
        if problem.head_dim > MAX_HEAD_DIM or problem.value_dim > MAX_HEAD_DIM:
            why.append(f"head dims up to {MAX_HEAD_DIM} only (query/key {problem.head_dim}, value {problem.value_dim})")
        if not why and problem.device_type == "cuda":
            needed = self.layout(problem).shared_memory_bytes(problem.itemsize, self.stages)
            available = shared_memory_limit()
            if needed > available:
                why.append(f"needs ~{needed // 1024} KiB of shared memory per program at head dim {problem.head_dim}, "
                           f"the GPU has {available // 1024} KiB: use a smaller key block (bn) or fewer stages (s)")
        return why

    def workspace_bytes(self, problem: Problem) -> int:
        """The output, the splits' fp32 partial outputs, row maxima and sums (none with one split),
        and canonicalisation's copies."""
        return problem.out_bytes + self.layout(problem).partial_bytes(problem) + self.input_copy_bytes(problem)

    def setup_seconds(self, problem: Problem) -> float:
        """Seconds the next run of `problem` spends compiling (`_triton_support.compile_seconds`)."""
        return compile_seconds(self, problem)

    def variant_key(self, problem: Problem) -> tuple:
        return triton_variant_key(self, problem)

    # ------------------------------------------------------------------ running
    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        from attn_dispatch.kernels._triton_decode_launch import run_decode

        out = run_decode(query, key, value, mask, float(scale), problem.causal, problem.causal_offset,
                         self.splits, self.block_n, self.warps, self.stages)
        mark_compiled(self, problem)
        return out
