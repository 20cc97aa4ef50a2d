"""`math`: the reference path: the whole ``[B, Hq, L, S]`` score matrix, fp32 softmax. Fast when small; its memory
grows with ``L * S``."""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import (
    block_scores,
    block_workspace_bytes,
    mask_scores_,
    normalise,
    query_rows,
    score_keys,
    score_keys_bytes,
    score_recipe,
    softmax_partials,
)
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem


class MathKernel(Kernel):
    """Full score matrix in one block; GQA by grouping query heads (K/V never repeated)."""

    family = "math"

    def workspace_bytes(self, problem: Problem) -> int:
        return (
            problem.out_bytes
            + self.input_copy_bytes(problem)
            + block_workspace_bytes(problem, problem.q_len, problem.kv_len)
            + score_keys_bytes(problem)
        )

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        rows, cols = slice(0, problem.q_len), slice(0, problem.kv_len)
        recipe = score_recipe(query.dtype, query.device, scale)
        q_rows = query_rows(query, rows, problem, recipe.query_scale, recipe.operand)
        scores = block_scores(q_rows, score_keys(key, recipe.operand), recipe.score_scale)
        mask_scores_(scores, mask, problem.causal, rows, cols, problem)
        _, row_sum, out = softmax_partials(scores, value)
        out = normalise(out, row_sum, query.dtype)
        return out.view(problem.batch, problem.q_heads, problem.q_len, problem.value_dim)
