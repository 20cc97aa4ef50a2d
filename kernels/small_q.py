"""`small_q[splits=P]`: split-KV attention for a few query rows against a deep cache (decode, speculative decoding,
chunked prefill): one QK^T product over GQA-grouped rows, PyTorch's fused softmax, and the value product as ``P``
reductions over ``S / P`` keys summed at the end (`chunked.split_kv_product`). ``P`` is the largest divisor of ``S``
not above the request (`effective_splits`)."""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import query_rows, score_keys, score_keys_bytes, score_recipe
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.chunked import _positive_int, single_pass_attention, single_pass_workspace_bytes
from attn_dispatch.kernels.problem import Problem


def effective_splits(requested: int, kv_len: int) -> int:
    """Largest divisor of `kv_len` that is <= `requested` (1 when `kv_len` is 0)."""
    for splits in range(min(requested, max(kv_len, 1)), 0, -1):
        if kv_len % splits == 0:
            return splits
    return 1


class SmallQKernel(Kernel):
    """Split-KV attention, vectorised over splits (``splits=``: the requested count)."""

    family = "small_q"
    PARAM_SPACE = {"splits": [1, 2, 4, 8, 16, 32, 64, 128]}

    def __init__(self, splits: int = 8) -> None:
        self.splits = _positive_int("splits", splits)

    @property
    def params(self) -> dict[str, object]:
        return {"splits": self.splits}

    def workspace_bytes(self, problem: Problem) -> int:
        splits = effective_splits(self.splits, problem.kv_len)
        return (
            problem.out_bytes
            + self.input_copy_bytes(problem)
            + single_pass_workspace_bytes(problem, problem.q_len, splits)
            + score_keys_bytes(problem)
        )

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        recipe = score_recipe(query.dtype, query.device, scale)  # fp32 scores: no fp16 overflow
        rows = query_rows(query, slice(0, problem.q_len), problem, recipe.query_scale, recipe.operand)  # [B, Hkv, G*L, E]
        splits = effective_splits(self.splits, problem.kv_len)
        out = single_pass_attention(rows, score_keys(key, recipe.operand), value, mask, slice(0, problem.q_len), problem,
                                    splits, recipe.score_scale)
        return out.view(problem.batch, problem.q_heads, problem.q_len, problem.value_dim)
