"""Float masks rebased so each row's largest entry is zero, for half-precision kernels.

Softmax does not change when a row's scores all move by one constant, so SDPA's output does not
either. Kernels that add the mask in half precision (the single-pass path's scores, the bias the
fused backends take) do change: a row whose every key carries -1e5 (or the -65504 that padding
masks put in fp16) swamps the scores' own spread (fp16 overflows to -inf, bf16 rounds to steps of
512), so the row came out as zeros or nearly uniform where SDPA attends by the scores. Subtracting
each row's largest mask entry (among the keys causality leaves visible) removes that common shift
and changes nothing else; rows without a finite largest entry (every key blocked) are left alone.

Rows whose largest entry is beyond `REBASE_LIMIT` are left alone too: there even the float64
reference loses the scores under the shift and attends uniformly (a bf16 or fp32 padding mask
holds -3.4e38), and so do the half kernels.
"""

from __future__ import annotations

import math

import torch

from attn_dispatch.kernels._blocks import causal_blocked
from attn_dispatch.kernels.problem import Problem

REBASE_LIMIT = 2.0**40
"""Largest row shift removed (~1.1e12). Up to it, float64 (the reference's precision) keeps
scores to within 2^-12 after adding the shift, so SDPA's exact result attends by the scores; fp16's
-65504 and the -1e5 of some fp32 masks are far inside. bf16's and fp32's lowest values (-3.4e38),
which every precision rounds the scores away under, are far outside."""


def needs_rebase(problem: Problem) -> bool:
    """Float masks on half-precision inputs that have keys and queries (an empty row has no max)."""
    return problem.mask_kind == "float" and problem.itemsize < 4 and problem.q_len > 0 and problem.kv_len > 0


def rebased_float_mask(mask: torch.Tensor, problem: Problem) -> torch.Tensor:
    """``mask [B|1, H|1, L|1, S]`` (float) minus each row's largest visible entry: a new tensor
    ``[B|1, H|1, L|1 (L when causal), S]`` in the mask's dtype."""
    visible = mask
    if problem.causal:
        blocked = causal_blocked(slice(0, problem.q_len), slice(0, problem.kv_len), mask.device, problem.causal_offset)
        if blocked is not None:
            visible = mask.expand(*mask.shape[:2], problem.q_len, problem.kv_len).masked_fill(blocked, -math.inf)
    top = visible.amax(dim=-1, keepdim=True)
    removable = torch.isfinite(top) & (top.abs() <= REBASE_LIMIT)
    return mask - torch.where(removable, top, torch.zeros_like(top))


FUSED_PENALTY_FLOOR = 2.0**100
"""Most negative finite mask entry a fused GPU backend is given (~1.3e30). The fused kernels scale
scores by log2(e) (and the softmax scale) before exp2, so a penalty of bf16's or fp32's lowest
value (-3.4e38: transformers' padding masks) overflows to -inf there and a row whose visible keys
all carry it comes out as zeros (in PyTorch's own fused backends too), where SDPA's
float64 answer attends uniformly over them: fp32 and fp64 both lose the scores next to either
penalty, so -2^100 gives the same answer without the overflow; -inf stays -inf."""


def floor_penalties_(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` (float, any shape) with finite entries below `-FUSED_PENALTY_FLOOR` raised to it,
    in place (fp16 cannot hold such entries: returned unchanged)."""
    if bias.dtype == torch.float16:
        return bias
    return bias.masked_fill_((bias < -FUSED_PENALTY_FLOOR) & (bias > -math.inf), -FUSED_PENALTY_FLOOR)


PER_ROW_TEMPORARY_BYTES = 32
"""`rebased_float_mask`'s per-row temporaries: the row max, its finiteness, magnitude, limit test
and their conjunction, the zeros and the selected shift (4 + 1 + 4 + 1 + 1 + 4 + 4 bytes with
fp32 masks; rounded up)."""


def rebase_bytes(problem: Problem) -> int:
    """Upper bound of what `rebased_float_mask` allocates: the rebased mask (fp32 counted), the
    per-row temporaries, and with causality the visible copy at full query length, the causal
    block and its position ranges."""
    if not needs_rebase(problem):
        return 0
    batch_heads = math.prod(problem.mask_shape[:2])
    rows = batch_heads * (problem.q_len if problem.causal else problem.mask_shape[2])
    dense = rows * problem.kv_len * 4
    extra = dense + rows * PER_ROW_TEMPORARY_BYTES
    if problem.causal:
        extra += dense + problem.q_len * problem.kv_len + 8 * (problem.q_len + problem.kv_len)
    return extra
