"""One-pass attention of a block of query rows against all (or one block of) keys, with
PyTorch's fused softmax: few kernel launches and no fp32 copy of the score matrix.

Scores come out of the QK^T product in the input dtype (the product itself accumulates in fp32
on GPUs and CPUs); `torch.softmax` reads them, accumulates max and sum in fp32 and writes the
probabilities in the input dtype. Rows whose every key is blocked give zeros (`_safe_softmax`).
Used by `small_q` and by `chunked` when one key block covers every key.
"""

from __future__ import annotations

import torch

from kernels._blocks import mask_scores_
from kernels.problem import Problem

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


def split_kv_product(probs: torch.Tensor, value: torch.Tensor, splits: int) -> torch.Tensor:
    """``probs [B, Hkv, R, S] @ value [B, Hkv, S, Ev]`` as `splits` independent reductions of
    ``S / splits`` keys (split-K: parallel work when R is tiny), summed in fp32.

    `splits` must divide S. Returns ``[B, Hkv, R, Ev]`` in the value dtype.
    """
    if splits == 1:
        return torch.matmul(probs, value)
    B, Hkv, R, S = probs.shape
    chunk = S // splits
    per_split = probs.view(B, Hkv, R, splits, chunk).transpose(2, 3)  # [B, Hkv, P, R, C]
    partial = torch.matmul(per_split, value.unflatten(2, (splits, chunk)))  # [B, Hkv, P, R, Ev]
    return partial.sum(dim=2, dtype=torch.float32).to(value.dtype)


def single_pass_attention(
    rows: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    q_positions: slice,
    problem: Problem,
    splits: int = 1,
) -> torch.Tensor:
    """Scaled query rows ``[B, Hkv, G*Lc, E]`` (positions `q_positions`) against every key.

    key ``[B, Hkv, S, E]``, value ``[B, Hkv, S, Ev]``; mask ``[B|1, Hq|1, L|1, S|1]`` or None.
    Returns ``[B, Hkv, G*Lc, Ev]`` in the input dtype.
    """
    scores = torch.matmul(rows, key.transpose(-1, -2))  # [B, Hkv, R, S], input dtype
    mask_scores_(scores, mask, problem.causal, q_positions, slice(0, problem.kv_len), problem)
    probs = softmax_rows(scores, may_have_dead_rows=mask is not None)
    del scores
    return split_kv_product(probs, value, splits)


def single_pass_workspace_bytes(problem: Problem, q_rows: int, splits: int) -> int:
    """Peak extra bytes of `single_pass_attention` for `q_rows` query positions, tensor by tensor:
    scaled query rows; scores and probabilities in the input dtype (both alive in the softmax);
    `_safe_softmax`'s all-blocked test (1 byte per score) and the causal block; with splits, the
    transposed copy of the probabilities the batched product makes, the per-split partial
    outputs and their fp32 sum; the block's output."""
    item = problem.itemsize
    rows = problem.batch * problem.q_heads * q_rows
    scores = rows * problem.kv_len
    extra = rows * problem.head_dim * item + scores * (2 * item)
    if problem.mask_kind != "none":
        extra += scores * (item + 1)  # `_safe_softmax`'s all-blocked test
    if problem.mask_kind == "bool":
        extra += scores  # the inverted mask block (at most one byte per score)
    if problem.causal:
        extra += q_rows * problem.kv_len * 2
    if splits > 1:
        extra += scores * item + rows * problem.value_dim * (splits * item + 4)
    return extra + rows * problem.value_dim * item
