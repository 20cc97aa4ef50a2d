"""`chunked[q=Qc,kv=Kc]`: query chunks times key/value chunks merged with an online softmax.

Peak extra memory is O(Qc x Kc) per head whatever the sequence lengths, so a 32k x 32k problem
runs where the math path would need the whole score matrix. Causal blocks that lie entirely above
the diagonal are skipped. When one key block covers every key, each query block is a single pass
with PyTorch's fused softmax (no online merge).
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import (
    OnlineSoftmax,
    block_scores,
    block_workspace_bytes,
    fully_blocked_by_causality,
    mask_scores_,
    query_rows,
    scatter_rows,
    score_keys,
    score_keys_bytes,
    score_recipe,
    softmax_partials,
)
from attn_dispatch.kernels._chunked_backward import (
    chunked_attention_with_backward,
    needs_backward,
    training_workspace_bytes,
)
from attn_dispatch.kernels._single_pass import single_pass_attention, single_pass_workspace_bytes
from attn_dispatch.kernels.base import Kernel
from attn_dispatch.kernels.problem import Problem


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class ChunkedKernel(Kernel):
    """Flash-attention's tiling in plain PyTorch ops.

    Parameters
    ----------
    q_chunk: query positions per block (``q=`` in the name).
    kv_chunk: key positions per block (``kv=``); a block at least as long as the keys means one
        pass with no online-softmax merge.
    """

    family = "chunked"
    supports_backward = True  # FlashAttention-2's backward: `kernels._chunked_backward`
    PARAM_SPACE = {"q": [64, 128, 256, 512, 1024, 2048, 4096], "kv": [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]}

    def __init__(self, q: int = 512, kv: int = 4096) -> None:
        self.q_chunk = _positive_int("q (query chunk)", q)
        self.kv_chunk = _positive_int("kv (key/value chunk)", kv)

    @property
    def params(self) -> dict[str, object]:
        return {"q": self.q_chunk, "kv": self.kv_chunk}

    def workspace_bytes(self, problem: Problem) -> int:
        q_rows = min(self.q_chunk, problem.q_len)
        if self.kv_chunk >= problem.kv_len:
            block = single_pass_workspace_bytes(problem, q_rows, splits=1)
        else:
            block = block_workspace_bytes(problem, q_rows, self.kv_chunk)
        return (
            problem.out_bytes
            + self.input_copy_bytes(problem)
            + block
            + score_keys_bytes(problem)
        )

    def backward_workspace_bytes(self, problem: Problem) -> int:
        """Extra peak memory of forward plus backward of one call (the training route's bound)."""
        return training_workspace_bytes(problem, self.q_chunk, self.kv_chunk)

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        if needs_backward(query, key, value):
            return chunked_attention_with_backward(query, key, value, mask, problem, scale, self.q_chunk, self.kv_chunk)
        L, S = problem.q_len, problem.kv_len
        out = query.new_empty(problem.batch, problem.q_heads, L, problem.value_dim)
        one_kv_block = self.kv_chunk >= S
        recipe = score_recipe(query.dtype, query.device, scale)  # fp32 scores: no fp16 overflow
        score_key = score_keys(key, recipe.operand)
        for q_start in range(0, L, self.q_chunk):
            rows = slice(q_start, min(L, q_start + self.q_chunk))
            q_block = query_rows(query, rows, problem, recipe.query_scale, recipe.operand)
            if one_kv_block:  # no online merge needed: PyTorch's fused softmax, one pass
                block = single_pass_attention(q_block, score_key, value, mask, rows, problem, score_scale=recipe.score_scale)
                scatter_rows(out, block, rows, problem)
                continue
            state = OnlineSoftmax()
            for kv_start in range(0, S, self.kv_chunk):
                cols = slice(kv_start, min(S, kv_start + self.kv_chunk))
                if problem.causal and fully_blocked_by_causality(rows, cols, problem.causal_offset):
                    break
                scores = block_scores(q_block, score_key[:, :, cols], recipe.score_scale)
                mask_scores_(scores, mask, problem.causal, rows, cols, problem)
                state.update(*softmax_partials(scores, value[:, :, cols]))
                del scores  # free this block before the next one is allocated
            if state.out is None:  # every key lies after these queries (bottom-right causal, L > S)
                out[:, :, rows] = 0
                continue
            scatter_rows(out, state.result(query.dtype), rows, problem)
        return out
