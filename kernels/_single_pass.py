"""One-pass attention of a block of query rows against all (or one block of) keys, with
PyTorch's fused softmax: few kernel launches and no fp32 copy of the score matrix.

Scores come out of the QK^T product in fp32 (`_blocks.block_scores`: fp16 scores overflow past
65504); `torch.softmax` normalises them in fp32 and the probabilities are cast to the value dtype
for the PV product. Rows whose every key is blocked give zeros (`_safe_softmax`).
Used by `small_q` and by `chunked` when one key block covers every key.
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import HALF_DTYPES, accumulation_dtype, fp32_product, mask_scores_
from attn_dispatch.kernels.problem import Problem

_safe_softmax = getattr(torch.ops.aten, "_safe_softmax", None)  # PyTorch >= 2.5


def softmax_rows(scores: torch.Tensor, may_have_dead_rows: bool) -> torch.Tensor:
    """Softmax over the last dim in the input dtype (fp32 accumulation); rows that are all
    -inf give zeros when `may_have_dead_rows`."""
    if not may_have_dead_rows:
        return torch.softmax(scores, dim=-1)
    if _safe_softmax is not None:
        return _safe_softmax(scores, -1)
    probs = torch.softmax(scores, dim=-1)
    return probs.masked_fill_((scores == float("-inf")).all(dim=-1, keepdim=True), 0.0)


def _batched(tensor: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, n, m]`` -> ``[B * Hkv, n, m]`` (a view when the strides allow, as in `torch.matmul`)."""
    return tensor.reshape(-1, *tensor.shape[-2:])


def row_major_scores(rows: torch.Tensor, key: torch.Tensor, score_scale: float = 1.0) -> torch.Tensor:
    """``score_scale * rows [B, Hkv, R, E] @ key [B, Hkv, S, E]^T`` in fp32 (fp64 for fp64 operands), stored
    row-outermost (half operands only where `has_fp32_output_product`).

    The result is a ``[B * Hkv, R, S]`` view of a contiguous ``[R, B * Hkv, S]`` buffer: each
    row of scores stays contiguous (for the fused softmax), and a block of ``C`` keys of every
    (head, split) pair sits at one constant stride, so the split-K value product can read it in
    place (`split_kv_product`) instead of through a transposed copy.
    """
    R, S = rows.shape[-2], key.shape[-2]
    heads = rows.shape[0] * rows.shape[1]
    buffer = torch.empty(R, heads, S, dtype=accumulation_dtype(rows.dtype), device=rows.device)
    scores = buffer.transpose(0, 1)  # [B*Hkv, R, S], strides (S, B*Hkv*S, 1)
    if rows.dtype in HALF_DTYPES:
        return fp32_product(_batched(rows), _batched(key).transpose(1, 2), scores, score_scale)
    torch.bmm(_batched(rows), _batched(key).transpose(1, 2), out=scores)
    return scores if score_scale == 1.0 else scores.mul_(score_scale)


def split_kv_product(probs: torch.Tensor, value: torch.Tensor, splits: int) -> torch.Tensor:
    """``probs [B*Hkv, R, S]`` (row-outermost, from `row_major_scores`) ``@ value [B, Hkv, S, Ev]``
    as `splits` independent reductions of ``C = S / splits`` keys (split-K: parallel work when R
    is tiny), summed with fp32 accumulation.

    `splits` must divide S. Returns ``[B*Hkv, R, Ev]`` in the value dtype.
    """
    values = _batched(value)
    if splits == 1:
        return torch.bmm(probs, values)
    heads, R, S = probs.shape
    chunk = S // splits
    # (head, split) pairs sit at a constant stride `chunk` in the row-outermost buffer: no copy.
    per_split = probs.transpose(0, 1).reshape(R, heads * splits, chunk).transpose(0, 1)  # [B*Hkv*P, R, C]
    partial = torch.bmm(per_split, values.reshape(heads * splits, chunk, -1))  # [B*Hkv*P, R, Ev]
    return partial.view(heads, splits, R, -1).sum(dim=1)  # reductions accumulate in fp32


def single_pass_attention(
    rows: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    q_positions: slice,
    problem: Problem,
    splits: int = 1,
    score_scale: float = 1.0,
) -> torch.Tensor:
    """Query rows ``[B, Hkv, G*Lc, E]`` (positions `q_positions`; their scores are multiplied by
    `score_scale`, the rest of the scale is already in the rows) against every key.

    key ``[B, Hkv, S, E]`` in the rows' dtype (`_blocks.score_keys`), value ``[B, Hkv, S, Ev]``;
    mask ``[B|1, Hq|1, L|1, S|1]`` or None. Returns ``[B, Hkv, G*Lc, Ev]`` in the value dtype.
    """
    scores = row_major_scores(rows, key, score_scale)  # [B*Hkv, R, S]
    mask_scores_(scores.view(rows.shape[:-1] + (problem.kv_len,)), mask, problem.causal, q_positions,
                 slice(0, problem.kv_len), problem)
    # Softmax on the contiguous buffer (on the transposed view it would copy first).
    probs = softmax_rows(scores.transpose(0, 1), may_have_dead_rows=mask is not None or problem.causal_offset < 0)
    del scores
    probs = probs.to(value.dtype).transpose(0, 1)  # keeps the row-outermost layout
    return split_kv_product(probs, value, splits).view(rows.shape[:-1] + (value.shape[-1],))


def single_pass_workspace_bytes(problem: Problem, q_rows: int, splits: int) -> int:
    """Peak extra bytes of `single_pass_attention` for `q_rows` query positions, tensor by tensor:
    scaled query rows (fp32 counted); fp32 scores and probabilities (both alive in the softmax),
    then the probabilities cast to the input dtype (the fp32 scores are gone by then; counted
    anyway); `_safe_softmax`'s all-blocked test (1 byte per score) and the causal block; with
    splits, the per-split partial outputs; the block's output. The keys' fp32 copy, where one is
    made, is the caller's (`_blocks.score_keys_bytes`)."""
    item, acc = problem.itemsize, (8 if problem.dtype == "float64" else 4)
    rows = problem.batch * problem.q_heads * q_rows
    scores = rows * problem.kv_len
    extra = rows * problem.head_dim * acc + scores * (2 * acc + (item if item < acc else 0))
    if problem.mask_kind != "none":
        extra += scores * (acc + 1)  # `_safe_softmax`'s all-blocked test
    if problem.mask_kind == "bool":
        extra += scores  # the inverted mask block (at most one byte per score)
    if problem.causal:
        extra += q_rows * problem.kv_len * 2
    if splits > 1:
        extra += rows * problem.value_dim * splits * item
    return extra + rows * problem.value_dim * item
