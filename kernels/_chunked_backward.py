"""FlashAttention-2's backward for `chunked`, in PyTorch ops: memory O(block) whatever the lengths.

The forward (`chunked_attention_with_backward`) runs the chunked online softmax and keeps, for
every query row, the log-sum-exp of its scores (``lse [B, Hkv, G, L]``, fp32). The backward
recomputes each (query block x key block) score tile from Q and K, turns it into probabilities
with the saved ``lse`` (``P = exp(S - lse)``: no second softmax pass), and accumulates

    dV += P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O)),   dQ += dS K * scale,
    dK += dS^T (Q * scale)

in fp32 (fp64 for fp64 inputs). Query heads are grouped by the key/value head they read, as in the
forward (`kernels._blocks`), so dK and dV come out summed over each GQA group and K/V are never
repeated. Scores are computed in fp32 (fp16 products are formed from fp32 copies: an fp16 score
can overflow 65504). Rows whose every key is blocked get ``lse = +inf``, so ``P = 0`` and their
gradients are zero, as SDPA's. The mask is a constant here: a mask that requires grad is refused
(PyTorch's SDPA gives it a gradient; the dispatcher routes such calls there).
"""

from __future__ import annotations

import torch

from attn_dispatch.kernels._blocks import (
    OnlineSoftmax,
    accumulation_dtype,
    accumulation_itemsize,
    fully_blocked_by_causality,
    mask_scores_,
    query_rows,
    scatter_rows,
    softmax_partials,
)
from attn_dispatch.kernels._layout import canonicalisation_bytes
from attn_dispatch.kernels.problem import Problem


def needs_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Grad is enabled and query, key or value requires it (autograd must see this call)."""
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


def scores_fp32(q_rows: torch.Tensor, key_block: torch.Tensor) -> torch.Tensor:
    """``q_rows [B, Hkv, R, E]`` (scaled) ``@ key_block [B, Hkv, Sc, E]^T`` -> fp32 (fp64 for fp64)
    scores ``[B, Hkv, R, Sc]``. fp16 is multiplied in fp32 (its products overflow at 65504);
    bf16 has fp32's range, so its product is formed in bf16 and widened."""
    if q_rows.dtype == torch.float16:
        return torch.matmul(q_rows.float(), key_block.float().transpose(-1, -2))
    return torch.matmul(q_rows, key_block.transpose(-1, -2)).to(accumulation_dtype(q_rows.dtype))


def _grouped_rows(tensor: torch.Tensor, rows: slice, problem: Problem) -> torch.Tensor:
    """``tensor [B, Hq, L, X]`` at positions `rows` -> ``[B, Hkv, G * Lc, X]`` (contiguous)."""
    whole = rows.start == 0 and rows.stop >= tensor.shape[2]
    block = tensor if whole else tensor[:, :, rows]  # a full-length slice is an alias, which vmap cannot batch
    if not block.is_contiguous():
        block = block.contiguous()
    return block.reshape(problem.batch, problem.kv_heads, -1, block.shape[-1])


def _keys(tensor: torch.Tensor, cols: slice) -> torch.Tensor:
    """``tensor [B, Hkv, S, X]`` at key positions `cols`: the tensor itself when they are all of
    them (a full-length slice is an alias, which vmap cannot batch), else a view."""
    return tensor if cols.start == 0 and cols.stop >= tensor.shape[2] else tensor[:, :, cols]


def _kv_blocks(rows: slice, problem: Problem, kv_chunk: int):
    """Key blocks a query block reads (causal: up to the last one any of its rows sees, with the
    diagonal where the problem's alignment puts it: `Problem.causal_offset`)."""
    for kv_start in range(0, problem.kv_len, kv_chunk):
        cols = slice(kv_start, min(problem.kv_len, kv_start + kv_chunk))
        if problem.causal and fully_blocked_by_causality(rows, cols, problem.causal_offset):
            return
        yield cols


