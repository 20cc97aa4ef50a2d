"""`triton_flash[bm=M,bn=N,w=W,s=P]`: FlashAttention-2's forward and backward as Triton kernels.

For cards where PyTorch has no fused SDPA backend (gfx906: AOTriton has no target for it, while
Triton >= 3.8 compiles for it) and as a contender everywhere else. One program per block of
``bm`` query rows streams the key/value blocks (``bn`` rows) it can see through an online softmax
(fp32 accumulation), with ``w`` warps and ``s`` software-pipeline stages; the backward recomputes
the probabilities from the saved log-sum-exp (`kernels._triton_flash_backward`). Exact SDPA
semantics on the canonical views, read through their strides: bool and float masks with
broadcast dimensions, causal top-left and bottom-right, ``scale``, GQA without repeating K/V,
zeros (and zero gradients) for rows with every key blocked, head dims up to 256.

The Triton code lives in private modules imported on the first run: importing this module (and
`attn_dispatch.kernels`) never imports Triton.
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
from attn_dispatch.kernels.chunked import needs_backward
from attn_dispatch.kernels.problem import Problem

MIN_BLOCK = 16
"""Smallest block edge: `tl.dot` needs every operand dimension to be at least 16."""
MAX_HEAD_DIM = 256
"""Largest head dim (query/key and value): one padded row of 256 fp32 accumulators per query row
is what a block's registers hold; FlashAttention-2 stops at 256 too."""
MAX_BLOCK = 256
"""Largest block edge a name may ask for (a 256 x 256 fp32 score tile is already past a
program's registers on every card we know)."""
MAX_WARPS = 16
"""Largest warp count a name may ask for (Triton's limit for a CUDA block of 512 threads)."""
MAX_STAGES = 8
"""Largest pipeline depth a name may ask for (each stage holds one more key and value block)."""


def padded_dim(size: int) -> int:
    """A head dim rounded up to a power of two of at least `MIN_BLOCK` (a block's width)."""
    return max(MIN_BLOCK, 1 << max(size - 1, 0).bit_length())


class TritonFlashKernel(Kernel):
    """FlashAttention-2 in Triton, forward and backward.

    Parameters
    ----------
    bm: query rows per block (``bm=`` in the name), a power of two from 16 to 256.
    bn: key/value rows per block (``bn=``), a power of two from 16 to 256.
    w: warps per program (``w=``), a power of two up to 16.
    s: software-pipeline stages of the key/value loop (``s=``), 1 to 8.
    """

    family = "triton_flash"
    supports_backward = True  # FlashAttention-2's backward: `kernels._triton_flash_backward`
    PARAM_SPACE = {"bm": [16, 32, 64, 128, 256], "bn": [16, 32, 64, 128, 256], "w": [1, 2, 4, 8], "s": [1, 2, 3, 4, 5]}

    def __init__(self, bm: int = 128, bn: int = 64, w: int = 8, s: int = 3) -> None:
        self._blocks = (
            checked_parameter("bm (query rows per block)", bm, MIN_BLOCK, MAX_BLOCK, power_of_two=True),
            checked_parameter("bn (key rows per block)", bn, MIN_BLOCK, MAX_BLOCK, power_of_two=True),
            checked_parameter("w (warps)", w, 1, MAX_WARPS, power_of_two=True),
            checked_parameter("s (pipeline stages)", s, 1, MAX_STAGES, power_of_two=False),
        )
        self._config = None

    @property
    def config(self):
        """The `_triton_flash_config.FlashConfig` (made on first use: a CPU process never needs it)."""
        if self._config is None:
            from attn_dispatch.kernels._triton_flash_config import FlashConfig

            self._config = FlashConfig(*self._blocks)
        return self._config

    @property
    def params(self) -> dict[str, object]:
        return dict(zip(("bm", "bn", "w", "s"), self._blocks, strict=True))

    # ------------------------------------------------------------------ capabilities
    def _own_reasons(self, problem: Problem) -> list[str]:
        if problem.device_type == "cpu" and not interpreting():
            why = [NO_TRITON_ON_CPU]  # what `triton_reasons` says, without running it
        else:
            why = triton_reasons(problem.device_type, problem.dtype)
        if problem.head_dim > MAX_HEAD_DIM or problem.value_dim > MAX_HEAD_DIM:
            why.append(f"head dims up to {MAX_HEAD_DIM} only (query/key {problem.head_dim}, value {problem.value_dim})")
        if not why and problem.device_type == "cuda":
            from attn_dispatch.kernels._triton_flash_config import forward_shared_bytes, mask_element_bytes

            needed = forward_shared_bytes(self.config, problem.head_dim, problem.value_dim, problem.itemsize,
                                          mask_element_bytes(problem.mask_kind, problem.itemsize))
            available = shared_memory_limit()
            if needed > available:
                why.append(f"needs ~{needed // 1024} KiB of shared memory per program at head dim {problem.head_dim}, "
                           f"the GPU has {available // 1024} KiB: use smaller blocks (bm, bn) or fewer stages (s)")
        return why

    def workspace_bytes(self, problem: Problem) -> int:
        """The output, the log-sum-exp (kept when a backward follows) and canonicalisation's copies."""
        from attn_dispatch.kernels._triton_flash_config import row_statistics_bytes

        return problem.out_bytes + row_statistics_bytes(problem) + self.input_copy_bytes(problem)

    def backward_workspace_bytes(self, problem: Problem) -> int:
        """Extra peak memory of forward plus backward of one call (the training route's bound):
        the saved output, log-sum-exp and input copies, the copies' gradients, dQ/dK/dV in the
        input dtype and the backward's ``rowsum(dO * O)``. dQ/dK/dV accumulate in registers."""
        from attn_dispatch.kernels._triton_flash_config import row_statistics_bytes

        copies = self.input_copy_bytes(problem)
        saved = problem.out_bytes + row_statistics_bytes(problem) + copies
        gradients = problem.q_bytes + problem.kv_bytes
        return saved + copies + gradients + row_statistics_bytes(problem)

    def setup_seconds(self, problem: Problem) -> float:
        """Seconds the next run of `problem` spends compiling (`_triton_support.compile_seconds`)."""
        return compile_seconds(self, problem)

    def variant_key(self, problem: Problem) -> tuple:
        return triton_variant_key(self, problem)

    # ------------------------------------------------------------------ running
    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        with_backward = needs_backward(query, key, value)
        if with_backward and mask is not None and mask.requires_grad:
            raise RuntimeError(
                "attn_mask requires grad, and triton_flash's backward gives the mask no gradient: call "
                "PyTorch's scaled_dot_product_attention for a learned mask (the dispatcher does so)"
            )
        from attn_dispatch.kernels._triton_flash_ops import flash_attention

        out = flash_attention(query, key, value, mask, scale, problem.causal, problem.causal_offset, self.config,
                              with_backward)
        mark_compiled(self, problem)
        return out
