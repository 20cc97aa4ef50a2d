"""`small_q[splits=P]`: split-KV attention for a few query rows against a deep key/value cache
(decode, speculative decoding, chunked prefill).

Query heads sharing a key/value head become rows of one matrix (GQA without repeating K/V). The
keys are viewed as ``P`` splits of ``C = S / P`` positions, scores for every split come from one
batched product, and the value product runs as ``P`` independent reductions of length ``C``
(split-K: more parallel work when ``G * L`` is tiny) summed at the end. Every split is normalised
by the row's global maximum, so the merge is a plain sum: no Python loop over splits.

The split view is free only when ``P`` divides ``S``; the kernel uses the largest divisor of ``S``
not above the requested ``P`` (`effective_splits`).
"""

from __future__ import annotations

import torch

from kernels._blocks import (
    NEG_INF,
    accumulation_dtype,
    accumulation_itemsize,
    normalise,
    prepare_mask,
    query_rows,
)
from kernels.base import Kernel
from kernels.chunked import _positive_int
from kernels.problem import Problem


def effective_splits(requested: int, kv_len: int) -> int:
    """Largest divisor of `kv_len` that is <= `requested` (1 when `kv_len` is 0)."""
    for splits in range(min(requested, max(kv_len, 1)), 0, -1):
        if kv_len % splits == 0:
            return splits
    return 1


class SmallQKernel(Kernel):
    """Split-KV attention, vectorised over splits.

    Parameters
    ----------
    splits: requested number of key/value splits (``splits=`` in the name).
    """

    family = "small_q"
    PARAM_SPACE = {"splits": [1, 2, 4, 8, 16, 32, 64, 128]}

    def __init__(self, splits: int = 8) -> None:
        self.splits = _positive_int("splits", splits)

    @property
    def params(self) -> dict[str, object]:
        return {"splits": self.splits}

    def workspace_bytes(self, problem: Problem) -> int:
        """Scaled query rows (and their per-split broadcast copy), scores in the input dtype, in
        fp32 and cast back, mask blocks, per-split partial outputs, statistics and the output."""
        item, acc = problem.itemsize, accumulation_itemsize(problem)
        splits = effective_splits(self.splits, problem.kv_len)
        rows = problem.batch * problem.q_heads * problem.q_len
        score_elem = acc + (2 * item if item != acc else 0)
        mask_elem = 1 if problem.causal or problem.mask_kind != "none" else 0
        return (
            problem.out_bytes
            + self.input_copy_bytes(problem)
            + (problem.mask_bytes if problem.mask_kind == "bool" else 0)
            + rows * problem.head_dim * item * (1 + splits)
            + rows * problem.kv_len * (score_elem + mask_elem)
            + rows * problem.value_dim * (splits * item + 2 * acc)
            + rows * 4 * acc
        )

    def _forward(self, query, key, value, mask, problem: Problem, scale: float) -> torch.Tensor:
        B, Hkv, G, L, S = problem.batch, problem.kv_heads, problem.gqa_ratio, problem.q_len, problem.kv_len
        splits = effective_splits(self.splits, S)
        rows = query_rows(query, slice(0, L), problem, scale)  # [B, Hkv, G*L, E]
        key_splits = key.unflatten(2, (splits, S // splits))  # [B, Hkv, P, C, E]
        value_splits = value.unflatten(2, (splits, S // splits))  # [B, Hkv, P, C, Ev]
        scores = torch.matmul(rows.unsqueeze(2), key_splits.transpose(-1, -2))  # [B, Hkv, P, R, C]
        scores = scores.to(accumulation_dtype(scores.dtype))
        self._mask_(scores, mask, problem, splits)
        row_max = scores.amax(dim=(2, 4), keepdim=True)  # [B, Hkv, 1, R, 1]
        probs = scores.sub_(row_max.masked_fill(row_max == NEG_INF, 0.0)).exp_()
        row_sum = probs.sum(dim=(2, 4), keepdim=True).squeeze(2)  # [B, Hkv, R, 1]
        partial = torch.matmul(probs.to(value.dtype), value_splits)  # [B, Hkv, P, R, Ev]
        out = partial.sum(dim=2, dtype=probs.dtype)  # [B, Hkv, R, Ev]
        out = normalise(out, row_sum, query.dtype)
        return out.view(B, Hkv * G, L, problem.value_dim)

    @staticmethod
    def _mask_(scores: torch.Tensor, mask, problem: Problem, splits: int) -> None:
        """Mask ``scores [B, Hkv, P, G*L, C]`` in place (split-major layout)."""
        B, Hkv, G, L, S = problem.batch, problem.kv_heads, problem.gqa_ratio, problem.q_len, problem.kv_len
        chunk = S // splits
        scores6 = scores.view(B, Hkv, splits, G, L, chunk)
        mask, mask_blocks = prepare_mask(mask)
        if mask is not None:
            m = mask.unflatten(3, (splits, chunk)) if mask.shape[3] > 1 else mask.unsqueeze(3)
            # m: [B|1, H|1, L|1, P|1, C|1]
            m = m.unflatten(1, (Hkv, G)) if m.shape[1] > 1 else m.unsqueeze(2)
            m = m.permute(0, 1, 4, 2, 3, 5)  # [B|1, Hkv|1, P|1, G|1, L|1, C|1]
            if mask_blocks:
                scores6.masked_fill_(m, NEG_INF)
            else:
                scores6.add_(m)
        if problem.causal and S > 1:
            k_pos = torch.arange(S, device=scores.device).view(splits, 1, 1, chunk)
            q_pos = torch.arange(L, device=scores.device).view(1, 1, L, 1)
            scores6.masked_fill_(k_pos > q_pos, NEG_INF)  # [P, 1, L, C]