def _forward_with_lse(query, key, value, mask, problem: Problem, scale: float, q_chunk: int, kv_chunk: int):
    """Canonical inputs -> (out ``[B, Hq, L, Ev]`` input dtype, lse ``[B, Hkv, G, L]`` fp32;
    +inf on rows with every key blocked)."""
    B, Hkv, G, L = problem.batch, problem.kv_heads, problem.gqa_ratio, problem.q_len
    out = query.new_empty(B, problem.q_heads, L, problem.value_dim)
    lse = torch.empty(B, Hkv, G, L, dtype=accumulation_dtype(query.dtype), device=query.device)
    for q_start in range(0, L, q_chunk):
        rows = slice(q_start, min(L, q_start + q_chunk))
        q_block = query_rows(query, rows, problem, scale)
        state = OnlineSoftmax()
        for cols in _kv_blocks(rows, problem, kv_chunk):
            scores = scores_fp32(q_block, key[:, :, cols])
            mask_scores_(scores, mask, problem.causal, rows, cols, problem)
            state.update(*softmax_partials(scores, value[:, :, cols]))
            del scores
        row_lse = state.row_sum.log().add_(state.row_max)  # -inf + log(0) on dead rows
        row_lse.masked_fill_(state.row_sum == 0, float("inf"))
        lse[:, :, :, rows] = row_lse.view(B, Hkv, G, -1)
        scatter_rows(out, state.result(query.dtype), rows, problem)
    return out, lse


def _backward(grad_out, query, key, value, mask, out, lse, problem: Problem, scale: float,
              q_chunk: int, kv_chunk: int):
    """Gradients of canonical query, key, value (input dtype, shapes as the inputs)."""
    B, Hkv, L, dtype = problem.batch, problem.kv_heads, problem.q_len, query.dtype
    acc = accumulation_dtype(dtype)
    # Buffers made from `grad_out`: under vmap (batched gradients: gradcheck's check_batched_grad,
    # jacobians) they are batched like it, so the in-place accumulation below stays possible.
    d_query = grad_out.new_empty(B, problem.q_heads, L, problem.head_dim, dtype=dtype)
    d_key = grad_out.new_zeros(key.shape, dtype=acc)
    d_value = grad_out.new_zeros(value.shape, dtype=acc)
    for q_start in range(0, L, q_chunk):
        rows = slice(q_start, min(L, q_start + q_chunk))
        q_block = query_rows(query, rows, problem, scale)  # [B, Hkv, R, E], scaled
        do_block = _grouped_rows(grad_out, rows, problem)  # [B, Hkv, R, Ev]
        delta = (do_block.to(acc) * _grouped_rows(out, rows, problem).to(acc)).sum(dim=-1, keepdim=True)
        row_lse = lse[:, :, :, rows].reshape(B, Hkv, -1, 1)
        dq_block = grad_out.new_zeros(q_block.shape, dtype=acc)
        for cols in _kv_blocks(rows, problem, kv_chunk):
            key_block, value_block = _keys(key, cols), _keys(value, cols)
            probs = scores_fp32(q_block, key_block)
            mask_scores_(probs, mask, problem.causal, rows, cols, problem)
            probs = probs.sub_(row_lse).exp_()  # P = exp(S - lse), in place
            _keys(d_value, cols).add_(torch.matmul(probs.to(dtype).transpose(-1, -2), do_block))
            d_probs = torch.sub(torch.matmul(do_block, value_block.transpose(-1, -2)), delta)  # fp32: dP - delta
            d_scores = d_probs.mul_(probs).to(dtype)  # dS = P * (dP - delta), into dP: batched under vmap
            del probs, d_probs
            dq_block += torch.matmul(d_scores, key_block)
            _keys(d_key, cols).add_(torch.matmul(d_scores.transpose(-1, -2), q_block))
            del d_scores
        scatter_rows(d_query, dq_block.mul_(scale).to(dtype), rows, problem)
    return d_query, d_key.to(dtype), d_value.to(dtype)


