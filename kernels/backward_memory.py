"""Forward-plus-backward memory of one attention call on a kernel: what the training route
(`dispatcher.training_route`) and the training profile (`calibration.training_profile`) check
against a budget before running anything."""

from __future__ import annotations

from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem

FUSED_BACKWARDS = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
"""PyTorch backends whose backward recomputes tiles (memory O(L + S) beyond the gradients)."""

MATH_BACKWARD_SCORE_MATRICES = 4
"""Score-sized fp32 tensors PyTorch's math backward holds at once (scores, probabilities, their
gradient and a product): a forward+backward held to math peaked at 3.0-3.2 score matrices
(docs/RESULTS.md#training-memory), and 4 leaves a margin. Used for every kernel with a backward
that declares no bound (`sdpa_math`, `sdpa_default`, user kernels)."""


def training_bytes(kernel: Kernel, problem: Problem) -> int:
    """Extra peak memory of forward plus backward of one call on `kernel` (never allocates):
    its declared `backward_workspace_bytes`, else an estimate (fused backends: forward workspace,
    row statistics, gradients, an fp32 dQ accumulator and K/V repeated for GQA; anything else:
    the math backward's score matrices, `MATH_BACKWARD_SCORE_MATRICES`)."""
    declared = getattr(kernel, "backward_workspace_bytes", None)
    if declared is not None:
        return int(declared(problem))
    grads = problem.q_bytes + problem.kv_bytes
    forward = int(kernel.workspace_bytes(problem))
    if kernel.family in FUSED_BACKWARDS:
        rows = problem.batch * problem.q_heads * problem.q_len
        dq_accumulator = problem.q_bytes * 4 // problem.itemsize
        return forward + rows * 4 + grads + dq_accumulator + 2 * problem.kv_bytes * problem.gqa_ratio
    return forward + grads + MATH_BACKWARD_SCORE_MATRICES * problem.score_elements * 4
