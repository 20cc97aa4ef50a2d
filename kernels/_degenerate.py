"""Attention on inputs with nothing to tile: a size of 0 (B, H, L, S, E or Ev) or meta tensors.

Computed as the plain formula in fp32 (fp64 for fp64 inputs), so the output is what SDPA returns
and stays in the autograd graph (an empty output, zeros when there are no keys, the mean of the
values when the head dim is 0: every score is then 0), and on the meta device it is a meta tensor
of the right shape without reading anything. The sizes involved make the cost negligible, except
for E = 0 with long sequences, which builds the ``[B, H, L, S]`` scores like the math path.
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import accumulation_dtype, causal_blocked
from attn_dispatch.kernels.problem import Problem


def direct_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    problem: Problem,
    scale: float,
) -> torch.Tensor:
    """Canonical ``query [B, Hq, L, E]``, ``key [B, Hkv, S, E]``, ``value [B, Hkv, S, Ev]``,
    ``mask [B|1, Hq|1, L|1, S|1]`` or None -> ``[B, Hq, L, Ev]`` in the query's dtype."""
    acc = accumulation_dtype(query.dtype)
    if problem.gqa_ratio > 1:
        key = key.repeat_interleave(problem.gqa_ratio, dim=1)
        value = value.repeat_interleave(problem.gqa_ratio, dim=1)
    scores = torch.matmul(query.to(acc) * scale, key.to(acc).transpose(-1, -2))  # scaled first: E = 0 gives 0, not 0 * inf
    blocked = None
    if problem.causal:
        blocked = causal_blocked(slice(0, problem.q_len), slice(0, problem.kv_len), scores.device, problem.causal_offset)
    if mask is not None:
        mask_blocked = mask.logical_not() if mask.dtype == torch.bool else None
        if mask_blocked is None:
            scores = scores + mask.to(acc)
        else:
            blocked = mask_blocked if blocked is None else blocked | mask_blocked
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if blocked is not None or mask is not None:  # rows with every key blocked give zeros, not NaN
        probs = probs.masked_fill((scores == float("-inf")).all(dim=-1, keepdim=True), 0.0)
    return torch.matmul(probs, value.to(acc)).to(query.dtype)