class _ChunkedAttention(torch.autograd.Function):
    """Chunked attention whose backward is FlashAttention-2's (see the module docstring)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, problem, scale, q_chunk, kv_chunk):
        out, lse = _forward_with_lse(query, key, value, mask, problem, scale, q_chunk, kv_chunk)
        ctx.save_for_backward(query, key, value, mask, out, lse)
        ctx.config = (problem, scale, q_chunk, kv_chunk)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, mask, out, lse = ctx.saved_tensors
        d_query, d_key, d_value = _backward(grad_out, query, key, value, mask, out, lse, *ctx.config)
        return d_query, d_key, d_value, None, None, None, None, None


def chunked_attention_with_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    problem: Problem,
    scale: float,
    q_chunk: int,
    kv_chunk: int,
) -> torch.Tensor:
    """`chunked` on canonical inputs (``[B, Hq, L, E]``, ``[B, Hkv, S, E]``, ``[B, Hkv, S, Ev]``,
    mask ``[B|1, Hq|1, L|1, S|1]`` or None), differentiable in query, key and value.

    Returns ``[B, Hq, L, Ev]`` in the input dtype. Raises RuntimeError for a mask that requires
    grad (it would silently get none)."""
    if mask is not None and mask.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            "attn_mask requires grad, and chunked's backward gives the mask no gradient: call "
            "PyTorch's scaled_dot_product_attention for a learned mask (the dispatcher does so)"
        )
    return _ChunkedAttention.apply(query, key, value, mask, problem, scale, q_chunk, kv_chunk)


def _tile_bytes(problem: Problem, q_rows: int, kv_cols: int) -> tuple[int, int]:
    """(forward, backward) peak bytes of the temporaries of one (query block x key block) step,
    counted tensor by tensor (the bound's terms name the tensors of `_forward_with_lse` and
    `_backward`); `q_rows` query positions, `kv_cols` keys."""
    item, acc = problem.itemsize, accumulation_itemsize(problem)
    half = item < acc
    rows = problem.batch * problem.q_heads * q_rows  # score rows across heads
    cols = problem.batch * problem.kv_heads * kv_cols  # key rows across key/value heads
    tile = rows * kv_cols
    E, Ev = problem.head_dim, problem.value_dim
    widen = half and problem.dtype == "float16"  # fp32 copies of the fp16 query and key blocks
    mask_elem = int(problem.causal) + int(problem.mask_kind == "bool")
    # scores: the product in the input dtype (bf16) and fp32, or fp32 from fp32 copies (fp16)
    score_elem = acc + (item if half else 0) + mask_elem
    per_row = E * item + (E * acc if widen else 0) + 6 * acc  # scaled query rows, row statistics
    per_col = (E * acc if widen else 0) + (E + Ev) * item  # widened key block, matmul input copies
    casts = item if half else 0  # a cast to the input dtype copies only for half inputs
    forward = tile * (score_elem + casts) + rows * (per_row + Ev * (item + 2 * acc)) + cols * per_col
    # backward: P (fp32) and its cast, dP in the input dtype and fp32, dS's cast; dO, O and their
    # fp32 copies, delta, lse rows, dQ's fp32 accumulator, product and cast; dK and dV products
    backward = (
        tile * (score_elem + acc + 3 * casts)
        + rows * (per_row + Ev * 2 * (item + acc) + 2 * acc + E * (2 * acc + 2 * item))
        + cols * (per_col + (E + Ev) * item)
    )
    return forward, backward


def training_workspace_bytes(problem: Problem, q_chunk: int, kv_chunk: int) -> int:
    """Upper bound of the extra peak memory of forward plus backward of one call, never allocating:
    the larger of the forward's (output, lse, input copies, one tile) and the backward's (saved
    output and lse, input copies and their gradients, dQ/dK/dV in the input dtype, dK/dV's fp32
    accumulators for half inputs, one tile). The incoming output gradient is the caller's."""
    q_rows, kv_cols = min(q_chunk, problem.q_len), min(kv_chunk, problem.kv_len)
    forward_tile, backward_tile = _tile_bytes(problem, q_rows, kv_cols)
    acc = accumulation_itemsize(problem)
    lse = problem.batch * problem.q_heads * problem.q_len * acc
    copies = canonicalisation_bytes(problem)
    saved = problem.out_bytes + lse + copies
    grads = problem.q_bytes + problem.kv_bytes
    accumulators = problem.kv_bytes * acc // problem.itemsize if problem.itemsize < acc else 0
    forward = saved + forward_tile
    backward = saved + copies + grads + accumulators + backward_tile
    return max(forward, backward)
