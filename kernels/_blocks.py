"""Building blocks of the portable kernels: scores of query rows against a key block, masking, partial softmax and
the online-softmax merge. Query heads are grouped by their key/value head (GQA without repeating K/V): a block of
``Lc`` query positions is ``rows [B, Hkv, R = G * Lc, E]``. Scores and softmax statistics are fp32 (fp64 for fp64),
as in PyTorch's math path: fp16 QK^T overflows past 65504 (`score_recipe`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from attn_dispatch.kernels.problem import Problem

NEG_INF = float("-inf")
KEY_COUNT_MULTIPLE = 8
"""Key counts that are a multiple of this run our kernels' matrix products on their fast paths
(docs/RESULTS.md#kernels-per-call); measured entries carry only within one side
(`dispatcher.device_ranking.measured_alignment_carries`)."""


def key_count_aligned(kv_len: int) -> bool:
    return kv_len % KEY_COUNT_MULTIPLE == 0


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def accumulation_itemsize(problem: Problem) -> int:
    return 8 if problem.dtype == "float64" else 4


HALF_DTYPES = (torch.float16, torch.bfloat16)
_fp32_product: dict[tuple[str, torch.dtype], bool] = {}


def has_fp32_output_product(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch.bmm` multiplies `dtype` into an fp32 result on this device type (probed once)."""
    cache_key = (device.type, dtype)
    known = _fp32_product.get(cache_key)
    if known is None:
        known = False
        if device.type == "cuda" and hasattr(torch.ops.aten.baddbmm, "dtype_out"):
            try:
                one = torch.ones(1, 1, 1, dtype=dtype, device=device)
                out = torch.empty(1, 1, 1, device=device)
                known = (torch.ops.aten.bmm.dtype(one, one, torch.float32).dtype == torch.float32
                         and float(fp32_product(one, one, out, 0.5)) == 0.5)
            except (RuntimeError, NotImplementedError):
                known = False
        _fp32_product[cache_key] = known
    return known


class ScoreRecipe(NamedTuple):
    """How the scores ``scale * Q K^T`` are formed (`score_recipe`)."""

    operand: torch.dtype
    """The dtype Q and K enter the product in."""
    query_scale: float
    """Multiplies Q before the product (1.0: Q enters unscaled)."""
    score_scale: float
    """Multiplies the fp32 scores after the product (1.0: nothing to do)."""


def fp32_product(batch1: torch.Tensor, batch2: torch.Tensor, out: torch.Tensor, scale: float) -> torch.Tensor:
    """``out = scale * batch1 @ batch2`` in fp32 from half operands, the scale as the GEMM's alpha."""
    if scale == 1.0:
        return torch.ops.aten.bmm.dtype_out(batch1, batch2, torch.float32, out=out)
    return torch.ops.aten.baddbmm.dtype_out(out, batch1, batch2, torch.float32, beta=0, alpha=scale, out=out)


def score_recipe(dtype: torch.dtype, device: torch.device, scale: float) -> ScoreRecipe:
    """Scores in fp32 from half inputs, at the least cost the device allows:

    - fp32 / fp64 inputs, or half inputs with a power-of-two scale <= 1 on a device with an fp32-result product: the
      scale folded into Q (exact), Q and K in their own dtype;
    - half inputs with another scale on such a device: Q and K unscaled, the fp32 scores scaled;
    - half inputs elsewhere (CPU): Q and K upcast to fp32, the scale folded into Q."""
    if dtype not in HALF_DTYPES:
        return ScoreRecipe(dtype, scale, 1.0)
    if not has_fp32_output_product(device, dtype):
        return ScoreRecipe(torch.float32, scale, 1.0)
    if abs(scale) <= 1.0 and _exact_in_half(scale):
        return ScoreRecipe(dtype, scale, 1.0)
    return ScoreRecipe(dtype, 1.0, scale)


def _exact_in_half(scale: float) -> bool:
    """Whether multiplying a half-precision query by `scale` rounds nothing (a power of two)."""
    mantissa, _ = math.frexp(abs(scale))
    return scale != 0.0 and mantissa == 0.5


def query_rows(query: torch.Tensor, rows: slice, problem: Problem, scale: float,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """``query`` positions `rows` times `scale` in `dtype` (default: the query's) -> new ``[B, Hkv, G * Lc, E]``."""
    source = query[:, :, rows]
    dtype = source.dtype if dtype is None else dtype
    block = torch.empty(source.shape, dtype=dtype, device=source.device)  # contiguous
    if scale == 1.0:
        block.copy_(source)
    elif dtype == source.dtype:
        torch.mul(source, scale, out=block)
    else:  # upcast first: the scale is applied in fp32
        block.copy_(source).mul_(scale)
    return block.view(problem.batch, problem.kv_heads, -1, problem.head_dim)


def score_keys(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``key`` in the score operand dtype (itself when it already is)."""
    return key if key.dtype == dtype else key.to(dtype)


def block_scores(rows: torch.Tensor, key_block: torch.Tensor, score_scale: float = 1.0) -> torch.Tensor:
    """``score_scale * rows [B, Hkv, R, E] @ key_block [B, Hkv, Sc, E]^T`` -> fp32 (fp64) scores ``[B, Hkv, R, Sc]``."""
    if rows.dtype not in HALF_DTYPES:
        scores = torch.matmul(rows, key_block.transpose(-1, -2))
        return scores if score_scale == 1.0 else scores.mul_(score_scale)
    B, H, R, E = rows.shape
    scores = torch.empty(B * H, R, key_block.shape[-2], dtype=torch.float32, device=rows.device)
    fp32_product(rows.reshape(B * H, R, E), key_block.reshape(B * H, -1, E).transpose(1, 2), scores, score_scale)
    return scores.view(B, H, R, -1)


def causal_blocked(rows: slice, cols: slice, device: torch.device, offset: int = 0) -> torch.Tensor | None:
    """``[Lc, Sc]`` bool, True where key > query + `offset` (`Problem.causal_offset`); None if nothing is blocked."""
    if cols.stop - 1 <= rows.start + offset:
        return None
    q_pos = torch.arange(rows.start + offset, rows.stop + offset, device=device)
    k_pos = torch.arange(cols.start, cols.stop, device=device)
    return k_pos[None, :] > q_pos[:, None]


def fully_blocked_by_causality(rows: slice, cols: slice, offset: int = 0) -> bool:
    """Every key in `cols` lies after every query in `rows` (shifted by `offset`)."""
    return cols.start > rows.stop - 1 + offset


def mask_scores_(scores: torch.Tensor, mask: torch.Tensor | None, causal: bool, rows: slice, cols: slice,
                 problem: Problem) -> None:
    """Apply the mask (``[B|1, Hq|1, L|1, S|1]``, bool True = attend, or float added) and causality to ``scores [B,
    Hkv, G*Lc, Sc]`` in place; bool masks are inverted per block."""
    if mask is None and not causal:
        return
    scores5 = scores.view(problem.batch, problem.kv_heads, problem.gqa_ratio, -1, scores.shape[-1])
    if mask is not None:
        block = mask
        if block.shape[2] > 1:
            block = block[:, :, rows]
        if block.shape[3] > 1:
            block = block[:, :, :, cols]
        if block.shape[1] > 1:
            block = block.unflatten(1, (problem.kv_heads, problem.gqa_ratio))
        else:
            block = block.unsqueeze(2)
        if block.dtype == torch.bool:
            scores5.masked_fill_(block.logical_not(), NEG_INF)
        else:
            scores5.add_(block)
    if causal:
        blocked = causal_blocked(rows, cols, scores.device, problem.causal_offset)
        if blocked is not None:
            scores5.masked_fill_(blocked, NEG_INF)


def softmax_partials(scores: torch.Tensor,
                     value_block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised softmax of one block (``scores [B, Hkv, R, Sc]`` fp32, overwritten) and its product with
    ``value_block [B, Hkv, Sc, Ev]``. Returns row_max (-inf on fully blocked rows), row_sum and the fp32 ``exp(scores
    - max) @ V``."""
    row_max = scores.amax(dim=-1, keepdim=True)
    safe_max = row_max.masked_fill(row_max == NEG_INF, 0.0)
    probs = scores.sub_(safe_max).exp_()
    row_sum = probs.sum(dim=-1, keepdim=True)
    out = torch.matmul(probs.to(value_block.dtype), value_block)
    return row_max, row_sum, out.to(probs.dtype)


def normalise(out: torch.Tensor, row_sum: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out / row_sum`` with rows whose every key was blocked set to zero (SDPA semantics)."""
    return out.div_(row_sum.masked_fill(row_sum == 0, 1.0)).to(dtype)


class OnlineSoftmax:
    """Merges per-block softmax partials (flash-attention's online softmax): running max, sum and output per row."""

    def __init__(self) -> None:
        self.row_max: torch.Tensor | None = None
        self.row_sum: torch.Tensor | None = None
        self.out: torch.Tensor | None = None

    def update(self, row_max: torch.Tensor, row_sum: torch.Tensor, out: torch.Tensor) -> None:
        if self.row_max is None:
            self.row_max, self.row_sum, self.out = row_max, row_sum, out
            return
        new_max = torch.maximum(self.row_max, row_max)
        safe_max = new_max.masked_fill(new_max == NEG_INF, 0.0)
        old_weight = (self.row_max - safe_max).exp_()
        new_weight = (row_max - safe_max).exp_()
        self.row_sum = self.row_sum.mul_(old_weight).add_(row_sum.mul_(new_weight))
        self.out = self.out.mul_(old_weight).add_(out.mul_(new_weight))
        self.row_max = new_max

    def result(self, dtype: torch.dtype) -> torch.Tensor:
        if self.out is None:
            raise RuntimeError("OnlineSoftmax.result() called before any update()")
        return normalise(self.out, self.row_sum, dtype)


def scatter_rows(out: torch.Tensor, block: torch.Tensor, rows: slice, problem: Problem) -> None:
    """Write ``block [B, Hkv, G*Lc, Ev]`` into ``out [B, Hq, L, Ev]`` at query positions `rows`."""
    grouped = out.view(problem.batch, problem.kv_heads, problem.gqa_ratio, problem.q_len, -1)
    grouped[:, :, :, rows] = block.view(problem.batch, problem.kv_heads, problem.gqa_ratio, -1, block.shape[-1])


def score_keys_bytes(problem: Problem) -> int:
    """Bytes of `score_keys`'s fp32 copy of half keys where the device is not known to have an fp32-result product."""
    if problem.itemsize >= 4 or _fp32_product.get((problem.device_type, problem.torch_dtype)):
        return 0
    return problem.batch * problem.kv_heads * problem.kv_len * problem.head_dim * 4


def block_workspace_bytes(problem: Problem, q_rows: int, kv_cols: int) -> int:
    """Peak extra bytes of one (query block x key block) step, tensor by tensor from `query_rows` to
    `softmax_partials`: scaled rows, fp32 scores and cast probabilities, mask and causal blocks, partial outputs and
    accumulator, row statistics."""
    item, acc = problem.itemsize, accumulation_itemsize(problem)
    rows = problem.batch * problem.q_heads * q_rows
    score_elem = acc + (2 * item if item != acc else 0)
    mask_elem = int(problem.causal) + int(problem.mask_kind == "bool")
    return (
        rows * problem.head_dim * acc
        + rows * kv_cols * (score_elem + mask_elem)
        + rows * problem.value_dim * (item + 2 * acc)
        + rows * 6 * acc
    )
